//! The byte form of a [`PeerMemory`], for a driver that keeps it past
//! its process (the node's `peer-memory` file, `docs/STORAGE.md`): a
//! version byte, a flags byte, a count and the checkpoint names. Read
//! back from a disk, it is untrusted input: decoding is total and bounded
//! (at most [`MEMORY_NAMES_MAX`] names, nothing allocated beyond them).

use meshlog_cursor::{CheckpointName, CHECKPOINT_NAME_BYTES};

use super::hello::{PeerMemory, MEMORY_NAMES_MAX};

/// The version byte of [`PeerMemory::to_bytes`]' form.
const MEMORY_BYTES_VERSION: u8 = 1;

/// The flags byte's bit for [`PeerMemory::reads_hello_against`]; the
/// others are zero.
const READS_HELLO_AGAINST: u8 = 1;

/// The version, flags and count bytes before the names.
const MEMORY_HEAD_BYTES: usize = 3;

/// The longest byte form: the head and [`MEMORY_NAMES_MAX`] names (259
/// bytes). A driver reading several from a file bounds each entry by it.
pub const PEER_MEMORY_BYTES_MAX: usize =
    MEMORY_HEAD_BYTES + MEMORY_NAMES_MAX * CHECKPOINT_NAME_BYTES;

/// Why bytes are not a [`PeerMemory`] ([`PeerMemory::from_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerMemoryError {
    /// The bytes end before what their head announces.
    #[error("peer memory cut short: {len} bytes, {needed} needed")]
    Truncated {
        /// The bytes given.
        len: usize,
        /// The bytes the head announces (at least the head's 3).
        needed: usize,
    },
    /// Another version than this build writes (a later build's).
    #[error("peer memory of version {version}, this build reads version 1")]
    Version {
        /// The version byte.
        version: u8,
    },
    /// A flag this build does not know is set.
    #[error("peer memory flags {flags:#04x}: only bit 0 is known")]
    Flags {
        /// The flags byte.
        flags: u8,
    },
    /// More checkpoint names than a memory holds.
    #[error("peer memory names {count} checkpoints, at most {limit}")]
    TooManyNames {
        /// The count byte.
        count: usize,
        /// [`MEMORY_NAMES_MAX`].
        limit: usize,
    },
    /// Bytes after the last name.
    #[error("{len} bytes after the peer memory")]
    TrailingBytes {
        /// How many.
        len: usize,
    },
}

impl PeerMemory {
    /// The memory as bytes, for a driver to keep across restarts
    /// (version 1: the version, a flags byte, the count of names, the
    /// names; the newest [`MEMORY_NAMES_MAX`] if it holds more).
    ///
    /// ```
    /// use meshlog_cursor::CheckpointName;
    /// use meshlog_sync_core::proto::PeerMemory;
    ///
    /// let memory = PeerMemory {
    ///     reads_hello_against: true,
    ///     checkpoints: vec![CheckpointName::from_bytes([7; 16])],
    /// };
    /// assert_eq!(PeerMemory::from_bytes(&memory.to_bytes()), Ok(memory));
    /// assert!(PeerMemory::from_bytes(b"garbage").is_err());
    /// ```
    pub fn to_bytes(&self) -> Vec<u8> {
        let skip = self.checkpoints.len().saturating_sub(MEMORY_NAMES_MAX);
        let names = &self.checkpoints[skip..];
        let mut out = Vec::with_capacity(MEMORY_HEAD_BYTES + names.len() * CHECKPOINT_NAME_BYTES);
        out.push(MEMORY_BYTES_VERSION);
        out.push(if self.reads_hello_against {
            READS_HELLO_AGAINST
        } else {
            0
        });
        // At most 16: fits a byte.
        out.push(names.len() as u8);
        for name in names {
            out.extend_from_slice(name.as_bytes());
        }
        out
    }

    /// Reads [`PeerMemory::to_bytes`]' form back. Total: any bytes give
    /// a memory or a [`PeerMemoryError`], never a panic, and nothing is
    /// allocated beyond [`MEMORY_NAMES_MAX`] names.
    pub fn from_bytes(bytes: &[u8]) -> Result<PeerMemory, PeerMemoryError> {
        let &[version, flags, count, ref names @ ..] = bytes else {
            return Err(PeerMemoryError::Truncated {
                len: bytes.len(),
                needed: MEMORY_HEAD_BYTES,
            });
        };
        if version != MEMORY_BYTES_VERSION {
            return Err(PeerMemoryError::Version { version });
        }
        if flags & !READS_HELLO_AGAINST != 0 {
            return Err(PeerMemoryError::Flags { flags });
        }
        let count = usize::from(count);
        if count > MEMORY_NAMES_MAX {
            return Err(PeerMemoryError::TooManyNames {
                count,
                limit: MEMORY_NAMES_MAX,
            });
        }
        let names_len = count * CHECKPOINT_NAME_BYTES;
        if names.len() < names_len {
            return Err(PeerMemoryError::Truncated {
                len: bytes.len(),
                needed: MEMORY_HEAD_BYTES + names_len,
            });
        }
        if names.len() > names_len {
            return Err(PeerMemoryError::TrailingBytes {
                len: names.len() - names_len,
            });
        }
        let checkpoints = names
            .chunks_exact(CHECKPOINT_NAME_BYTES)
            .map(|chunk| {
                let mut name = [0u8; CHECKPOINT_NAME_BYTES];
                name.copy_from_slice(chunk);
                CheckpointName::from_bytes(name)
            })
            .collect();
        Ok(PeerMemory {
            reads_hello_against: flags & READS_HELLO_AGAINST != 0,
            checkpoints,
        })
    }
}

#[cfg(test)]
mod tests {
    // Round trips of random memories; every cut of a valid form refused
    // as truncated, every byte appended refused as trailing; random bytes
    // never panic, and what they decode to encodes back to them (one form
    // per memory).
    use meshlog_testkit::seed::for_each_seed;
    use meshlog_testkit::SplitMix64;

    use super::*;

    fn random_memory(rng: &mut SplitMix64) -> PeerMemory {
        let count = rng.below(MEMORY_NAMES_MAX as u64 + 1) as usize;
        let checkpoints = (0..count)
            .map(|_| {
                let mut name = [0u8; CHECKPOINT_NAME_BYTES];
                for byte in &mut name {
                    *byte = rng.next_u64() as u8;
                }
                CheckpointName::from_bytes(name)
            })
            .collect();
        PeerMemory {
            reads_hello_against: rng.below(2) == 1,
            checkpoints,
        }
    }

    #[test]
    fn a_memory_comes_back_from_its_bytes() {
        for_each_seed("a_memory_comes_back_from_its_bytes", 0x2701, 200, |seed| {
            let memory = random_memory(&mut SplitMix64::new(seed));
            let bytes = memory.to_bytes();
            assert!(bytes.len() <= PEER_MEMORY_BYTES_MAX);
            assert_eq!(PeerMemory::from_bytes(&bytes), Ok(memory));
        });
    }

    #[test]
    fn a_memory_of_more_than_sixteen_names_keeps_the_newest() {
        let names: Vec<CheckpointName> = (0..20u8)
            .map(|i| CheckpointName::from_bytes([i; CHECKPOINT_NAME_BYTES]))
            .collect();
        let memory = PeerMemory {
            reads_hello_against: true,
            checkpoints: names.clone(),
        };
        let back = PeerMemory::from_bytes(&memory.to_bytes()).unwrap();
        assert_eq!(back.checkpoints, names[4..]);
        assert_eq!(memory.to_bytes().len(), PEER_MEMORY_BYTES_MAX);
    }

    #[test]
    fn cut_or_lengthened_bytes_are_refused() {
        for_each_seed("cut_or_lengthened_bytes_are_refused", 0x2702, 50, |seed| {
            let mut rng = SplitMix64::new(seed);
            let bytes = random_memory(&mut rng).to_bytes();
            for len in 0..bytes.len() {
                assert!(
                    matches!(
                        PeerMemory::from_bytes(&bytes[..len]),
                        Err(PeerMemoryError::Truncated { .. })
                    ),
                    "{len} of {bytes:?}"
                );
            }
            let mut longer = bytes.clone();
            longer.push(rng.next_u64() as u8);
            assert_eq!(
                PeerMemory::from_bytes(&longer),
                Err(PeerMemoryError::TrailingBytes { len: 1 })
            );
        });
    }

    #[test]
    fn a_bad_head_is_named() {
        let good = PeerMemory::default().to_bytes();
        assert_eq!(good, [1, 0, 0]);
        assert_eq!(
            PeerMemory::from_bytes(&[2, 0, 0]),
            Err(PeerMemoryError::Version { version: 2 })
        );
        assert_eq!(
            PeerMemory::from_bytes(&[1, 3, 0]),
            Err(PeerMemoryError::Flags { flags: 3 })
        );
        assert_eq!(
            PeerMemory::from_bytes(&[1, 1, 255]),
            Err(PeerMemoryError::TooManyNames {
                count: 255,
                limit: MEMORY_NAMES_MAX
            })
        );
    }

    #[test]
    fn random_bytes_decode_totally_and_canonically() {
        for_each_seed("random_bytes_decode_totally", 0x2703, 2000, |seed| {
            let mut rng = SplitMix64::new(seed);
            let len = rng.below(PEER_MEMORY_BYTES_MAX as u64 + 8) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            // Half of them with a valid head, so the names are reached.
            if rng.below(2) == 0 && len >= MEMORY_HEAD_BYTES {
                bytes[0] = MEMORY_BYTES_VERSION;
                bytes[1] &= READS_HELLO_AGAINST;
                bytes[2] =
                    ((len - MEMORY_HEAD_BYTES) / CHECKPOINT_NAME_BYTES).min(MEMORY_NAMES_MAX) as u8;
            }
            if let Ok(memory) = PeerMemory::from_bytes(&bytes) {
                assert_eq!(memory.to_bytes(), bytes);
            }
        });
    }
}
