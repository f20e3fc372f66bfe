//! Formats 1 and 2 (one value per event in table `events`), read once to
//! upgrade a file to format 3 (blocks); format 3 (no chains), read once to
//! upgrade it to format 4 (each stream's chain heads).
//!
//! The upgrade is one write transaction: every event of the old table is
//! read and checked (its crc32, seqs `floor+1 ..= head` of its stream
//! without a hole), laid out in blocks, and the digest counted; a format-2
//! file's recorded digest must equal that count. The old table is deleted
//! and format 3 recorded in the same commit, so a crash during the upgrade
//! leaves the format-2 file as it was, and an older build refuses the file
//! from then on (it reads format 2 at most).
//!
//! The chain upgrade (3 to 4, and after 1 or 2 to 3) is one more write
//! transaction: every stream's held events are read through its blocks and
//! chained from its floor, as [`StreamChain::rooted`] says: anchored at
//! `h(0)` when nothing was compacted, else unanchored (the events below the
//! floor are gone, so `h(floor)` is unknown). The chains and format 4 are
//! recorded in the same commit; a crash before it leaves format 3, upgraded
//! on the next open.

use std::collections::BTreeMap;

use bytes::Bytes;
use meshlog_cursor::StreamId;
#[cfg(test)]
use redb::Database;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::block::BlockBuilder;
use super::codec::{
    encode_chain, encode_count, encode_format, META_BLOCKS, META_DIGEST, META_FORMAT,
};
use super::error::DiskError;
use super::overlay::Overlay;
use super::{chain_record, digest_record, DiskStore, BLOCKS, CHAINS, FORMAT_VERSION, META};
use crate::{Digest, Event, StreamChain};

/// The format of blocks without chains, which the chain upgrade starts from.
const FORMAT_BLOCKS: u32 = 3;
/// The format of blocks and chains, before the write-ahead segment.
const FORMAT_CHAINS: u32 = 4;

/// Formats 1 and 2: `(stream, seq)` → one event value.
pub(super) const EVENTS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("events");

/// The fixed part of a format-2 event value: lamport, time_ms, payload
/// length, and the trailing crc32.
const EVENT_OVERHEAD: usize = 8 + 8 + 4 + 4;

type BlocksTableMut<'txn> = redb::Table<'txn, (u64, u64), &'static [u8]>;

impl DiskStore {
    /// Rewrites a file of format `found` (1, 2 or 3) as format 4: a file
    /// of format 1 or 2 as format 3 in one commit, then format 3 as 4 in
    /// another.
    /// Format 4 becomes format 5 by its format record alone (format 5
    /// adds the segment, which a format-4 file never had).
    pub(super) fn upgrade(&mut self, found: u32) -> Result<(), DiskError> {
        if found == FORMAT_CHAINS {
            return self.record_format();
        }
        if found < FORMAT_BLOCKS {
            self.upgrade_to_blocks(found)?;
        }
        self.upgrade_to_chains(found)
    }

    /// Records this build's format, in a durable commit.
    fn record_format(&mut self) -> Result<(), DiskError> {
        let txn = self.begin_write()?;
        txn.open_table(META)
            .map_err(self.engine("open meta table"))?
            .insert(META_FORMAT, encode_format(FORMAT_VERSION).as_slice())
            .map_err(self.engine("write format"))?;
        txn.commit().map_err(self.engine("commit upgrade"))?;
        tracing::info!(
            path = %self.path.display(),
            from = FORMAT_CHAINS,
            to = FORMAT_VERSION,
            "upgraded the data file's format: it keeps a write-ahead segment from now on"
        );
        Ok(())
    }

    /// Chains every stream's held events from its floor and records the
    /// chains and format 4, in one commit (see the module's docs).
    fn upgrade_to_chains(&mut self, found: u32) -> Result<(), DiskError> {
        let started = std::time::Instant::now();
        let read = self.db.begin_read().map_err(self.engine("begin read"))?;
        let streams = self.stream_records(&read)?;
        drop(read);
        let view = self.disk_view(Overlay::default())?;
        let mut chains = Vec::with_capacity(streams.len());
        let mut unanchored = 0usize;
        for (&stream, &(floor, head)) in &streams {
            let mut chain = StreamChain::rooted(floor);
            if head > floor {
                let mut scan = view.scan_blocks(stream, floor + 1, head)?;
                let mut expected = floor + 1;
                while let Some(event) = scan.next_event()? {
                    if event.seq != expected {
                        return Err(self.corrupt(format!(
                            "stream {stream}: expected seq {expected}, read seq {}",
                            event.seq
                        )));
                    }
                    chain.head_hash = chain.head_hash.next(&event);
                    expected += 1;
                }
                if expected != head + 1 {
                    return Err(self.corrupt(format!(
                        "stream {stream} records head {head}, but its blocks end at seq {}",
                        expected - 1
                    )));
                }
            }
            unanchored += usize::from(!chain.anchored);
            chains.push((stream, (floor, head), chain));
        }
        drop(view);
        let txn = self.begin_write()?;
        {
            let mut table = txn
                .open_table(CHAINS)
                .map_err(self.engine("create chains table"))?;
            for (stream, bounds, chain) in &chains {
                let record = encode_chain(*stream, chain_record(*bounds, chain));
                table
                    .insert(stream.get(), record.as_slice())
                    .map_err(self.engine("write chain record"))?;
            }
            let mut meta = txn
                .open_table(META)
                .map_err(self.engine("open meta table"))?;
            meta.insert(META_FORMAT, encode_format(FORMAT_VERSION).as_slice())
                .map_err(self.engine("write format"))?;
        }
        txn.commit().map_err(self.engine("commit upgrade"))?;
        tracing::info!(
            path = %self.path.display(),
            from = found.max(FORMAT_BLOCKS),
            to = FORMAT_VERSION,
            streams = chains.len(),
            unanchored,
            ms = started.elapsed().as_millis() as u64,
            "upgraded the data file's format: chained every stream from its floor \
             (a compacted stream is unanchored)"
        );
        Ok(())
    }

    /// Rewrites a file of format `found` (1 or 2) as format 3, in one
    /// commit.
    fn upgrade_to_blocks(&mut self, found: u32) -> Result<(), DiskError> {
        let started = std::time::Instant::now();
        let read = self.db.begin_read().map_err(self.engine("begin read"))?;
        let streams = self.stream_records(&read)?;
        let recorded = if found >= 2 {
            Some(
                self.digest_record(&read)?
                    .ok_or_else(|| self.corrupt(format!("format {found} records no digest")))?,
            )
        } else {
            None
        };
        drop(read);
        let txn = self.begin_write()?;
        let regrouped = self.regroup_events(&txn, &streams)?;
        let digest = regrouped.digest;
        if let Some(recorded) = recorded {
            if recorded != digest {
                return Err(self.corrupt(format!(
                    "upgrading from format {found}: the digest recorded ({} events) differs from \
                     the events read ({} events)",
                    recorded.events, digest.events
                )));
            }
        }
        self.record_format_3(&txn, digest, regrouped.blocks_written)?;
        txn.commit().map_err(self.engine("commit upgrade"))?;
        tracing::info!(
            path = %self.path.display(),
            from = found,
            to = FORMAT_BLOCKS,
            events = digest.events,
            blocks = regrouped.blocks_written,
            ms = started.elapsed().as_millis() as u64,
            "upgraded the data file's format"
        );
        Ok(())
    }

    /// Reads every event of the old table, in key order, checking each,
    /// and writes them as blocks in `txn`; then checks that each stream's
    /// record matches the seqs read.
    fn regroup_events(
        &self,
        txn: &redb::WriteTransaction,
        streams: &BTreeMap<StreamId, (u64, u64)>,
    ) -> Result<Regroup, DiskError> {
        let events = txn
            .open_table(EVENTS)
            .map_err(self.engine("open events table"))?;
        let mut blocks = txn
            .open_table(BLOCKS)
            .map_err(self.engine("create blocks table"))?;
        let mut regroup = Regroup::default();
        for entry in events.iter().map_err(self.engine("read events"))? {
            let (key, stored) = entry.map_err(self.engine("read events"))?;
            let (stream, seq) = key.value();
            let stream = StreamId::new(stream);
            let event = decode_event(stream, seq, stored.value()).map_err(|detail| {
                DiskError::CorruptEvent {
                    path: self.path.clone(),
                    stream,
                    seq,
                    detail,
                }
            })?;
            if regroup.current.is_none_or(|(open, _)| open != stream) {
                self.start_stream(&mut regroup, &mut blocks, streams, stream, seq)?;
            }
            self.regroup_event(&mut regroup, &mut blocks, event)?;
        }
        if let Some((open, first_seq)) = regroup.current {
            self.write_regrouped(&mut regroup, &mut blocks, open, first_seq)?;
        }
        for (&stream, &(floor, head)) in streams {
            let held = regroup
                .seen
                .get(&stream)
                .map(|&(first, last)| (first, last));
            let expected = (head > floor).then(|| (floor + 1, head));
            if held != expected {
                return Err(self.corrupt(format!(
                    "stream {stream} records floor {floor} and head {head}, but the events \
                     table holds {}",
                    held.map_or("no events".to_string(), |(first, last)| format!(
                        "seqs {first}..={last}"
                    ))
                )));
            }
        }
        Ok(regroup)
    }

    /// Moves to the first event of `stream`, seq `seq`: writes the block of
    /// the stream before it, and checks that `seq` follows the stream's
    /// recorded floor.
    fn start_stream(
        &self,
        regroup: &mut Regroup,
        blocks: &mut BlocksTableMut<'_>,
        streams: &BTreeMap<StreamId, (u64, u64)>,
        stream: StreamId,
        seq: u64,
    ) -> Result<(), DiskError> {
        if let Some((open, first_seq)) = regroup.current.take() {
            self.write_regrouped(regroup, blocks, open, first_seq)?;
        }
        let Some(&(floor, _)) = streams.get(&stream) else {
            return Err(self.corrupt(format!(
                "the events table holds stream {stream}, which has no stream record"
            )));
        };
        if floor.checked_add(1) != Some(seq) {
            return Err(self.corrupt(format!(
                "stream {stream} records floor {floor}, but its first event is seq {seq}"
            )));
        }
        regroup.seen.insert(stream, (seq, seq));
        regroup.current = Some((stream, seq));
        Ok(())
    }

    /// Adds `event`, of the stream being read, to the open block (writing
    /// that block first when it is full) and to the digest, after checking
    /// that its seq follows the last one read.
    fn regroup_event(
        &self,
        regroup: &mut Regroup,
        blocks: &mut BlocksTableMut<'_>,
        event: Event,
    ) -> Result<(), DiskError> {
        let (stream, seq) = (event.stream, event.seq);
        let (_, last) = regroup
            .seen
            .get_mut(&stream)
            .expect("inserted by start_stream");
        if seq != *last && last.checked_add(1) != Some(seq) {
            return Err(self.corrupt(format!("stream {stream}: seq {seq} follows seq {last}")));
        }
        *last = seq;
        let (_, first_seq) = regroup.current.expect("set by start_stream");
        if !regroup.builder.has_room(event.payload.len()) {
            self.write_regrouped(regroup, blocks, stream, first_seq)?;
            regroup.current = Some((stream, seq));
        }
        regroup.builder.push_event(&event);
        regroup.digest.add(&event);
        Ok(())
    }

    /// Writes the open block, of `stream` from `first_seq`.
    fn write_regrouped(
        &self,
        regroup: &mut Regroup,
        blocks: &mut BlocksTableMut<'_>,
        stream: StreamId,
        first_seq: u64,
    ) -> Result<(), DiskError> {
        regroup
            .builder
            .finish(stream, first_seq, &mut regroup.value);
        blocks
            .insert((stream.get(), first_seq), regroup.value.as_slice())
            .map_err(self.engine("write block"))?;
        regroup.blocks_written += 1;
        Ok(())
    }

    /// Deletes the old table and records the digest, the block count and
    /// format 3, in `txn`.
    fn record_format_3(
        &self,
        txn: &redb::WriteTransaction,
        digest: Digest,
        blocks_written: u64,
    ) -> Result<(), DiskError> {
        txn.delete_table(EVENTS)
            .map_err(self.engine("delete events table"))?;
        let mut meta = txn
            .open_table(META)
            .map_err(self.engine("open meta table"))?;
        meta.insert(META_DIGEST, digest_record(digest).as_slice())
            .map_err(self.engine("write digest"))?;
        meta.insert(
            META_BLOCKS,
            encode_count(META_BLOCKS, blocks_written).as_slice(),
        )
        .map_err(self.engine("write block count"))?;
        meta.insert(META_FORMAT, encode_format(FORMAT_BLOCKS).as_slice())
            .map_err(self.engine("write format"))?;
        Ok(())
    }
}

/// What an upgrade has read of the old events table, and the blocks it is
/// laying out from them.
#[derive(Default)]
struct Regroup {
    /// The open block.
    builder: BlockBuilder,
    /// Scratch for laying out a block value.
    value: Vec<u8>,
    /// Per stream seen: the first and last seq read.
    seen: BTreeMap<StreamId, (u64, u64)>,
    /// The stream being read, and its open block's first seq.
    current: Option<(StreamId, u64)>,
    /// The digest of the events read.
    digest: Digest,
    /// The blocks written so far.
    blocks_written: u64,
}

/// Encodes a format-2 event value: lamport, time_ms, payload length (all
/// little-endian), payload, then a crc32 over the key and all of that.
/// Only tests write format 2 now (the upgrade test's old files).
#[cfg(test)]
pub(super) fn encode_event(event: &Event, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(EVENT_OVERHEAD + event.payload.len());
    out.extend_from_slice(&event.lamport.to_le_bytes());
    out.extend_from_slice(&event.time_ms.to_le_bytes());
    let len = u32::try_from(event.payload.len()).expect("payload length checked by plan");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&event.payload);
    let crc = event_crc(event.stream, event.seq, out);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// Decodes and checks a format-2 event value. Total.
pub(super) fn decode_event(stream: StreamId, seq: u64, value: &[u8]) -> Result<Event, String> {
    if value.len() < EVENT_OVERHEAD {
        return Err(format!(
            "value of {} bytes is shorter than the {EVENT_OVERHEAD}-byte header",
            value.len()
        ));
    }
    let (body, crc) = value.split_at(value.len() - 4);
    let stored_crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    let computed_crc = event_crc(stream, seq, body);
    if stored_crc != computed_crc {
        return Err(format!(
            "crc32 mismatch: stored {stored_crc:#010x}, computed {computed_crc:#010x}"
        ));
    }
    let lamport = u64::from_le_bytes(body[0..8].try_into().expect("8 bytes"));
    let time_ms = u64::from_le_bytes(body[8..16].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(body[16..20].try_into().expect("4 bytes")) as usize;
    if len != body.len() - 20 {
        return Err(format!(
            "payload length {len} does not match the value's {} bytes",
            body.len() - 20
        ));
    }
    Ok(Event {
        stream,
        seq,
        lamport,
        time_ms,
        payload: Bytes::copy_from_slice(&body[20..]),
    })
}

fn event_crc(stream: StreamId, seq: u64, body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&stream.get().to_le_bytes());
    hasher.update(&seq.to_le_bytes());
    hasher.update(body);
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    use super::super::codec::{decode_format, encode_clock, encode_stream, META_CLOCK};
    use super::super::{DiskOptions, DATA_FILE, STREAMS};
    use super::*;
    use crate::{ChainHash, Config, Replica};
    use meshlog_cursor::VersionVector;
    use redb::ReadableDatabase;

    /// The events of a format-2 file: stream 1 above floor 5 (some
    /// payloads over a block's byte target), stream 2 exactly one block of
    /// 128, stream 3 compacted to its head (no events).
    fn old_log() -> (Vec<Event>, Vec<(StreamId, u64, u64)>) {
        let mut events = Vec::new();
        for seq in 6..=300u64 {
            let len = if seq % 97 == 0 {
                40_000
            } else {
                (seq % 150) as usize
            };
            events.push(Event {
                stream: StreamId::new(1),
                seq,
                lamport: seq * 2,
                time_ms: seq,
                payload: Bytes::from(vec![seq as u8; len]),
            });
        }
        for seq in 1..=128u64 {
            events.push(Event {
                stream: StreamId::new(2),
                seq,
                lamport: seq * 3,
                time_ms: 0,
                payload: Bytes::from(format!("two {seq}")),
            });
        }
        let streams = vec![
            (StreamId::new(1), 5, 300),
            (StreamId::new(2), 0, 128),
            (StreamId::new(3), 10, 10),
        ];
        (events, streams)
    }

    /// Writes a format-2 data file (what the previous build wrote) into
    /// `dir`; `damage` may change one event value first.
    fn write_format_2(dir: &std::path::Path, damage: Option<(u64, u64)>) -> Digest {
        let (events, streams) = old_log();
        let mut digest = Digest::default();
        let db = Database::create(dir.join(DATA_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(EVENTS).unwrap();
            let mut value = Vec::new();
            for event in &events {
                encode_event(event, &mut value);
                if damage == Some((event.stream.get(), event.seq)) {
                    value[10] ^= 0x04;
                }
                table
                    .insert((event.stream.get(), event.seq), value.as_slice())
                    .unwrap();
                digest.add(event);
            }
            let mut table = txn.open_table(STREAMS).unwrap();
            for &(stream, floor, head) in &streams {
                table
                    .insert(stream.get(), encode_stream(stream, floor, head).as_slice())
                    .unwrap();
            }
            let mut meta = txn.open_table(META).unwrap();
            meta.insert(META_FORMAT, encode_format(2).as_slice())
                .unwrap();
            meta.insert(META_CLOCK, encode_clock(900).as_slice())
                .unwrap();
            meta.insert(META_DIGEST, digest_record(digest).as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
        digest
    }

    fn format_of(dir: &std::path::Path) -> (u32, bool) {
        let db = Database::open(dir.join(DATA_FILE)).unwrap();
        let read = db.begin_read().unwrap();
        let meta = read.open_table(META).unwrap();
        let format = decode_format(meta.get(META_FORMAT).unwrap().unwrap().value()).unwrap();
        let has_events = read.open_table(EVENTS).is_ok();
        (format, has_events)
    }

    #[test]
    fn a_format_2_file_is_upgraded_to_blocks_once_keeping_every_event() {
        let dir = tempfile::tempdir().unwrap();
        let digest = write_format_2(dir.path(), None);
        let (events, streams) = old_log();
        for round in 0..2 {
            let store = DiskStore::open_with(dir.path(), &DiskOptions::default()).unwrap();
            let replica = Replica::open(Config::new(StreamId::new(1)), store).unwrap();
            assert_eq!(replica.digest(), digest, "round {round}");
            assert_eq!(replica.clock(), 900);
            for &(stream, floor, head) in &streams {
                assert_eq!(replica.floor().get(stream), floor);
                assert_eq!(replica.marks().get(stream), head);
            }
            for event in &events {
                assert_eq!(replica.get(event.stream, event.seq).as_ref(), Some(event));
            }
            assert_eq!(replica.verify().unwrap().events, events.len() as u64);
            // Chained from each floor: stream 2 (nothing compacted) from
            // h(0), anchored; streams 1 and 3 unanchored.
            let two: Vec<&Event> = events.iter().filter(|e| e.stream.get() == 2).collect();
            let chain = replica.chain(StreamId::new(2)).unwrap();
            assert!(chain.anchored);
            assert_eq!(chain.head_hash, ChainHash::GENESIS.extend(two));
            for stream in [1, 3] {
                assert!(!replica.chain(StreamId::new(stream)).unwrap().anchored);
            }
            drop(replica);
            assert_eq!(
                format_of(dir.path()),
                (FORMAT_VERSION, false),
                "round {round}"
            );
        }
    }

    /// Turns a data file written by this build into format 3, as the
    /// previous build wrote it: the same tables but `chains`, and format 3
    /// recorded.
    fn downgrade_to_format_3(dir: &std::path::Path) {
        let db = Database::open(dir.join(DATA_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        assert!(txn.delete_table(CHAINS).unwrap(), "format 4 has chains");
        txn.open_table(META)
            .unwrap()
            .insert(META_FORMAT, encode_format(3).as_slice())
            .unwrap();
        txn.commit().unwrap();
    }

    fn has_chains(dir: &std::path::Path) -> bool {
        let db = Database::open(dir.join(DATA_FILE)).unwrap();
        let read = db.begin_read().unwrap();
        read.open_table(CHAINS).is_ok()
    }

    /// A format-3 data file (today's, before chains) opens, is upgraded
    /// once, and answers the chain heads of a replica in memory that
    /// received the same events: equal for every stream nothing was
    /// compacted of; a compacted stream is unanchored (its events below
    /// the floor are gone), with the same head.
    #[test]
    fn a_format_3_file_is_upgraded_once_to_the_chain_heads_of_a_fresh_replica() {
        let dir = tempfile::tempdir().unwrap();
        let (own, peer, compacted) = (StreamId::new(1), StreamId::new(2), StreamId::new(3));
        let mut writers = [Replica::new(peer), Replica::new(compacted)];
        for i in 0..300u64 {
            let payload = Bytes::from(vec![i as u8; (i % 90) as usize]);
            writers[(i % 2) as usize].append_at(payload, i).unwrap();
        }
        let config = Config::new(own);
        let mut fresh = Replica::new(own);
        {
            let store = DiskStore::open(dir.path()).unwrap();
            let mut old = Replica::open(config.clone(), store).unwrap();
            for i in 0..200u64 {
                let payload = Bytes::from(format!("own {i}"));
                let event = old.append_at(payload, 7).unwrap();
                fresh.append_at(event.payload, 7).unwrap();
            }
            for writer in &writers {
                let delta = writer.delta_for(&VersionVector::new(), usize::MAX);
                old.apply(&delta).unwrap();
                fresh.apply(&delta).unwrap();
            }
            let floor: VersionVector = [(compacted, 40)].into_iter().collect();
            old.compact(&floor).unwrap();
            fresh.compact(&floor).unwrap();
        }
        downgrade_to_format_3(dir.path());
        assert_eq!(format_of(dir.path()), (3, false));
        assert!(!has_chains(dir.path()));
        let mut first = None;
        for round in 0..2 {
            let store = DiskStore::open(dir.path()).unwrap();
            let upgraded = Replica::open(config.clone(), store).unwrap();
            assert_eq!(upgraded.marks(), fresh.marks());
            for stream in [own, peer] {
                assert_eq!(upgraded.chain(stream), fresh.chain(stream), "round {round}");
                assert!(upgraded.chain(stream).unwrap().anchored);
            }
            let chain = upgraded.chain(compacted).unwrap();
            assert!(!chain.anchored && fresh.chain(compacted).unwrap().anchored);
            let (got, expected) = (upgraded.chain_digest(), fresh.chain_digest());
            assert_eq!(got.stream(compacted).unwrap().chain, None);
            assert_eq!(got.stream(compacted).unwrap().head, 150);
            assert_eq!(got.stream(own), expected.stream(own));
            assert_eq!(got.stream(peer), expected.stream(peer));
            upgraded.verify().unwrap();
            // Upgraded once: the second open reads the chains written.
            let chains: Vec<_> = [own, peer, compacted]
                .map(|stream| upgraded.chain(stream))
                .to_vec();
            match &first {
                None => first = Some(chains),
                Some(first) => assert_eq!(&chains, first),
            }
            drop(upgraded);
            assert_eq!(format_of(dir.path()).0, FORMAT_VERSION, "round {round}");
            assert!(has_chains(dir.path()));
        }
    }

    #[test]
    fn a_format_2_file_with_a_damaged_event_is_refused_naming_it_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        write_format_2(dir.path(), Some((1, 77)));
        match DiskStore::open(dir.path()) {
            Err(DiskError::CorruptEvent {
                path,
                stream,
                seq,
                detail,
            }) => {
                assert_eq!(path, dir.path().join(DATA_FILE));
                assert_eq!((stream, seq), (StreamId::new(1), 77));
                assert!(detail.contains("crc32 mismatch"), "{detail}");
            }
            other => panic!("expected CorruptEvent, got {other:?}"),
        }
        assert_eq!(format_of(dir.path()), (2, true), "nothing was rewritten");
    }

    #[test]
    fn a_format_2_event_value_round_trips_and_catches_every_single_bit_flip() {
        let event = Event {
            stream: StreamId::new(7),
            seq: 42,
            lamport: 99,
            time_ms: 1_700_000_000_000,
            payload: Bytes::from_static(b"payload"),
        };
        let mut value = Vec::new();
        encode_event(&event, &mut value);
        assert_eq!(
            decode_event(event.stream, event.seq, &value),
            Ok(event.clone())
        );
        for bit in 0..value.len() * 8 {
            let mut flipped = value.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode_event(event.stream, event.seq, &flipped).is_err(),
                "bit {bit}"
            );
        }
        assert!(decode_event(event.stream, 43, &value).is_err());
        assert!(decode_event(event.stream, 42, &value[..value.len() - 1]).is_err());
    }
}
