//! The write-ahead segment, `meshlog.wal`: where a commit is made durable
//! (one append, one `fdatasync`) before redb holds it durably.
//!
//! A record is framed as `len u32 · crc32 u32 · body[len]`, little-endian,
//! the crc32 over the length's four bytes and the body; the body is a
//! commit (`record`), led by its number. Numbers rise by one from record to
//! record, across the store's life: redb records the number of the last
//! record it holds (`folded` in `meta`), so a record already in redb is
//! recognised and skipped, whether or not the segment was cut since.
//!
//! The file is written in place, never grown by a commit: it keeps a
//! zero-filled region ahead of its tail ([`ZERO_STEP`] at a time), so a
//! commit's `fdatasync` writes no file metadata (its size does not
//! change), and a checkpoint ([`Segment::reset`]) does not truncate it but
//! starts again at offset 0, over the records redb now holds. Each append
//! writes its frame followed by [`FRAME_HEAD_LEN`] zero bytes, the
//! *end mark*: the next append overwrites it, so after the last
//! acknowledged record there is always a zero head, whatever older
//! records still sit further in the file. A zero head, or the file's end,
//! is the end of the log. A file that grew past [`SHRINK_ABOVE`] is cut
//! back to nothing at a checkpoint. A segment written by an earlier build
//! (records up to the file's end, no end mark) reads the same way.
//!
//! A record is all or nothing. Reading a segment back ([`scan`]) keeps the
//! whole records up to the end of the log, or to the first that is short,
//! fails its checksum or its number, or has a length that runs past the
//! file: that is a torn tail, an append the crash interrupted, which was
//! never acknowledged, and it is cut, with everything after it (an older
//! record there is one a checkpoint left behind: its number is not the
//! next). Unless a whole record with a later number than any redb holds or
//! the scan read follows it somewhere: then the bad record (or zero head)
//! is damage in the middle of acknowledged commits, and the scan refuses
//! the segment rather than drop them.
//!
//! The file is reached through redb's [`StorageBackend`] trait, so a test
//! can put the segment on a simulated disk as it does the data file; a
//! plain file is [`SegmentFile`].

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use redb::StorageBackend;

use super::error::{io, DiskError};
use super::record::{encode_batch, record_number};
use crate::Batch;

/// The name of the segment file inside a data directory.
pub const SEGMENT_FILE: &str = "meshlog.wal";
/// Bytes of a frame before its body (and of the end mark after it).
const FRAME_HEAD_LEN: usize = 8;
/// The shortest frame a record can take: its head, number and clock.
const MIN_FRAME_LEN: usize = FRAME_HEAD_LEN + 16;
/// How far ahead of its tail the segment is filled with zeros, at a time:
/// one step costs one larger sync per ~16k small commits.
const ZERO_STEP: u64 = 4 << 20;
/// A checkpoint cuts a segment larger than this back to nothing, so a
/// burst of large commits does not keep its disk space forever.
const SHRINK_ABOVE: u64 = 64 << 20;

/// The segment of one open store.
#[derive(Debug)]
pub(super) struct Segment {
    io: Box<dyn StorageBackend>,
    path: PathBuf,
    /// Bytes written (and synced) so far.
    len: u64,
    /// Records appended since the last [`Segment::reset`].
    records: u64,
    /// The file's length: bytes past `len` up to here are zeros or records
    /// redb holds (set by [`Segment::read_all`], grown by `append`).
    alloc: u64,
    /// Scratch for a frame.
    frame: Vec<u8>,
}

/// What [`scan`] found in a segment.
#[derive(Debug, Default)]
pub(super) struct Scan {
    /// Each whole record's number and the range of its body, in order.
    pub(super) records: Vec<(u64, Range<usize>)>,
    /// The torn tail cut, if any: where it starts, how many bytes, why.
    pub(super) torn: Option<(u64, u64, String)>,
}

impl Segment {
    /// The segment over `io`, standing for the file `path`.
    pub(super) fn new(path: PathBuf, io: Box<dyn StorageBackend>) -> Segment {
        Segment {
            io,
            path,
            len: 0,
            records: 0,
            alloc: 0,
            frame: Vec::new(),
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes appended since the last reset.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Records appended since the last reset.
    pub(super) fn records(&self) -> u64 {
        self.records
    }

    /// The whole file, as it is on disk.
    pub(super) fn read_all(&mut self) -> Result<Vec<u8>, DiskError> {
        let len = self.io.len().map_err(io(&self.path, "stat segment"))?;
        self.alloc = len;
        let len = usize::try_from(len).map_err(|_| DiskError::Corrupt {
            path: self.path.clone(),
            detail: format!("a segment of {len} bytes cannot be read into memory"),
        })?;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(len)
            .map_err(|_| DiskError::Corrupt {
                path: self.path.clone(),
                detail: format!("a segment of {len} bytes cannot be read into memory"),
            })?;
        bytes.resize(len, 0);
        self.io
            .read(0, &mut bytes)
            .map_err(io(&self.path, "read segment"))?;
        Ok(bytes)
    }

    /// Appends record `number` of `batch` and makes it durable
    /// (`fdatasync`): when this returns, the commit survives a crash.
    pub(super) fn append(&mut self, number: u64, batch: &Batch) -> Result<(), DiskError> {
        self.frame.clear();
        self.frame.extend_from_slice(&[0; FRAME_HEAD_LEN]);
        let refused = |detail: String| DiskError::Segment {
            path: self.path.clone(),
            offset: self.len,
            detail,
        };
        encode_batch(number, batch, &mut self.frame).map_err(refused)?;
        let body_len = u32::try_from(self.frame.len() - FRAME_HEAD_LEN)
            .map_err(|_| refused(format!("a commit of {} bytes", self.frame.len())))?;
        let head = frame_head(body_len, &self.frame[FRAME_HEAD_LEN..]);
        self.frame[..FRAME_HEAD_LEN].copy_from_slice(&head);
        let record_len = self.frame.len() as u64;
        self.frame.extend_from_slice(&[0; FRAME_HEAD_LEN]);
        self.zero_ahead(self.len + self.frame.len() as u64)?;
        self.io
            .write(self.len, &self.frame)
            .map_err(io(&self.path, "append to segment"))?;
        self.io
            .sync_data()
            .map_err(io(&self.path, "fdatasync segment"))?;
        self.len += record_len;
        self.records += 1;
        Ok(())
    }

    /// Makes the file at least `end` bytes long, growing it by zeros a
    /// [`ZERO_STEP`] past `end`. Not synced here: the append's sync that
    /// follows makes the zeros and the new length durable with its record,
    /// and until then a crash leaves zeros or nothing there (the record
    /// was not acknowledged).
    fn zero_ahead(&mut self, end: u64) -> Result<(), DiskError> {
        if end <= self.alloc {
            return Ok(());
        }
        /// Zeros written at a time.
        static ZEROS: [u8; 1 << 16] = [0; 1 << 16];
        let grown = end + ZERO_STEP;
        let mut at = self.alloc;
        while at < grown {
            let chunk = (grown - at).min(ZEROS.len() as u64);
            self.io
                .write(at, &ZEROS[..chunk as usize])
                .map_err(io(&self.path, "fill segment with zeros"))?;
            at += chunk;
        }
        self.alloc = grown;
        Ok(())
    }

    /// On a clean close, once redb holds every record durably (the segment
    /// reset and nothing appended since): cuts the file to nothing, synced,
    /// so the next open reads no byte of it. Otherwise it would read the
    /// whole file (up to [`SHRINK_ABOVE`] of folded records and zeros) to
    /// look past the end mark for a later record that damage hid: 61 ms
    /// for a clean reopen of a 1M-event log. The first append after the
    /// open writes the zeros ahead again ([`ZERO_STEP`]), once.
    pub(super) fn cut_on_close(&mut self) -> Result<(), DiskError> {
        debug_assert_eq!(self.len, 0, "cut only an empty segment");
        if self.alloc == 0 {
            return Ok(());
        }
        self.io
            .set_len(0)
            .and_then(|()| self.io.sync_data())
            .map_err(io(&self.path, "empty segment on close"))?;
        self.alloc = 0;
        Ok(())
    }

    /// Empties the segment, once redb holds every record in it durably:
    /// the next append starts at offset 0, over records redb holds. An end
    /// mark is written there (not synced: the records under it are folded,
    /// so a crash that loses it loses nothing), so an open finds the log
    /// empty at once. A file grown past [`SHRINK_ABOVE`] is cut back to
    /// nothing instead.
    pub(super) fn reset(&mut self) -> Result<(), DiskError> {
        if self.alloc > SHRINK_ABOVE {
            self.io
                .set_len(0)
                .and_then(|()| self.io.sync_data())
                .map_err(io(&self.path, "empty segment"))?;
            self.alloc = 0;
        } else if self.alloc >= FRAME_HEAD_LEN as u64 {
            self.io
                .write(0, &[0; FRAME_HEAD_LEN])
                .map_err(io(&self.path, "mark segment empty"))?;
        }
        self.len = 0;
        self.records = 0;
        Ok(())
    }
}

/// A frame's head for a body: its length and the crc32 over the length's
/// bytes and the body.
fn frame_head(body_len: u32, body: &[u8]) -> [u8; FRAME_HEAD_LEN] {
    let len = body_len.to_le_bytes();
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&len);
    hasher.update(body);
    let mut head = [0; FRAME_HEAD_LEN];
    head[..4].copy_from_slice(&len);
    head[4..].copy_from_slice(&hasher.finalize().to_le_bytes());
    head
}

/// The whole record at `offset`: its number and the range of its body, or
/// why there is none.
fn frame_at(bytes: &[u8], offset: usize) -> Result<(u64, Range<usize>), String> {
    let left = bytes.len() - offset;
    if left < FRAME_HEAD_LEN {
        return Err(format!("{left} bytes, short of a record's head"));
    }
    let head = &bytes[offset..offset + FRAME_HEAD_LEN];
    let body_len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
    let stored = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
    let start = offset + FRAME_HEAD_LEN;
    if body_len as usize > bytes.len() - start {
        return Err(format!(
            "a record of {body_len} bytes, but {} follow",
            bytes.len() - start
        ));
    }
    let body = start..start + body_len as usize;
    if frame_head(body_len, &bytes[body.clone()])[4..] != stored.to_le_bytes() {
        return Err("crc32 mismatch".to_string());
    }
    let number = record_number(&bytes[body.clone()])
        .ok_or_else(|| format!("a record of {body_len} bytes has no number"))?;
    Ok((number, body))
}

/// Reads the records of a segment's `bytes` (see the module docs): the
/// whole ones in order, then a torn tail, cut. `folded` is the number of
/// the last record redb holds: a later record after a bad one is damage
/// before the tail, refused with [`DiskError::Segment`] naming `path`.
pub(super) fn scan(bytes: &[u8], folded: u64, path: &Path) -> Result<Scan, DiskError> {
    let mut found = Scan::default();
    let mut offset = 0usize;
    let mut expected: Option<u64> = None;
    while offset < bytes.len() {
        // A zero head (or zeros up to the file's end) ends the log.
        let at_end = bytes[offset..].iter().take(FRAME_HEAD_LEN).all(|&b| b == 0);
        let why = match frame_at(bytes, offset) {
            _ if at_end => "a zero head".to_string(),
            Ok((number, body)) if expected.is_none_or(|expected| number == expected) => {
                expected = number.checked_add(1);
                offset = body.end;
                found.records.push((number, body));
                continue;
            }
            Ok((number, _)) => format!(
                "record number {number} where {} was due",
                expected.unwrap_or(u64::MAX)
            ),
            Err(why) => why,
        };
        // Only a record no redb commit holds yet counts as lost.
        let later_than = expected.unwrap_or(0).max(folded.saturating_add(1));
        if let Some((at, number)) = later_record(bytes, offset + 1, later_than) {
            return Err(DiskError::Segment {
                path: path.to_path_buf(),
                offset: offset as u64,
                detail: format!(
                    "the record here is bad ({why}), but a whole record, number {number}, \
                     follows at offset {at}: the damage is not a torn tail"
                ),
            });
        }
        if !at_end {
            found.torn = Some((offset as u64, (bytes.len() - offset) as u64, why));
        }
        break;
    }
    Ok(found)
}

/// The first whole record at or after `from` whose number is at least
/// `min_number`, with its offset. Record `min_number` would start at
/// `from - 1` (where the bad record or zero head is), and each record
/// takes at least [`MIN_FRAME_LEN`] bytes, so at `offset` a number above
/// `min_number + (offset - from + 1) / MIN_FRAME_LEN`, or a body shorter
/// than a number and a clock, is not one. Both are checked before the
/// crc32 is computed, so a scan of bytes that hold no such record (older
/// records a checkpoint left) costs a few comparisons a byte; a block of
/// zeros (ahead of the tail) is passed over whole.
fn later_record(bytes: &[u8], from: usize, min_number: u64) -> Option<(usize, u64)> {
    /// Bytes passed over at once where they are all zeros.
    const BLOCK: usize = 4096;
    static ZEROS: [u8; BLOCK + 16] = [0; BLOCK + 16];
    let last = bytes.len().checked_sub(FRAME_HEAD_LEN + 8)?;
    let mut offset = from;
    while offset <= last {
        let most = min_number.saturating_add(((offset + 1 - from) / MIN_FRAME_LEN) as u64);
        // A record here has a number at least 1 in its 8 bytes after the
        // head: none starts in a block whose 16 bytes more are zeros.
        if bytes.get(offset..offset + BLOCK + 16) == Some(&ZEROS[..]) {
            offset += BLOCK;
            continue;
        }
        let number = record_number(&bytes[offset + FRAME_HEAD_LEN..])?;
        let body_len = u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"));
        if (min_number..=most).contains(&number)
            && body_len as usize >= MIN_FRAME_LEN - FRAME_HEAD_LEN
        {
            if let Ok((number, _)) = frame_at(bytes, offset) {
                return Some((offset, number));
            }
        }
        offset += 1;
    }
    None
}

/// A segment in a plain file: reads and writes at offsets, and
/// `File::sync_data` (`fdatasync`) as the sync.
#[derive(Debug)]
pub(super) struct SegmentFile {
    file: File,
}

impl SegmentFile {
    /// Opens (or creates) the file at `path`; answers whether it existed.
    pub(super) fn open(path: &Path) -> Result<(SegmentFile, bool), DiskError> {
        let existed = path.try_exists().map_err(io(path, "stat segment"))?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io(path, "open segment"))?;
        Ok((SegmentFile { file }, existed))
    }
}

impl StorageBackend for SegmentFile {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, out, offset)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, data, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of a body as short as a record's (a number and a clock)
    /// and `extra` bytes more.
    fn frame(number: u64, extra: usize) -> Vec<u8> {
        let mut body = number.to_le_bytes().to_vec();
        body.extend(std::iter::repeat_n(7u8, 8 + extra));
        let mut out = frame_head(body.len() as u32, &body).to_vec();
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn whole_records_are_read_and_a_torn_tail_is_cut() {
        let mut bytes = [frame(5, 3), frame(6, 0), frame(7, 9)].concat();
        let whole = bytes.len();
        let found = scan(&bytes, 0, Path::new("w")).unwrap();
        assert_eq!(found.records.len(), 3);
        assert!(found.torn.is_none());
        bytes.extend_from_slice(&frame(8, 4)[..10]);
        let found = scan(&bytes, 0, Path::new("w")).unwrap();
        assert_eq!(found.records.len(), 3);
        assert_eq!(found.torn.as_ref().map(|torn| torn.0), Some(whole as u64));
    }

    #[test]
    fn a_bad_record_before_good_ones_is_refused() {
        let mut bytes = [frame(5, 3), frame(6, 0), frame(7, 9)].concat();
        let second = frame(5, 3).len();
        bytes[second + 9] ^= 0x10;
        let error = scan(&bytes, 0, Path::new("w")).unwrap_err();
        assert!(
            matches!(error, DiskError::Segment { offset, .. } if offset == second as u64),
            "{error}"
        );
        // Unless what follows is already in redb: then nothing is lost.
        let found = scan(&bytes, 7, Path::new("w")).unwrap();
        assert_eq!(found.records.len(), 1);
    }

    /// Records written in place after a checkpoint (`folded` 7): numbers 8
    /// and 9, shorter than the older 5..7 under them, then the end mark.
    fn over_old(torn: bool) -> (Vec<u8>, usize) {
        let mut bytes = [frame(5, 40), frame(6, 40), frame(7, 40)].concat();
        bytes.extend_from_slice(&[0; 64]);
        let mut new = [frame(8, 1), frame(9, 2)].concat();
        let end = new.len();
        if torn {
            new.extend_from_slice(&frame(10, 3)[..12]);
        } else {
            new.extend_from_slice(&[0; FRAME_HEAD_LEN]);
        }
        bytes[..new.len()].copy_from_slice(&new);
        (bytes, end)
    }

    #[test]
    fn zeros_and_older_records_after_the_end_mark_are_the_end_of_the_log() {
        let (bytes, _) = over_old(false);
        let found = scan(&bytes, 7, Path::new("w")).unwrap();
        let numbers: Vec<u64> = found.records.iter().map(|record| record.0).collect();
        assert_eq!(numbers, [8, 9]);
        assert!(found.torn.is_none(), "{:?}", found.torn);
        // Zeros only, or records and then zeros: no record, nothing torn.
        let found = scan(&[0; 100], 7, Path::new("w")).unwrap();
        assert!(found.records.is_empty() && found.torn.is_none());
        let mut bytes = [frame(8, 3), frame(9, 0)].concat();
        bytes.extend_from_slice(&[0; 5]);
        let found = scan(&bytes, 7, Path::new("w")).unwrap();
        assert_eq!((found.records.len(), found.torn), (2, None));
    }

    #[test]
    fn a_torn_record_over_older_ones_or_zeros_is_cut_with_all_after_it() {
        let (bytes, end) = over_old(true);
        let found = scan(&bytes, 7, Path::new("w")).unwrap();
        assert_eq!(found.records.len(), 2);
        assert_eq!(found.torn.as_ref().map(|torn| torn.0), Some(end as u64));
        let mut bytes = [frame(8, 3), frame(9, 0)].concat();
        let end = bytes.len();
        bytes.extend_from_slice(&frame(10, 9)[..13]);
        bytes.extend_from_slice(&[0; 64]);
        let found = scan(&bytes, 7, Path::new("w")).unwrap();
        assert_eq!(found.records.len(), 2);
        assert_eq!(found.torn.as_ref().map(|torn| torn.0), Some(end as u64));
    }

    #[test]
    fn a_zero_head_before_a_later_record_is_refused() {
        let mut bytes = [frame(8, 3), frame(9, 0), frame(10, 2)].concat();
        let second = frame(8, 3).len();
        bytes[second..second + FRAME_HEAD_LEN].fill(0);
        let error = scan(&bytes, 7, Path::new("w")).unwrap_err();
        assert!(
            matches!(error, DiskError::Segment { offset, .. } if offset == second as u64),
            "{error}"
        );
    }
}
