//! `MemLog`: events held in memory, per stream in chunked columns, and the
//! `Source` trait through which the replica reads held events wherever
//! they live (this memory, or a store's view).
//!
//! Per stream, chunks of [`CHUNK_LEN`] consecutive events: three columns
//! (lamport, `time_ms`, the payload's end offset in the chunk) and one
//! buffer of the chunk's payloads back to back, into which each payload is
//! copied as it arrives, frozen once the chunk is full so that reads hand
//! out slices of it without a copy (a read from the last, open chunk
//! copies its payload out). Each column holds 16-bit offsets while its
//! values lie within 2^15 of its first, then 32-bit ones within 2^31
//! ([`Column`]), as a chunk's stamps, times and ends mostly do: about 6
//! bytes per event beyond the payload. Chunks fill in seq order, so no
//! column grows past what it holds except the last chunk's.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use meshlog_cursor::StreamId;

use crate::columns::{ColumnSlice, RunColumns};
use crate::narrow::Column;
use crate::{DeltaColumns, Event};

/// Events per chunk.
const CHUNK_LEN: usize = 256;

/// What reading a held event can fail with (only a store's view on disk
/// fails; memory never does).
pub(crate) type ReadError = Box<dyn std::error::Error + Send + Sync>;

/// Held events, wherever they live. Every read names seqs the caller knows
/// are held (within the published `floor+1 ..= head`).
pub(crate) trait Source {
    /// The lamport of held `(stream, seq)`.
    fn lamport(&self, stream: StreamId, seq: u64) -> Result<Option<u64>, ReadError>;
    /// The held event `(stream, seq)`.
    fn event(&self, stream: StreamId, seq: u64) -> Result<Option<Event>, ReadError>;
    /// The events of `stream` with seqs `first ..= last`, in seq order.
    fn scan<'a>(
        &'a self,
        stream: StreamId,
        first: u64,
        last: u64,
    ) -> Result<Box<dyn StreamScan + 'a>, ReadError>;

    /// Appends to `out` the events of `stream` with seqs `first ..= last`
    /// (all held), in seq order, while their size hints keep `used` within
    /// `budget`: whether all of them did.
    fn read_into(
        &self,
        stream: StreamId,
        first: u64,
        last: u64,
        budget: usize,
        used: &mut usize,
        out: &mut Vec<Event>,
    ) -> Result<bool, ReadError> {
        let mut scan = self.scan(stream, first, last)?;
        while scan.peek()?.is_some() {
            let event = scan.take()?;
            *used = used.saturating_add(event.size_hint());
            if *used > budget {
                return Ok(false);
            }
            out.push(event);
        }
        Ok(true)
    }

    /// Appends to `out` the events of `stream` with seqs `first ..= last`
    /// (all held), in seq order.
    fn read_columns(
        &self,
        stream: StreamId,
        first: u64,
        last: u64,
        out: &mut DeltaColumns,
    ) -> Result<(), ReadError> {
        let mut events = Vec::new();
        let mut used = 0;
        self.read_into(stream, first, last, usize::MAX, &mut used, &mut events)?;
        for event in &events {
            out.push(event);
        }
        Ok(())
    }

    /// Of `stream`'s held seqs `first ..= last`, the ones from `first`
    /// whose lamport is at most `lamport` (lamports rise with seq): `None`
    /// where the source cannot tell without reading the events (its
    /// caller walks them instead).
    fn through(
        &self,
        _stream: StreamId,
        _first: u64,
        _last: u64,
        _lamport: u64,
    ) -> Result<Option<Through>, ReadError> {
        Ok(None)
    }
}

/// Of one stream's held events, the ones from the first asked with
/// lamports at most a bound: how many, and their payloads' bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Through {
    /// The events.
    pub(crate) count: u64,
    /// Their payloads' bytes.
    pub(crate) payload_bytes: u64,
}

/// One stream's events in seq order, peeked by lamport (for the k-way
/// merge of a walk).
pub(crate) trait StreamScan {
    /// The lamport of the next event, or `None` when the scan is done.
    fn peek(&mut self) -> Result<Option<u64>, ReadError>;
    /// Takes the next event; only after `peek` answered `Some`.
    fn take(&mut self) -> Result<Event, ReadError>;
}

#[derive(Debug, Clone)]
enum Payloads {
    /// The last chunk's payloads back to back, still growing: each copied
    /// in as it arrives (a copy of the bytes, where keeping the sender's
    /// `Bytes` would cost an allocation to share it, and a second copy at
    /// sealing). A read copies its payload out.
    Open(Vec<u8>),
    /// A full chunk's payloads back to back, shared with the events read
    /// from it.
    Sealed(Bytes),
}

impl Payloads {
    /// The bytes held (every payload of the chunk, back to back).
    fn len(&self) -> usize {
        match self {
            Payloads::Open(bytes) => bytes.len(),
            Payloads::Sealed(bytes) => bytes.len(),
        }
    }
}

#[derive(Debug, Clone)]
struct Chunk {
    lamports: Column,
    times: Column,
    /// Per event, where its payload ends in `payloads` (it starts where the
    /// one before ends).
    ends: Column,
    payloads: Payloads,
}

impl Chunk {
    fn new() -> Self {
        Chunk::with_capacity(0, 0)
    }

    fn with_capacity(len: usize, payload_bytes: usize) -> Self {
        Chunk {
            lamports: Column::with_capacity(len),
            times: Column::with_capacity(len),
            ends: Column::with_capacity(len),
            payloads: Payloads::Open(Vec::with_capacity(payload_bytes)),
        }
    }

    /// Where the payload of event `index` starts and ends in `payloads`.
    fn span(&self, index: usize) -> (usize, usize) {
        let start = if index == 0 {
            0
        } else {
            self.ends.get(index - 1) as usize
        };
        (start, self.ends.get(index) as usize)
    }

    fn payload(&self, index: usize) -> Bytes {
        let (start, end) = self.span(index);
        match &self.payloads {
            Payloads::Open(bytes) => Bytes::copy_from_slice(&bytes[start..end]),
            Payloads::Sealed(bytes) => bytes.slice(start..end),
        }
    }
}

/// One stream's held events: seqs `first ..` in chunks, every chunk but the
/// last full.
#[derive(Debug, Clone)]
struct MemStream {
    first: u64,
    len: u64,
    chunks: VecDeque<Chunk>,
}

impl MemStream {
    /// The chunk and index of `seq`, if held.
    fn at(&self, seq: u64) -> Option<(&Chunk, usize)> {
        let index = seq.checked_sub(self.first)?;
        if index >= self.len {
            return None;
        }
        let index = usize::try_from(index).ok()?;
        let chunk = self.chunks.get(index / CHUNK_LEN)?;
        Some((chunk, index % CHUNK_LEN))
    }

    fn head(&self) -> u64 {
        self.first + (self.len - 1)
    }

    /// See [`Source::through`]: stamps rise with seq, so those at most
    /// `lamport` are a prefix, found by a binary search over the seqs (one
    /// stamp read per step, wherever it lies); their payload bytes are
    /// summed a chunk at a time, a whole chunk's from its payload buffer's
    /// length.
    fn through(&self, first: u64, last: u64, lamport: u64) -> Through {
        let stamp = |seq: u64| self.at(seq).map(|(chunk, index)| chunk.lamports.get(index));
        // Seqs `first ..` below `first + low` stamp at most `lamport`;
        // from `first + high` on, above it (or are not held).
        let (mut low, mut high) = (0u64, last - first + 1);
        while low < high {
            let middle = low + (high - low) / 2;
            match stamp(first + middle) {
                Some(stamp) if stamp <= lamport => low = middle + 1,
                _ => high = middle,
            }
        }
        if low == 0 {
            return Through::default();
        }
        Through {
            count: low,
            payload_bytes: self.payload_bytes(first, first + (low - 1)),
        }
    }

    /// The payload bytes of held seqs `first ..= last`.
    fn payload_bytes(&self, first: u64, last: u64) -> u64 {
        let mut bytes = 0u64;
        let mut seq = first;
        while seq <= last {
            let Some((chunk, index)) = self.at(seq) else {
                break;
            };
            let chunk_last = chunk.lamports.len() - 1;
            let end_index = (index as u64)
                .saturating_add(last - seq)
                .min(chunk_last as u64) as usize;
            let (start, _) = chunk.span(index);
            let end = if end_index == chunk_last {
                chunk.payloads.len()
            } else {
                chunk.span(end_index).1
            };
            bytes += (end - start) as u64;
            match seq.checked_add((end_index - index + 1) as u64) {
                Some(next) => seq = next,
                None => break,
            }
        }
        bytes
    }

    /// The open chunk with room for up to `events` more (at least one),
    /// and how many it takes, with room for them in its columns.
    fn open_chunk(&mut self, events: usize) -> (&mut Chunk, usize) {
        if self
            .chunks
            .back()
            .is_none_or(|chunk| chunk.lamports.len() == CHUNK_LEN)
        {
            // A stream that filled a chunk will likely fill the next:
            // its columns are made whole at once rather than grown by
            // doubling (which copies them ~8 times). A stream's first
            // chunk grows, so a stream of few events keeps few bytes.
            // Its payload buffer is sized as the chunk before it.
            let before = self.chunks.back().and_then(|chunk| chunk.ends.last());
            self.chunks.push_back(match before {
                Some(bytes) => Chunk::with_capacity(CHUNK_LEN, bytes as usize),
                None => Chunk::new(),
            });
        }
        let chunk = self.chunks.back_mut().expect("a chunk was just ensured");
        let len = chunk.lamports.len();
        let taken = (CHUNK_LEN - len).min(events);
        // A first chunk grows by doubling, but never past a chunk's
        // worth (a stream that fills it would leave the rest unused).
        if chunk.lamports.capacity() < len + taken {
            let target = (len + taken)
                .max(2 * chunk.lamports.capacity())
                .min(CHUNK_LEN);
            for column in [&mut chunk.lamports, &mut chunk.times, &mut chunk.ends] {
                column.reserve_exact(target - len);
            }
        }
        (chunk, taken)
    }

    /// Counts `taken` events held in the open chunk, and seals it if they
    /// filled it.
    fn filled(&mut self, taken: usize) {
        self.len += taken as u64;
        let chunk = self.chunks.back_mut().expect("a chunk was filled");
        if chunk.lamports.len() < CHUNK_LEN {
            return;
        }
        let Payloads::Open(bytes) = &mut chunk.payloads else {
            unreachable!("only full chunks are sealed");
        };
        let mut bytes = std::mem::take(bytes);
        // Sealed at its length: the buffer grew by doubling, and its
        // slack would stay for as long as the chunk.
        if bytes.capacity() - bytes.len() > bytes.len() / 16 {
            bytes.shrink_to_fit();
        }
        chunk.payloads = Payloads::Sealed(Bytes::from(bytes));
    }

    /// Appends `events`, the ones after the last held (checked by the
    /// caller), a chunk's worth at a time.
    fn push_all(&mut self, mut events: &[Event]) {
        while !events.is_empty() {
            let (chunk, taken) = self.open_chunk(events.len());
            let (now, rest) = events.split_at(taken);
            let Payloads::Open(bytes) = &mut chunk.payloads else {
                unreachable!("only full chunks are sealed");
            };
            bytes.reserve(now.iter().map(|event| event.payload.len()).sum());
            chunk.lamports.extend(now.iter().map(|event| event.lamport));
            chunk.times.extend(now.iter().map(|event| event.time_ms));
            chunk
                .ends
                .extend(now.iter().scan(bytes.len() as u64, |end, event| {
                    *end += event.payload.len() as u64;
                    Some(*end)
                }));
            for event in now {
                bytes.extend_from_slice(&event.payload);
            }
            self.filled(taken);
            events = rest;
        }
    }

    /// Appends a run in columns, the events after the last held (checked
    /// by the caller), a chunk's worth at a time: its columns copied, its
    /// payloads in one copy per chunk.
    fn push_columns(&mut self, run: RunColumns<'_>) {
        let mut at = 0;
        while at < run.len() {
            let (chunk, taken) = self.open_chunk(run.len() - at);
            let Payloads::Open(bytes) = &mut chunk.payloads else {
                unreachable!("only full chunks are sealed");
            };
            let end = at + taken;
            let (from, to) = (run.payload_start(at), run.end(end - 1));
            // (Only a plan makes a run in columns, and it checked that the
            // stamps rise; ends never fall.) A steady piece is added at
            // once.
            for piece in run.lamports.slice(at..end).pieces() {
                chunk.lamports.extend_piece(piece, 0, true);
            }
            for piece in run.times.slice(at..end).pieces() {
                chunk.times.extend_piece(piece, 0, false);
            }
            // The delta's ends as ends in this chunk's payloads.
            let shift = (bytes.len() as u64).wrapping_sub(from as u64);
            for piece in run.ends.slice(at..end).pieces() {
                chunk.ends.extend_piece(piece, shift, true);
            }
            bytes.extend_from_slice(&run.payloads[from..to]);
            self.filled(taken);
            at = end;
        }
    }
}

/// Events in memory, per stream. Holds what it is given: a caller that
/// compacts bounds its reads by its own floor (whole chunks are freed by
/// [`MemLog::drop_through`], a partial one stays until it empties).
#[derive(Debug, Clone, Default)]
pub(crate) struct MemLog {
    streams: BTreeMap<StreamId, MemStream>,
    /// Streams' events replaced by a push past a gap (a floor raised above
    /// the head, then the events after it), kept for readers that may
    /// still read them until [`MemLog::free_retired`].
    retired: Vec<(StreamId, MemStream)>,
}

impl MemLog {
    /// Holds `event`, the next of its stream after what is held (or any
    /// seq, for a stream holding nothing).
    #[cfg(test)]
    pub(crate) fn push(&mut self, event: &Event) {
        self.push_run(std::slice::from_ref(event));
    }

    /// Holds `events`, consecutive seqs of one stream, the next after what
    /// is held (or from any seq, for a stream holding nothing): the stream is
    /// looked up once per run.
    pub(crate) fn push_run(&mut self, events: &[Event]) {
        let Some(first) = events.first() else {
            return;
        };
        assert!(
            events.iter().enumerate().all(|(i, event)| {
                event.stream == first.stream && Some(event.seq) == first.seq.checked_add(i as u64)
            }),
            "a run is consecutive seqs of one stream"
        );
        self.stream_at(first.stream, first.seq).push_all(events);
    }

    /// Holds a run of a delta in columns, the next after what is held (or
    /// from any seq, for a stream holding nothing).
    pub(crate) fn push_columns(&mut self, run: RunColumns<'_>) {
        if run.len() == 0 {
            return;
        }
        self.stream_at(run.stream, run.first_seq).push_columns(run);
    }

    /// `stream`'s events, ready to take `seq` next.
    fn stream_at(&mut self, id: StreamId, seq: u64) -> &mut MemStream {
        let stream = self.streams.entry(id).or_insert_with(|| MemStream {
            first: seq,
            len: 0,
            chunks: VecDeque::new(),
        });
        if stream.len == 0 {
            stream.first = seq;
            stream.chunks.clear();
        } else if seq.saturating_sub(stream.first) > stream.len {
            // (`seq - first` cannot underflow: a push never goes below the
            // held events; the assertion below says so otherwise.)
            // Past a floor raised above the head: the old events are
            // retired, not freed, and the stream starts again here.
            let fresh = MemStream {
                first: seq,
                len: 0,
                chunks: VecDeque::new(),
            };
            let old = std::mem::replace(stream, fresh);
            self.retired.push((id, old));
        }
        assert_eq!(
            seq.checked_sub(stream.first),
            Some(stream.len),
            "held events stay gap-free"
        );
        stream
    }

    /// Frees the chunks of `stream` whose events are all at or below
    /// `floor_seq`; everything, if `floor_seq` reaches the last held seq
    /// (the next event pushed may then start anywhere above it).
    pub(crate) fn drop_through(&mut self, stream: StreamId, floor_seq: u64) {
        let Some(log) = self.streams.get_mut(&stream) else {
            return;
        };
        if log.len == 0 {
            return;
        }
        if floor_seq >= log.head() {
            self.streams.remove(&stream);
            return;
        }
        while log.chunks.len() > 1 && log.first.saturating_add(CHUNK_LEN as u64 - 1) <= floor_seq {
            log.chunks.pop_front();
            log.first += CHUNK_LEN as u64;
            log.len -= CHUNK_LEN as u64;
        }
    }

    /// Frees what pushes past a gap retired.
    pub(crate) fn free_retired(&mut self) {
        self.retired.clear();
    }

    /// The stream's events that hold `seq`: the current ones, or retired.
    fn holding(&self, stream: StreamId, seq: u64) -> Option<&MemStream> {
        let current = self.streams.get(&stream);
        if current.is_some_and(|log| log.at(seq).is_some()) {
            return current;
        }
        self.retired
            .iter()
            .rev()
            .find(|(id, log)| *id == stream && log.at(seq).is_some())
            .map(|(_, log)| log)
            .or(current)
    }

    fn get(&self, stream: StreamId, seq: u64) -> Option<Event> {
        let (chunk, index) = self.holding(stream, seq)?.at(seq)?;
        Some(Event {
            stream,
            seq,
            lamport: chunk.lamports.get(index),
            time_ms: chunk.times.get(index),
            payload: chunk.payload(index),
        })
    }
}

impl Source for MemLog {
    fn lamport(&self, stream: StreamId, seq: u64) -> Result<Option<u64>, ReadError> {
        Ok(self
            .holding(stream, seq)
            .and_then(|log| log.at(seq))
            .map(|(chunk, index)| chunk.lamports.get(index)))
    }

    fn event(&self, stream: StreamId, seq: u64) -> Result<Option<Event>, ReadError> {
        Ok(self.get(stream, seq))
    }

    /// A chunk at a time: each event's fields read from its chunk's
    /// columns, its payload a slice of the chunk's (of one copy of the open
    /// chunk's span).
    fn read_into(
        &self,
        stream: StreamId,
        first: u64,
        last: u64,
        budget: usize,
        used: &mut usize,
        out: &mut Vec<Event>,
    ) -> Result<bool, ReadError> {
        let Some(log) = self.holding(stream, first) else {
            return Ok(true);
        };
        let mut seq = first;
        while seq <= last {
            let Some((chunk, index)) = log.at(seq) else {
                return Ok(true);
            };
            let end_index = (index as u64)
                .saturating_add(last - seq)
                .min(chunk.lamports.len() as u64 - 1) as usize;
            let (base, _) = chunk.span(index);
            let (_, base_end) = chunk.span(end_index);
            let payloads = match &chunk.payloads {
                Payloads::Sealed(bytes) => bytes.slice(base..base_end),
                Payloads::Open(bytes) => Bytes::copy_from_slice(&bytes[base..base_end]),
            };
            let mut start = base;
            for i in index..=end_index {
                let end = chunk.ends.get(i) as usize;
                let event = Event {
                    stream,
                    seq,
                    lamport: chunk.lamports.get(i),
                    time_ms: chunk.times.get(i),
                    payload: payloads.slice(start - base..end - base),
                };
                *used = used.saturating_add(event.size_hint());
                if *used > budget {
                    return Ok(false);
                }
                out.push(event);
                start = end;
                match seq.checked_add(1) {
                    Some(next) => seq = next,
                    None => return Ok(true),
                }
            }
        }
        Ok(true)
    }

    /// A slice of each column of a chunk at a time.
    fn read_columns(
        &self,
        stream: StreamId,
        first: u64,
        last: u64,
        out: &mut DeltaColumns,
    ) -> Result<(), ReadError> {
        let Some(log) = self.holding(stream, first) else {
            return Ok(());
        };
        let mut seq = first;
        while seq <= last {
            let Some((chunk, index)) = log.at(seq) else {
                return Ok(());
            };
            let end_index = (index as u64)
                .saturating_add(last - seq)
                .min(chunk.lamports.len() as u64 - 1) as usize;
            let (base, _) = chunk.span(index);
            let (_, base_end) = chunk.span(end_index);
            let payloads: &[u8] = match &chunk.payloads {
                Payloads::Sealed(bytes) => bytes,
                Payloads::Open(bytes) => bytes,
            };
            out.extend_from_columns(
                stream,
                seq,
                ColumnSlice {
                    lamports: chunk.lamports.range(index..=end_index),
                    times: chunk.times.range(index..=end_index),
                    ends: chunk.ends.range(index..=end_index),
                    base,
                    payloads: &payloads[base..base_end],
                },
            );
            match seq.checked_add((end_index - index + 1) as u64) {
                Some(next) => seq = next,
                None => return Ok(()),
            }
        }
        Ok(())
    }

    fn through(
        &self,
        stream: StreamId,
        first: u64,
        last: u64,
        lamport: u64,
    ) -> Result<Option<Through>, ReadError> {
        Ok(Some(
            self.holding(stream, first)
                .map_or_else(Through::default, |log| log.through(first, last, lamport)),
        ))
    }

    fn scan<'a>(
        &'a self,
        stream: StreamId,
        first: u64,
        last: u64,
    ) -> Result<Box<dyn StreamScan + 'a>, ReadError> {
        Ok(Box::new(MemScan {
            log: self.holding(stream, first),
            stream,
            next: Some(first),
            last,
            open: None,
        }))
    }
}

struct MemScan<'a> {
    log: Option<&'a MemStream>,
    stream: StreamId,
    /// `None` once seq `u64::MAX` was taken.
    next: Option<u64>,
    last: u64,
    /// The payloads of the open chunk's events the scan reads, copied out
    /// at once when it reaches them (a copy per event costs an allocation
    /// each): `(offset in the chunk where the copy starts, the copy)`.
    open: Option<(usize, Bytes)>,
}

impl StreamScan for MemScan<'_> {
    fn peek(&mut self) -> Result<Option<u64>, ReadError> {
        let Some(next) = self.next.filter(|&next| next <= self.last) else {
            return Ok(None);
        };
        Ok(self
            .log
            .and_then(|log| log.at(next))
            .map(|(chunk, index)| chunk.lamports.get(index)))
    }

    fn take(&mut self) -> Result<Event, ReadError> {
        let seq = self.next.expect("take follows a peek that found the event");
        let (chunk, index) = self
            .log
            .and_then(|log| log.at(seq))
            .expect("take follows a peek that found the event");
        self.next = seq.checked_add(1);
        let payload = match &chunk.payloads {
            Payloads::Sealed(_) => chunk.payload(index),
            Payloads::Open(bytes) => {
                let (start, end) = chunk.span(index);
                let (base, copy) = self.open.get_or_insert_with(|| {
                    // Up to the scan's last event, or the chunk's.
                    let last_index = (index as u64)
                        .saturating_add(self.last - seq)
                        .min(chunk.ends.len() as u64 - 1)
                        as usize;
                    let (_, copy_end) = chunk.span(last_index);
                    (start, Bytes::copy_from_slice(&bytes[start..copy_end]))
                });
                copy.slice(start - *base..end - *base)
            }
        };
        Ok(Event {
            stream: self.stream,
            seq,
            lamport: chunk.lamports.get(index),
            time_ms: chunk.times.get(index),
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use meshlog_testkit::{seed, SplitMix64};

    use super::*;

    /// Pushes, drops and reads against a `BTreeMap` of every event, across
    /// chunk boundaries. Seeded.
    #[test]
    fn mem_log_holds_what_it_was_given() {
        let seed = seed::replay_or(0x3e3_5eed);
        let mut rng = SplitMix64::new(seed);
        let mut log = MemLog::default();
        let mut model: BTreeMap<(u64, u64), Event> = BTreeMap::new();
        let mut floors = [0u64; 3];
        let mut heads = [0u64; 3];
        // Now and then a stamp jumps, or a time steps back, by more than
        // a chunk's narrow column holds.
        let mut jumped = 0u64;
        for step in 0..20_000u64 {
            let s = rng.below(3) as usize;
            let stream = StreamId::new(s as u64);
            if rng.below(100) == 0 {
                let floor = floors[s] + rng.below(700);
                log.drop_through(stream, floor);
                model.retain(|&(m, seq), _| m != s as u64 || seq > floor);
                floors[s] = floors[s].max(floor);
                heads[s] = heads[s].max(floor);
            } else {
                heads[s] += 1;
                if rng.below(500) == 0 {
                    jumped += 1 << 33;
                }
                let event = Event {
                    stream,
                    seq: heads[s],
                    lamport: step + 1 + jumped,
                    time_ms: if rng.below(300) == 0 {
                        u64::MAX - step
                    } else {
                        step
                    },
                    payload: Bytes::from(vec![step as u8; rng.below(9) as usize]),
                };
                log.push(&event);
                model.insert((s as u64, heads[s]), event);
            }
            if step % 997 == 0 {
                for ((m, seq), event) in &model {
                    let got = log.get(StreamId::new(*m), *seq);
                    assert_eq!(got.as_ref(), Some(event), "step {step}, seed {seed}");
                }
            }
            // A scan of any held range reads what `get` reads, whether it
            // starts or ends inside a sealed chunk or the open one.
            if step % 101 == 0 {
                let low = floors[s] + 1;
                if low <= heads[s] {
                    let first = low + rng.below(heads[s] - low + 1);
                    let last = first + rng.below(heads[s] - first + 1);
                    let mut scan = log.scan(stream, first, last).unwrap();
                    for seq in first..=last {
                        let event = &model[&(s as u64, seq)];
                        assert_eq!(
                            scan.peek().unwrap(),
                            Some(event.lamport),
                            "seq {seq} of {first}..={last}, seed {seed}"
                        );
                        assert_eq!(&scan.take().unwrap(), event, "seed {seed}");
                    }
                    assert_eq!(scan.peek().unwrap(), None, "seed {seed}");
                    // So does a bulk read, up to its budget.
                    let budget = rng.below(2_000) as usize;
                    let (mut used, mut out) = (0, Vec::new());
                    let all = log
                        .read_into(stream, first, last, budget, &mut used, &mut out)
                        .unwrap();
                    let expected: Vec<&Event> = (first..=last)
                        .map(|seq| &model[&(s as u64, seq)])
                        .scan(0usize, |sum, event| {
                            *sum += event.size_hint();
                            (*sum <= budget).then_some(event)
                        })
                        .collect();
                    assert_eq!(out.iter().collect::<Vec<_>>(), expected, "seed {seed}");
                    assert_eq!(
                        all,
                        expected.len() as u64 == last - first + 1,
                        "seed {seed}"
                    );
                    // Counting the events stamped at most a bound, and
                    // their bytes, is the model's prefix.
                    let events: Vec<&Event> =
                        (first..=last).map(|seq| &model[&(s as u64, seq)]).collect();
                    let bound = events[0].lamport - 1
                        + rng.below(events[events.len() - 1].lamport - events[0].lamport + 3);
                    let below: Vec<&&Event> = events
                        .iter()
                        .filter(|event| event.lamport <= bound)
                        .collect();
                    assert_eq!(
                        log.through(stream, first, last, bound).unwrap(),
                        Some(Through {
                            count: below.len() as u64,
                            payload_bytes: below.iter().map(|e| e.payload.len() as u64).sum(),
                        }),
                        "{first}..={last} at {bound}, seed {seed}"
                    );
                    // And a read in columns holds the same events.
                    let mut columns = DeltaColumns::default();
                    log.read_columns(stream, first, last, &mut columns).unwrap();
                    let delta = columns.to_delta();
                    assert_eq!(
                        delta.events.iter().collect::<Vec<_>>(),
                        events,
                        "seed {seed}"
                    );
                }
            }
        }
    }
}
