//! The data directory's `peer-memory` file: what the last sessions with
//! the dialed peers learned of them (`meshlog_sync_core::proto::PeerMemory`:
//! whether the peer reads a hello against a checkpoint, the checkpoints it
//! holds), so that the first session of each link after a restart sends a
//! hello against a checkpoint rather than a whole one (22 bytes a retired
//! writer; `docs/PROTOCOL.md`, "The dialer's hello").
//!
//! Read once at start and applied to each peer as it is added (at start,
//! or later over HTTP); written, with the node's one way to write such a
//! file, when a dialed session ends with memories different from what was
//! written, and at shutdown. A write holds the peers dialed then: an entry
//! for a peer no longer dialed is dropped. The file is untrusted input:
//! bounded, decoded totally, and a bad one is a warning, never a failed
//! start; what it says is advisory (a memory that is wrong costs a peer
//! one more hello, which says what it reads).
//!
//! Layout (version 1): a version byte; the entry count (`u16`, big
//! endian); per entry, in ascending URL order, the URL's length (`u16`)
//! and its bytes (the normalized peer URL), the memory's length (`u16`)
//! and its bytes (`PeerMemory::to_bytes`); then a CRC-32 of everything
//! before it (`u32`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use meshlog_sync::proto::{PeerMemory, PeerMemoryError, PEER_MEMORY_BYTES_MAX};

use crate::lock;

/// The file's name in the data directory.
pub(crate) const PEER_MEMORY_FILE: &str = "peer-memory";

/// The version byte this build writes and reads.
const FILE_VERSION: u8 = 1;

/// The most entries a file holds: a write keeps the first this many
/// peers, in URL order.
const ENTRIES_MAX: usize = 1024;

/// The longest URL an entry holds (a normalized URL is far shorter).
const URL_BYTES_MAX: usize = 512;

/// The version byte and the count.
const HEAD_BYTES: usize = 3;

/// The CRC-32 at the end.
const CHECKSUM_BYTES: usize = 4;

/// The largest file read: every entry at its longest (about 790 KiB).
const FILE_BYTES_MAX: usize =
    HEAD_BYTES + ENTRIES_MAX * (2 + URL_BYTES_MAX + 2 + PEER_MEMORY_BYTES_MAX) + CHECKSUM_BYTES;

/// Dialed peers' memories, by normalized URL.
pub(crate) type Memories = BTreeMap<String, PeerMemory>;

/// Why a `peer-memory` file was not read; the node starts with no
/// memory and says so (`tracing::warn!`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PeerMemoryFileError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Larger than any file this build writes.
    #[error("{path} is over {limit} bytes")]
    TooLarge { path: PathBuf, limit: usize },
    /// The bytes are not a file this build writes.
    #[error("{path} at byte {offset}: {problem}")]
    Malformed {
        path: PathBuf,
        offset: usize,
        problem: String,
    },
    /// An entry's memory is not one.
    #[error("{path}, the entry for {url}: {source}")]
    Memory {
        path: PathBuf,
        url: String,
        #[source]
        source: PeerMemoryError,
    },
}

/// The node's `peer-memory` file: what it held at start, and what was
/// last written.
#[derive(Debug)]
pub(crate) struct PeerMemoryFile {
    dir: PathBuf,
    /// The file's entries at start: each peer's link starts from its own.
    read: Memories,
    /// What the file holds now (read, or last written): a write happens
    /// only when the links' memories differ from it.
    written: Mutex<Memories>,
}

impl PeerMemoryFile {
    /// Reads `dir`'s file; a missing one is no memory, a bad one too,
    /// with a warning that says why.
    pub(crate) fn load(dir: &Path) -> PeerMemoryFile {
        let read = match read(dir) {
            Ok(memories) => memories,
            Err(error) => {
                tracing::warn!(%error, "the peer memory file is not read: every link's first hello goes whole");
                Memories::new()
            }
        };
        if !read.is_empty() {
            tracing::debug!(peers = read.len(), "peer memory read");
        }
        PeerMemoryFile {
            dir: dir.to_owned(),
            written: Mutex::new(read.clone()),
            read,
        }
    }

    /// What the file said at start of the peer at `url` (normalized); a
    /// peer it does not name is one never met (`PeerMemory::unmet`).
    pub(crate) fn remembered(&self, url: &str) -> PeerMemory {
        self.read
            .get(url)
            .cloned()
            .unwrap_or_else(PeerMemory::unmet)
    }

    /// Whether `memories` (the dialed peers', now) differ from what the
    /// file holds: a write is due.
    pub(crate) fn differs(&self, memories: &Memories) -> bool {
        *lock(&self.written) != kept(memories)
    }

    /// Writes `memories` (the dialed peers', now) if they differ from what
    /// the file holds. Blocking (the file is synced): off the runtime. A
    /// failed write is a warning; the memories stay in the links.
    pub(crate) fn write(&self, memories: &Memories) {
        let memories = kept(memories);
        let mut written = lock(&self.written);
        if *written == memories {
            return;
        }
        let bytes = encode(&memories);
        match crate::durable_file::write_aside_and_rename(
            &self.dir,
            PEER_MEMORY_FILE,
            &bytes,
            0o644,
        ) {
            Ok(()) => {
                tracing::debug!(peers = memories.len(), "peer memory written");
                *written = memories;
            }
            Err(error) => {
                tracing::warn!(%error, dir = %self.dir.display(), "writing the peer memory file failed: the next start's first hellos go whole");
            }
        }
    }
}

/// The entries a file keeps of `memories`: those that learned something,
/// the first [`ENTRIES_MAX`] by URL, with a URL no longer than
/// [`URL_BYTES_MAX`].
fn kept(memories: &Memories) -> Memories {
    memories
        .iter()
        .filter(|(url, memory)| url.len() <= URL_BYTES_MAX && **memory != PeerMemory::default())
        .take(ENTRIES_MAX)
        .map(|(url, memory)| (url.clone(), memory.clone()))
        .collect()
}

/// `dir`'s file decoded; no entries if there is none.
fn read(dir: &Path) -> Result<Memories, PeerMemoryFileError> {
    let path = dir.join(PEER_MEMORY_FILE);
    let read_error = |source| PeerMemoryFileError::Read {
        path: path.clone(),
        source,
    };
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Memories::new()),
        Err(error) => return Err(read_error(error)),
    };
    let mut bytes = Vec::new();
    file.take(FILE_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() > FILE_BYTES_MAX {
        return Err(PeerMemoryFileError::TooLarge {
            path,
            limit: FILE_BYTES_MAX,
        });
    }
    decode(&bytes).map_err(|error| error.at(path))
}

/// The file's bytes for `memories` (at most [`ENTRIES_MAX`], URLs at most
/// [`URL_BYTES_MAX`] bytes: [`kept`]).
fn encode(memories: &Memories) -> Vec<u8> {
    let mut out = vec![FILE_VERSION];
    out.extend_from_slice(&(memories.len() as u16).to_be_bytes());
    for (url, memory) in memories {
        let memory = memory.to_bytes();
        out.extend_from_slice(&(url.len() as u16).to_be_bytes());
        out.extend_from_slice(url.as_bytes());
        out.extend_from_slice(&(memory.len() as u16).to_be_bytes());
        out.extend_from_slice(&memory);
    }
    let checksum = crc32fast::hash(&out);
    out.extend_from_slice(&checksum.to_be_bytes());
    out
}

/// Why bytes are not a file, before the path is known.
#[derive(Debug)]
enum DecodeError {
    Malformed {
        offset: usize,
        problem: String,
    },
    Memory {
        url: String,
        source: PeerMemoryError,
    },
}

impl DecodeError {
    fn at(self, path: PathBuf) -> PeerMemoryFileError {
        match self {
            DecodeError::Malformed { offset, problem } => PeerMemoryFileError::Malformed {
                path,
                offset,
                problem,
            },
            DecodeError::Memory { url, source } => {
                PeerMemoryFileError::Memory { path, url, source }
            }
        }
    }
}

/// Reads bytes front to back, naming the offset of what is wrong.
struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn malformed(&self, problem: impl Into<String>) -> DecodeError {
        DecodeError::Malformed {
            offset: self.offset,
            problem: problem.into(),
        }
    }

    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() - self.offset < len {
            return Err(self.malformed(format!("the file ends inside {what}")));
        }
        let taken = &self.bytes[self.offset..self.offset + len];
        self.offset += len;
        Ok(taken)
    }

    fn u16(&mut self, what: &str) -> Result<usize, DecodeError> {
        let bytes = self.take(2, what)?;
        Ok(usize::from(u16::from_be_bytes([bytes[0], bytes[1]])))
    }
}

/// The file's entries. Total: any bytes give entries or an error.
fn decode(bytes: &[u8]) -> Result<Memories, DecodeError> {
    let body_len = bytes.len().saturating_sub(CHECKSUM_BYTES);
    let mut reader = Reader { bytes, offset: 0 };
    let version = reader.take(1, "the version")?[0];
    if version != FILE_VERSION {
        return Err(reader.malformed(format!("version {version}, this build reads 1")));
    }
    let count = reader.u16("the entry count")?;
    if count > ENTRIES_MAX {
        return Err(reader.malformed(format!("{count} entries, at most {ENTRIES_MAX}")));
    }
    let (checksum_at, checksum) = bytes.split_at(body_len);
    if checksum.len() < CHECKSUM_BYTES || crc32fast::hash(checksum_at).to_be_bytes() != checksum {
        return Err(DecodeError::Malformed {
            offset: body_len,
            problem: "the checksum does not match".to_owned(),
        });
    }
    let mut body = Reader {
        bytes: checksum_at,
        offset: reader.offset,
    };
    let mut memories = Memories::new();
    for _ in 0..count {
        let (url, memory) = entry(&mut body)?;
        if memories
            .last_key_value()
            .is_some_and(|(last, _)| *last >= url)
        {
            return Err(body.malformed(format!("the entry for {url} is out of order")));
        }
        memories.insert(url, memory);
    }
    if body.offset != body_len {
        return Err(body.malformed("bytes after the last entry"));
    }
    Ok(memories)
}

/// One entry: a URL and its memory.
fn entry(reader: &mut Reader<'_>) -> Result<(String, PeerMemory), DecodeError> {
    let url_len = reader.u16("a URL's length")?;
    if url_len == 0 || url_len > URL_BYTES_MAX {
        return Err(reader.malformed(format!("a URL of {url_len} bytes")));
    }
    let url = std::str::from_utf8(reader.take(url_len, "a URL")?)
        .map_err(|_| reader.malformed("a URL not in UTF-8"))?
        .to_owned();
    let memory_len = reader.u16("a memory's length")?;
    if memory_len > PEER_MEMORY_BYTES_MAX {
        return Err(reader.malformed(format!("a memory of {memory_len} bytes")));
    }
    let memory =
        PeerMemory::from_bytes(reader.take(memory_len, "a memory")?).map_err(|source| {
            DecodeError::Memory {
                url: url.clone(),
                source,
            }
        })?;
    Ok((url, memory))
}

#[cfg(test)]
mod tests {
    // Round trips of random files; every cut and every flipped byte of a
    // valid file refused; random bytes never panic; what the file keeps
    // of the links' memories.
    use meshlog_cursor::{CheckpointName, CHECKPOINT_NAME_BYTES};
    use meshlog_testkit::seed::for_each_seed;
    use meshlog_testkit::SplitMix64;

    use super::*;

    fn random_memories(rng: &mut SplitMix64) -> Memories {
        (0..rng.below(6))
            .map(|i| {
                let names = (0..rng.below(17))
                    .map(|_| {
                        CheckpointName::from_bytes([rng.next_u64() as u8; CHECKPOINT_NAME_BYTES])
                    })
                    .collect();
                let memory = PeerMemory {
                    reads_hello_against: rng.below(2) == 1,
                    checkpoints: names,
                };
                (format!("http://10.0.0.{i}:{}", rng.below(65536)), memory)
            })
            .collect()
    }

    #[test]
    fn a_file_comes_back_as_written() {
        for_each_seed("a_file_comes_back_as_written", 0x2711, 200, |seed| {
            let memories = random_memories(&mut SplitMix64::new(seed));
            let back = decode(&encode(&memories)).expect("the bytes written");
            assert_eq!(back, memories);
        });
    }

    #[test]
    fn a_cut_or_changed_file_is_refused() {
        for_each_seed("a_cut_or_changed_file_is_refused", 0x2712, 20, |seed| {
            let mut rng = SplitMix64::new(seed);
            let bytes = encode(&random_memories(&mut rng));
            for len in 0..bytes.len() {
                assert!(decode(&bytes[..len]).is_err(), "cut at {len}");
            }
            for at in 0..bytes.len() {
                let mut changed = bytes.clone();
                changed[at] ^= 1 << rng.below(8);
                assert!(decode(&changed).is_err(), "byte {at} changed");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(decode(&longer).is_err());
        });
    }

    #[test]
    fn random_bytes_decode_totally() {
        for_each_seed("random_bytes_decode_totally", 0x2713, 2000, |seed| {
            let mut rng = SplitMix64::new(seed);
            let len = rng.below(600) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            // Half of them with a valid head and checksum, so that the
            // entries are reached.
            if rng.below(2) == 0 && len > HEAD_BYTES + CHECKSUM_BYTES {
                bytes[0] = FILE_VERSION;
                bytes[1] = 0;
                bytes[2] %= 4;
                let body = len - CHECKSUM_BYTES;
                let checksum = crc32fast::hash(&bytes[..body]);
                bytes[body..].copy_from_slice(&checksum.to_be_bytes());
            }
            if let Ok(memories) = decode(&bytes) {
                assert_eq!(encode(&memories), bytes);
            }
        });
    }

    #[test]
    fn a_file_keeps_only_what_was_learned() {
        let learned = PeerMemory {
            reads_hello_against: true,
            checkpoints: Vec::new(),
        };
        let memories: Memories = [
            ("http://a:1".to_owned(), learned.clone()),
            ("http://b:1".to_owned(), PeerMemory::default()),
            ("x".repeat(URL_BYTES_MAX + 1), learned.clone()),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            kept(&memories),
            [("http://a:1".to_owned(), learned)].into_iter().collect()
        );
    }
}
