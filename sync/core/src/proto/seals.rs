//! Seals through cuts and splits: where this side cuts a delta (a stream
//! past a limit, on either side; a run below events the peer holds
//! pending) or splits one into frames, each seal stays with the run it
//! vouches for, and no part carries a sealed stream's run without its seal.
//!
//! Why: a seal vouches for its stream's chain up to its seq and no further
//! nor shorter. A run cut below its seal cannot keep it (the receiver
//! would refuse the seal, `DeltaError::ChainBroken`), and without it is
//! unsealed, which a receiver that pinned the stream refuses
//! (`DeltaError::Unsealed`), ending the session, on every reconnect.
//! So a sealed run is never cut short here: a cut that would shorten it
//! removes its events whole (they go in a later delta, sealed, or not to
//! this peer), and a split puts it whole, with its seal, into one part.
//! (`docs/PROTOCOL.md`, the session, step 3.)

use std::collections::{BTreeMap, HashMap};

use meshlog_cursor::StreamId;
use meshlog_replica::{Delta, Event};

use crate::frame::DELTA_EVENTS_MAX;

/// Cuts from `delta` each stream of `cut` from its seq on (0: every event
/// of it; its floor is the caller's). A sealed stream the cut would leave
/// short of its seal loses all its events in the delta, and the seal with
/// them. Returns the number of events removed.
pub(super) fn cut_streams(delta: &mut Delta, cut: &BTreeMap<StreamId, u64>) -> u64 {
    if cut.is_empty() {
        return 0;
    }
    let mut cut = cut.clone();
    delta.seals.retain(|run_seal| {
        let stream = run_seal.seal.stream;
        match cut.get_mut(&stream) {
            Some(from) if *from <= run_seal.seal.seq => {
                // No seal vouches for what the cut leaves: none of it goes.
                *from = 0;
                false
            }
            _ => true,
        }
    });
    let before = delta.events.len();
    delta
        .events
        .retain(|event| cut.get(&event.stream).is_none_or(|&from| event.seq < from));
    (before - delta.events.len()) as u64
}

/// Splits a delta into deltas of at most [`DELTA_EVENTS_MAX`] events, in
/// order: a receiver refuses a frame of more. Each part takes the events
/// of the whole's order as they come, so per stream it continues where
/// the parts before it ended, as successive deltas do; but a sealed
/// stream's run goes whole into one part, with its seal (where it starts,
/// if it fits there, else in the next part). A stream's floor, and what
/// backs it, goes in the part that holds the stream's first event (the
/// run that starts right after it, which vouches for it to a receiver
/// that knows the stream is keyed), or in the first part if the delta
/// carries no event of it.
///
/// `Err` gives the delta back when a sealed run alone is longer than a
/// frame carries: read again under a budget that fits one frame.
pub(super) fn split_delta(delta: Delta) -> Result<Vec<Delta>, Delta> {
    if delta.events.len() <= DELTA_EVENTS_MAX {
        return Ok(vec![delta]);
    }
    // The events of each sealed stream in the delta.
    let mut sealed: HashMap<StreamId, usize> = delta
        .seals
        .iter()
        .map(|run_seal| (run_seal.seal.stream, 0))
        .collect();
    for event in &delta.events {
        if let Some(len) = sealed.get_mut(&event.stream) {
            *len += 1;
        }
    }
    if sealed.values().any(|&len| len > DELTA_EVENTS_MAX) {
        return Err(delta);
    }
    let Delta {
        floor,
        events,
        seals,
        floor_proofs,
    } = delta;
    let placed = place_events(events, &sealed);
    let part_of_floor = |stream: StreamId| placed.first_in.get(&stream).copied().unwrap_or(0);
    Ok(placed
        .parts
        .into_iter()
        .enumerate()
        .map(|(at, events)| {
            let mut proofs = floor_proofs.clone();
            proofs.retain(|stream| part_of_floor(stream) == at);
            Delta {
                floor: floor
                    .iter()
                    .filter(|&(stream, _)| part_of_floor(stream) == at)
                    .collect(),
                floor_proofs: proofs,
                events,
                seals: seals
                    .iter()
                    .filter(|run_seal| placed.sealed_in.get(&run_seal.seal.stream) == Some(&at))
                    .copied()
                    .collect(),
            }
        })
        .collect())
}

/// A split's events, placed in parts.
struct Placed {
    /// Per part, its events.
    parts: Vec<Vec<Event>>,
    /// The part of each sealed stream's run.
    sealed_in: HashMap<StreamId, usize>,
    /// The part of each stream's first event.
    first_in: HashMap<StreamId, usize>,
}

/// Places `events` in parts of at most [`DELTA_EVENTS_MAX`], in order,
/// each sealed stream's run (of the length `sealed` gives) whole in one.
fn place_events(events: Vec<Event>, sealed: &HashMap<StreamId, usize>) -> Placed {
    // Per part, how many events it holds or keeps room for.
    let mut room: Vec<usize> = vec![0];
    let mut placed = Placed {
        parts: vec![Vec::new()],
        sealed_in: HashMap::new(),
        first_in: HashMap::new(),
    };
    for event in events {
        let current = room.len() - 1;
        let mut open_part = |room: &mut Vec<usize>, len: usize| {
            if room[current] + len > DELTA_EVENTS_MAX {
                room.push(0);
                placed.parts.push(Vec::new());
            }
            let at = room.len() - 1;
            room[at] += len;
            at
        };
        let at = match sealed.get(&event.stream) {
            Some(&len) => match placed.sealed_in.get(&event.stream) {
                Some(&at) => at,
                None => {
                    let at = open_part(&mut room, len);
                    placed.sealed_in.insert(event.stream, at);
                    at
                }
            },
            None => open_part(&mut room, 1),
        };
        placed.first_in.entry(event.stream).or_insert(at);
        placed.parts[at].push(event);
    }
    placed
}

#[cfg(test)]
mod tests {
    // Cuts and splits keep every seal with the run it ends, never leave a
    // sealed stream's run short of its seal, and otherwise cut and split as
    // before: seeded deltas of sealed and unsealed streams, checked part by
    // part against the whole.
    use bytes::Bytes;
    use meshlog_cursor::VersionVector;
    use meshlog_replica::{ChainHash, RunSeal, Seal, WriterKey};
    use meshlog_testkit::SplitMix64;

    use super::*;

    fn event(stream: StreamId, seq: u64) -> Event {
        Event {
            stream,
            seq,
            lamport: seq,
            time_ms: 0,
            payload: Bytes::new(),
        }
    }

    /// The seal of `key`'s stream at `seq` (its hash is not checked here).
    fn sealed_at(key: &WriterKey, seq: u64) -> RunSeal {
        RunSeal {
            key: key.public(),
            seal: Seal::sign(key, seq, ChainHash::from_bytes([seq as u8; 32])),
            base: None,
        }
    }

    /// A delta of `lens` runs, in `(lamport, stream)` order as a replica
    /// builds it (seqs interleaved across streams); the runs of the keyed
    /// streams (`Some`) sealed at their ends.
    fn delta_of(runs: &[(StreamId, usize, Option<&WriterKey>)]) -> Delta {
        let mut events = Vec::new();
        let longest = runs.iter().map(|r| r.1).max().unwrap_or(0);
        for i in 0..longest as u64 {
            for &(stream, len, _) in runs {
                if i < len as u64 {
                    events.push(event(stream, 1 + i));
                }
            }
        }
        let mut seals: Vec<RunSeal> = runs
            .iter()
            .filter_map(|&(_, len, key)| key.map(|key| sealed_at(key, len as u64)))
            .collect();
        seals.sort_by_key(|s| s.seal.stream);
        Delta {
            floor_proofs: Default::default(),
            floor: [(StreamId::new(9), 4)].into_iter().collect(),
            events,
            seals,
        }
    }

    /// What every part of a split must be: at most the limit, each sealed
    /// run whole and with its seal, each stream continuing where the parts
    /// before it ended, each stream's floor in the part of its first event
    /// (the first part for a stream without events); together, the whole.
    fn check_split(whole: &Delta, parts: &[Delta]) {
        let mut next: BTreeMap<StreamId, u64> = BTreeMap::new();
        let mut floor = VersionVector::new();
        for (at, part) in parts.iter().enumerate() {
            assert!(part.events.len() <= DELTA_EVENTS_MAX, "part {at}");
            assert!(!part.events.is_empty(), "part {at} is empty");
            for (stream, seq) in part.floor.iter() {
                let first = part.events.iter().find(|e| e.stream == stream);
                let in_whole = whole.events.iter().any(|e| e.stream == stream);
                assert!(
                    first.is_some() || (!in_whole && at == 0),
                    "part {at}'s floor"
                );
                assert!(!next.contains_key(&stream), "part {at}: floor after events");
                floor.advance(stream, seq);
            }
            for run_seal in &part.seals {
                let stream = run_seal.seal.stream;
                let run: Vec<u64> = part
                    .events
                    .iter()
                    .filter(|e| e.stream == stream)
                    .map(|e| e.seq)
                    .collect();
                let whole_run = whole.events.iter().filter(|e| e.stream == stream).count();
                assert_eq!(run.len(), whole_run, "part {at}: stream {stream} cut");
                assert_eq!(run.last(), Some(&run_seal.seal.seq), "part {at}");
            }
            for event in &part.events {
                let expected = next.get(&event.stream).copied();
                if let Some(expected) = expected {
                    assert_eq!(event.seq, expected, "part {at}: {event:?}");
                }
                next.insert(event.stream, event.seq + 1);
            }
        }
        let mut joined: Vec<Event> = parts.iter().flat_map(|p| p.events.clone()).collect();
        let mut events = whole.events.clone();
        joined.sort_by_key(|e| (e.stream, e.seq));
        events.sort_by_key(|e| (e.stream, e.seq));
        assert_eq!(joined, events);
        let mut seals: Vec<RunSeal> = parts.iter().flat_map(|p| p.seals.clone()).collect();
        seals.sort_by_key(|s| s.seal.stream);
        assert_eq!(seals, whole.seals);
        assert_eq!(floor, whole.floor);
    }

    /// A stream's floor, and what backs it, goes in the part that carries
    /// the stream's first event: a sealed run that starts right after the
    /// floor vouches for it there, to a receiver that knows the stream is
    /// keyed (in the first part, alone, the receiver was behind it). A
    /// floor of a stream without events stays in the first part.
    #[test]
    fn a_streams_floor_goes_in_the_part_of_its_first_event() {
        let key = WriterKey::from_bytes([1; 32]);
        let (plain, sealed, bare) = (StreamId::new(1), key.stream(), StreamId::new(9));
        let mut events: Vec<Event> = (1..=DELTA_EVENTS_MAX as u64)
            .map(|seq| event(plain, seq))
            .collect();
        events.extend((6..=10).map(|seq| event(sealed, seq)));
        let hash = ChainHash::from_bytes([7; 32]);
        let mut whole = Delta {
            floor_proofs: Default::default(),
            floor: [(bare, 4), (sealed, 5)].into_iter().collect(),
            events,
            seals: vec![sealed_at(&key, 10)],
        };
        whole.floor_proofs.hashes = vec![(sealed, hash)];
        let parts = split_delta(whole.clone()).unwrap();
        check_split(&whole, &parts);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].floor, [(bare, 4)].into_iter().collect());
        assert!(parts[0].floor_proofs.is_empty());
        assert_eq!(parts[1].floor, [(sealed, 5)].into_iter().collect());
        assert_eq!(parts[1].floor_proofs.hashes, [(sealed, hash)]);
        assert_eq!(parts[1].seals, whole.seals);
    }

    #[test]
    fn a_split_keeps_each_sealed_run_whole_with_its_seal() {
        let seed = meshlog_testkit::seed::seeds(0x5ea1_5911, 1)[0];
        let mut rng = SplitMix64::new(seed);
        let keys: Vec<WriterKey> = (1..=4).map(|b| WriterKey::from_bytes([b; 32])).collect();
        for round in 0..40 {
            let mut runs = Vec::new();
            for key in &keys {
                let len = rng.between(1, DELTA_EVENTS_MAX as u64) as usize;
                runs.push((key.stream(), len, rng.chance(0.6).then_some(key)));
            }
            for stream in 1..=2 {
                let len = rng.between(1, 2 * DELTA_EVENTS_MAX as u64) as usize;
                runs.push((StreamId::new(stream), len, None));
            }
            let whole = delta_of(&runs);
            let parts = split_delta(whole.clone())
                .unwrap_or_else(|_| panic!("seed {seed}, round {round}: no run too long"));
            check_split(&whole, &parts);
        }
    }

    #[test]
    fn a_sealed_run_longer_than_a_frame_gives_the_delta_back() {
        let key = WriterKey::from_bytes([1; 32]);
        let whole = delta_of(&[
            (key.stream(), DELTA_EVENTS_MAX + 1, Some(&key)),
            (StreamId::new(1), 5, None),
        ]);
        assert_eq!(split_delta(whole.clone()), Err(whole));
        // Unsealed, the same run is split as before: by the limit.
        let unsealed = delta_of(&[(key.stream(), DELTA_EVENTS_MAX + 1, None)]);
        let parts = split_delta(unsealed.clone()).unwrap();
        let lens: Vec<usize> = parts.iter().map(|p| p.events.len()).collect();
        assert_eq!(lens, [DELTA_EVENTS_MAX, 1]);
        check_split(&unsealed, &parts);
    }

    #[test]
    fn a_delta_is_split_at_the_event_limit_with_the_floor_in_the_first_part() {
        let events: Vec<Event> = (1..=2 * DELTA_EVENTS_MAX as u64 + 1)
            .map(|seq| event(StreamId::new(1 + seq % 3), seq))
            .collect();
        let floor: VersionVector = [(StreamId::new(9), 4)].into_iter().collect();
        let whole = Delta {
            floor_proofs: Default::default(),
            floor: floor.clone(),
            events: events.clone(),
            seals: Vec::new(),
        };
        let parts = split_delta(whole).unwrap();
        let lens: Vec<usize> = parts.iter().map(|part| part.events.len()).collect();
        assert_eq!(lens, [DELTA_EVENTS_MAX, DELTA_EVENTS_MAX, 1]);
        assert_eq!(parts[0].floor, floor);
        assert!(parts[1..].iter().all(|part| part.floor.is_empty()));
        let joined: Vec<Event> = parts.into_iter().flat_map(|part| part.events).collect();
        assert_eq!(joined, events);
        let small = Delta {
            floor_proofs: Default::default(),
            floor,
            events: events[..3].to_vec(),
            seals: Vec::new(),
        };
        assert_eq!(split_delta(small.clone()), Ok(vec![small]));
    }

    #[test]
    fn a_cut_below_a_seal_takes_the_stream_whole_and_keeps_other_seals() {
        let sealed = WriterKey::from_bytes([1; 32]);
        let other = WriterKey::from_bytes([2; 32]);
        let plain = StreamId::new(3);
        let whole = delta_of(&[
            (sealed.stream(), 5, Some(&sealed)),
            (other.stream(), 4, Some(&other)),
            (plain, 6, None),
        ]);
        let mut delta = whole.clone();
        let cut: BTreeMap<StreamId, u64> = [(sealed.stream(), 3), (plain, 4)].into();
        // The sealed stream's 5 events, and the plain stream's seqs 4 to 6.
        assert_eq!(cut_streams(&mut delta, &cut), 5 + 3);
        assert!(delta.events.iter().all(|e| e.stream != sealed.stream()));
        assert_eq!(delta.seals, vec![sealed_at(&other, 4)]);
        let plain_seqs: Vec<u64> = delta
            .events
            .iter()
            .filter(|e| e.stream == plain)
            .map(|e| e.seq)
            .collect();
        assert_eq!(plain_seqs, [1, 2, 3]);
        assert_eq!(delta.floor, whole.floor);
        // A cut above a seal (past the run) leaves it alone.
        let mut delta = whole.clone();
        let above: BTreeMap<StreamId, u64> = [(other.stream(), 5)].into();
        assert_eq!(cut_streams(&mut delta, &above), 0);
        assert_eq!(delta, whole);
    }
}
