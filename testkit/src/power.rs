//! A disk that loses power: [`PowerDisk`], and [`PowerBackend`], the redb
//! storage backend over it that a `DiskStore` opens with
//! `DiskStore::open_with_backend`.
//!
//! `kill -9` does not test power loss: what a killed process wrote is in
//! the kernel's page cache and reaches the disk anyway. This disk models
//! that cache. Writes and length changes go to a volatile image that reads
//! see at once; `sync_data` makes everything written so far durable. A
//! power cut — armed to happen at the N-th write, length change or sync
//! ([`PowerDisk::cut_at`]), or made now ([`PowerDisk::restore`] of a disk
//! still powered) — freezes the disk: that operation and every later one
//! from the old handles fail, as the process dies with the machine. Then
//! [`PowerDisk::restore`] draws, from a seeded generator, what of the
//! unsynced writes the disk kept ([`Loss`]):
//!
//! - none of them (only what was synced);
//! - the first k in the order they were issued (the cut came mid-flush);
//! - the first k, and the next one torn: a random subset of its 512-byte
//!   sectors written, the others old;
//! - a random subset of the dirty 4 KiB pages, each with its newest
//!   content, one of them torn: writes reordered, as an elevator or a
//!   disk's own cache reorders them.
//!
//! In every case what was synced before the cut is kept whole: a disk that
//! acknowledged a flush keeps it. That is the promise `fdatasync` makes,
//! and all a store may rely on.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::SplitMix64;

/// The size of a sector: the unit a torn write keeps or loses.
pub const SECTOR_BYTES: usize = 512;
/// The size of a page of the page cache: the unit reordered writes keep or
/// lose.
pub const PAGE_BYTES: usize = 4096;

/// A simulated disk with a volatile cache in front of it, shared by the
/// backends opened on it. Cloning gives another handle to the same disk.
#[derive(Clone, Default)]
pub struct PowerDisk {
    inner: Arc<Mutex<Disk>>,
}

#[derive(Default)]
struct Disk {
    /// What survives a power cut for certain: every byte synced.
    durable: Vec<u8>,
    /// What reads see: `durable` with `pending` applied.
    current: Vec<u8>,
    /// The writes and length changes since the last sync, in order.
    pending: Vec<Op>,
    /// Bumped by each restore: a backend of an older power-on is dead.
    power_on: u64,
    /// Writes, length changes and syncs in this power-on.
    ops: u64,
    /// The op (1-based) at which the power goes off, if armed.
    cut_at: Option<u64>,
    /// The power is off: the state at the cut, until restored.
    cut: bool,
    /// Counts over the disk's life, for reports.
    stats: PowerStats,
}

#[derive(Clone)]
enum Op {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

/// What a disk did over its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PowerStats {
    /// Power cuts.
    pub cuts: u64,
    /// `sync_data` calls that returned.
    pub syncs: u64,
    /// Unsynced writes a cut found pending.
    pub pending_at_cut: u64,
    /// Cuts after which a torn write was left on the disk.
    pub torn: u64,
}

/// What a power cut kept of the writes that were not synced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loss {
    /// Nothing: only what was synced.
    Synced {
        /// Unsynced writes and length changes lost.
        lost: usize,
    },
    /// The first `kept` of `pending` unsynced operations, in order; with
    /// `torn`, the next one was a write of which only some sectors arrived.
    Prefix {
        /// Operations kept whole.
        kept: usize,
        /// Operations pending at the cut.
        pending: usize,
        /// The next write was torn: its sectors kept, of how many.
        torn: Option<(usize, usize)>,
    },
    /// A random subset of the dirty pages, each with its newest content,
    /// and the file's length either the synced or the newest one.
    Pages {
        /// Dirty pages kept.
        kept: usize,
        /// Dirty pages at the cut.
        dirty: usize,
        /// One kept page torn: its sectors kept, of how many.
        torn: Option<(usize, usize)>,
    },
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loss::Synced { lost } => write!(f, "kept only what was synced ({lost} ops lost)"),
            Loss::Prefix {
                kept,
                pending,
                torn,
            } => {
                write!(
                    f,
                    "kept the first {kept} of {pending} unsynced ops in order"
                )?;
                match torn {
                    Some((sectors, of)) => write!(f, ", the next torn ({sectors} of {of} sectors)"),
                    None => Ok(()),
                }
            }
            Loss::Pages { kept, dirty, torn } => {
                write!(f, "kept {kept} of {dirty} dirty pages, reordered")?;
                match torn {
                    Some((sectors, of)) => write!(f, ", one torn ({sectors} of {of} sectors)"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl fmt::Debug for PowerDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let disk = self.lock();
        f.debug_struct("PowerDisk")
            .field("durable_len", &disk.durable.len())
            .field("current_len", &disk.current.len())
            .field("pending", &disk.pending.len())
            .field("power_on", &disk.power_on)
            .field("cut", &disk.cut)
            .finish()
    }
}

impl PowerDisk {
    /// A new, empty disk with the power on.
    pub fn new() -> Self {
        PowerDisk::default()
    }

    /// A backend for the current power-on. It dies with the next cut.
    pub fn backend(&self) -> PowerBackend {
        PowerBackend {
            disk: self.clone(),
            power_on: self.lock().power_on,
        }
    }

    /// Arms a power cut at the `op`-th write, length change or sync from
    /// now (1 is the next one), or disarms it (`None`). The operation at
    /// which the power goes off fails and has no effect.
    pub fn cut_at(&self, op: Option<u64>) {
        let mut disk = self.lock();
        disk.cut_at = op.map(|op| disk.ops + op.max(1));
    }

    /// Whether an armed cut has happened (the power is off).
    pub fn is_cut(&self) -> bool {
        self.lock().cut
    }

    /// Counts over the disk's life.
    pub fn stats(&self) -> PowerStats {
        self.lock().stats
    }

    /// The bytes that survive a cut for certain: everything synced.
    pub fn durable_len(&self) -> usize {
        self.lock().durable.len()
    }

    /// Cuts the power if it is still on, draws from `rng` what of the
    /// unsynced writes the disk kept, and turns the power on again: the
    /// kept state becomes both durable and current, and every backend of
    /// the previous power-on is dead. Returns what was kept.
    pub fn restore(&self, rng: &mut SplitMix64) -> Loss {
        let mut disk = self.lock();
        if !disk.cut {
            disk.power_off();
        }
        let loss = match rng.below(4) {
            0 => {
                let lost = disk.pending.len();
                Loss::Synced { lost }
            }
            1 => disk.keep_prefix(rng, false),
            2 => disk.keep_prefix(rng, true),
            _ => disk.keep_pages(rng),
        };
        if matches!(
            loss,
            Loss::Prefix { torn: Some(_), .. } | Loss::Pages { torn: Some(_), .. }
        ) {
            disk.stats.torn += 1;
        }
        disk.current = disk.durable.clone();
        disk.pending.clear();
        disk.power_on += 1;
        disk.ops = 0;
        disk.cut_at = None;
        disk.cut = false;
        loss
    }

    fn lock(&self) -> MutexGuard<'_, Disk> {
        // A panic in a test thread must not hide the disk from the report.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Disk {
    fn power_off(&mut self) {
        self.cut = true;
        self.stats.cuts += 1;
        self.stats.pending_at_cut += self.pending.len() as u64;
    }

    /// Counts an operation and cuts the power if it is the armed one.
    fn step(&mut self) -> io::Result<()> {
        if self.cut {
            return Err(power_off());
        }
        self.ops += 1;
        if self.cut_at == Some(self.ops) {
            self.power_off();
            return Err(power_off());
        }
        Ok(())
    }

    fn keep_prefix(&mut self, rng: &mut SplitMix64, tear: bool) -> Loss {
        let pending = self.pending.len();
        let kept = rng.below(pending as u64 + 1) as usize;
        for op in &self.pending[..kept] {
            apply(&mut self.durable, op);
        }
        let mut torn = None;
        if tear {
            if let Some(Op::Write { offset, data }) = self.pending.get(kept) {
                let sectors = data.len().div_ceil(SECTOR_BYTES);
                let mut written = 0;
                let mut image = self.durable.clone();
                for sector in 0..sectors {
                    if rng.below(2) == 0 {
                        let start = sector * SECTOR_BYTES;
                        let end = (start + SECTOR_BYTES).min(data.len());
                        write_at(&mut image, *offset + start as u64, &data[start..end]);
                        written += 1;
                    }
                }
                self.durable = image;
                torn = Some((written, sectors));
            }
        }
        Loss::Prefix {
            kept,
            pending,
            torn,
        }
    }

    fn keep_pages(&mut self, rng: &mut SplitMix64) -> Loss {
        let mut dirty = BTreeSet::new();
        for op in &self.pending {
            if let Op::Write { offset, data } = op {
                if data.is_empty() {
                    continue;
                }
                let first = *offset as usize / PAGE_BYTES;
                let last = (*offset as usize + data.len() - 1) / PAGE_BYTES;
                dirty.extend(first..=last);
            }
        }
        let length_changed = self.current.len() != self.durable.len();
        let mut image = self.durable.clone();
        if length_changed && rng.below(2) == 0 {
            image.resize(self.current.len(), 0);
        }
        let dirty: Vec<usize> = dirty.into_iter().collect();
        let torn_page = (!dirty.is_empty() && rng.below(2) == 0)
            .then(|| dirty[rng.below(dirty.len() as u64) as usize]);
        let mut kept = 0;
        let mut torn = None;
        for &page in &dirty {
            let start = page * PAGE_BYTES;
            let end = (start + PAGE_BYTES).min(self.current.len());
            if start >= end {
                continue;
            }
            if Some(page) == torn_page {
                let sectors = (end - start).div_ceil(SECTOR_BYTES);
                let mut written = 0;
                for sector in 0..sectors {
                    if rng.below(2) == 0 {
                        let from = start + sector * SECTOR_BYTES;
                        let to = (from + SECTOR_BYTES).min(end);
                        write_at(&mut image, from as u64, &self.current[from..to]);
                        written += 1;
                    }
                }
                torn = Some((written, sectors));
            } else if rng.below(2) == 0 {
                write_at(&mut image, start as u64, &self.current[start..end]);
                kept += 1;
            }
        }
        self.durable = image;
        Loss::Pages {
            kept,
            dirty: dirty.len(),
            torn,
        }
    }
}

fn write_at(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = offset as usize;
    let end = start + data.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(data);
}

fn apply(image: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Write { offset, data } => write_at(image, *offset, data),
        Op::SetLen(len) => image.resize(*len as usize, 0),
    }
}

fn power_off() -> io::Error {
    io::Error::other("the power is off")
}

/// A redb storage backend over a [`PowerDisk`], for one power-on.
pub struct PowerBackend {
    disk: PowerDisk,
    power_on: u64,
}

impl fmt::Debug for PowerBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PowerBackend")
            .field("power_on", &self.power_on)
            .finish()
    }
}

impl PowerBackend {
    /// The disk, if this backend's power-on is the current one and the
    /// power is on.
    fn live(&self) -> io::Result<MutexGuard<'_, Disk>> {
        let disk = self.disk.lock();
        if disk.power_on != self.power_on || disk.cut {
            return Err(power_off());
        }
        Ok(disk)
    }
}

impl redb::StorageBackend for PowerBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.live()?.current.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let disk = self.live()?;
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let end = start
            .checked_add(out.len())
            .filter(|&end| end <= disk.current.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        out.copy_from_slice(&disk.current[start..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut disk = self.live()?;
        disk.step()?;
        let op = Op::SetLen(len);
        apply(&mut disk.current, &op);
        disk.pending.push(op);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut disk = self.live()?;
        disk.step()?;
        let pending = std::mem::take(&mut disk.pending);
        for op in &pending {
            apply(&mut disk.durable, op);
        }
        disk.stats.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut disk = self.live()?;
        disk.step()?;
        let op = Op::Write {
            offset,
            data: data.to_vec(),
        };
        apply(&mut disk.current, &op);
        disk.pending.push(op);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::StorageBackend;

    #[test]
    fn only_synced_writes_survive_a_cut_that_keeps_nothing_unsynced() {
        let disk = PowerDisk::new();
        let backend = disk.backend();
        backend.write(0, b"synced").unwrap();
        backend.sync_data().unwrap();
        backend.write(0, b"lost!!").unwrap();
        let mut buf = [0; 6];
        backend.read(0, &mut buf).unwrap();
        assert_eq!(&buf, b"lost!!");
        // Draw until the loss keeps nothing unsynced.
        for seed in 0.. {
            let probe = PowerDisk::new();
            let b = probe.backend();
            b.write(0, b"synced").unwrap();
            b.sync_data().unwrap();
            b.write(0, b"lost!!").unwrap();
            let mut rng = SplitMix64::new(seed);
            if let Loss::Synced { lost } = probe.restore(&mut rng) {
                assert_eq!(lost, 1);
                let after = probe.backend();
                after.read(0, &mut buf).unwrap();
                assert_eq!(&buf, b"synced");
                // The old handle is dead.
                assert!(b.read(0, &mut buf).is_err());
                break;
            }
        }
    }

    #[test]
    fn an_armed_cut_fails_that_op_and_every_later_one() {
        let disk = PowerDisk::new();
        let backend = disk.backend();
        disk.cut_at(Some(2));
        backend.write(0, b"a").unwrap();
        assert!(backend.sync_data().is_err());
        assert!(disk.is_cut());
        assert!(backend.write(1, b"b").is_err());
        assert_eq!(disk.durable_len(), 0);
    }

    #[test]
    fn synced_bytes_are_kept_whatever_the_loss() {
        for seed in 0..200 {
            let disk = PowerDisk::new();
            let backend = disk.backend();
            backend.write(0, &[7; 3 * PAGE_BYTES]).unwrap();
            backend.sync_data().unwrap();
            backend
                .write(PAGE_BYTES as u64, &[9; 2 * PAGE_BYTES])
                .unwrap();
            backend.set_len(5 * PAGE_BYTES as u64).unwrap();
            let mut rng = SplitMix64::new(seed);
            disk.restore(&mut rng);
            let after = disk.backend();
            let len = after.len().unwrap() as usize;
            assert!(len >= 3 * PAGE_BYTES, "seed {seed}: length {len}");
            let mut page = vec![0; PAGE_BYTES];
            after.read(0, &mut page).unwrap();
            assert!(page.iter().all(|&b| b == 7), "seed {seed}: first page");
            for sector in 0..2 * PAGE_BYTES / SECTOR_BYTES {
                let mut buf = [0; SECTOR_BYTES];
                after
                    .read((PAGE_BYTES + sector * SECTOR_BYTES) as u64, &mut buf)
                    .unwrap();
                // Each sector is old or new, never a mix.
                assert!(
                    buf.iter().all(|&b| b == 7) || buf.iter().all(|&b| b == 9),
                    "seed {seed}: sector {sector}"
                );
            }
        }
    }
}
