//! Frame decoding is total and bounded in memory, and frames round-trip.
//!
//! - Hand-made tricky inputs, and every file under
//!   `fuzz/regressions/frame_decode/` (when that folder exists), go through
//!   the `frame_decode` fuzz target's own checks
//!   (`meshlog_sync::testkit::frame_check`): no panic, the right typed error,
//!   re-encoding round-trips.
//! - Seeded random inputs (raw bytes, and valid frames with bytes flipped,
//!   cut or appended) go through the same checks.
//! - For all of them the peak of live heap bytes on this thread while the
//!   checks run stays within `ALLOC_PER_BYTE` per input byte plus a slack:
//!   a decoder that reserved by a count read from the input would blow far
//!   past it (a 7-byte delta can claim 4 billion events).
//! - A delta announcing more than `DELTA_EVENTS_MAX` events, or a vector
//!   announcing more than `STREAMS_MAX` streams, is refused by its count
//!   with next to nothing allocated, however long the frame (the 4 MiB
//!   frame of minimal events found in review).
//! - A delta's runs: every typed error of their layout (a count above the
//!   bytes left, a seq or lamport stamp overflowing, runs not canonical),
//!   each from a hand-made payload.
//! - quickcheck: arbitrary frames encode, split and decode to themselves;
//!   a delta's events come back grouped by stream, streams ascending,
//!   however they were interleaved, each stream's in seq order. Arbitrary events
//!   (holes, repeats, stamps standing still) encode exactly when a
//!   reference model says the layout can carry them.

use std::path::PathBuf;

use bytes::Bytes;
use meshlog_cursor::STREAMS_MAX;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{ChainHash, Delta, Event, RunSeal, Seal, WriterKey};
use meshlog_sync::frame::{self, Frame, Hello, MarksDiff, Receipt, Routes};
use meshlog_sync::testkit::{self, frame_check, SplitMix64};
use meshlog_sync::{FrameError, DELTA_EVENTS_MAX, FRAME_BYTES_MAX, PROTOCOL_VERSION};
use meshlog_testkit::alloc::{self, CountingAlloc};
use quickcheck::{Arbitrary, Gen, QuickCheck};

/// Live heap bytes allowed per input byte, plus `ALLOC_SLACK`, plus what a
/// delta's event count decodes into. The largest cost per byte: a run
/// header (16 bytes in memory) from 3 input bytes, a vector entry (16
/// bytes) from 2, a payload's one copy, each held twice by the checks (the
/// decoded frame, and the frame decoded again from its re-encoding).
const ALLOC_PER_BYTE: i64 = 64;
const ALLOC_SLACK: i64 = 16 * 1024;
/// What a delta's events take in memory whatever the frame's size: its
/// columns write a repeated value once, so a few bytes stand for up to
/// `DELTA_EVENTS_MAX` events of 64 bytes, reserved once (512 KiB).
const DELTA_EVENTS_BYTES: i64 = DELTA_EVENTS_MAX as i64 * 64;

// Counts per thread, so the tests running beside one do not count in it.
#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// Runs `work` and returns its output with the peak of live heap bytes on
/// this thread while it ran, above what was live before.
fn peak_of<T>(work: impl FnOnce() -> T) -> (T, i64) {
    let (out, measured) = alloc::measure(work);
    (out, measured.bytes_peak)
}

/// Runs the fuzz target's checks on `data` and asserts the memory bound.
fn check(name: &str, data: &[u8]) -> frame_check::Outcome {
    let (outcome, peak) = peak_of(|| frame_check::check_input(data));
    // Held twice by the checks: the frame, and its re-encoding decoded.
    let bound = ALLOC_PER_BYTE * data.len() as i64 + ALLOC_SLACK + 2 * DELTA_EVENTS_BYTES;
    assert!(
        peak <= bound,
        "{name}: checking {} input bytes held {peak} heap bytes at peak; the bound is {bound}",
        data.len()
    );
    outcome
}

fn vv(entries: &[(u64, u64)]) -> VersionVector {
    entries
        .iter()
        .map(|&(s, seq)| (StreamId::new(s), seq))
        .collect()
}

fn valid_frames() -> Vec<Frame> {
    vec![
        Frame::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            stream: StreamId::new(0xb),
            marks: vv(&[(1, 7), (0xb, 3), (u64::MAX, 1)]),
            floor: vv(&[(1, 2)]),
            frame_bytes_max: FRAME_BYTES_MAX as u32,
        }),
        Frame::delta(
            1,
            Delta {
                floor_proofs: Default::default(),
                floor: vv(&[(1, 2)]),
                events: (1..=5)
                    .map(|seq| Event {
                        stream: StreamId::new(1),
                        seq: seq + 2,
                        lamport: seq * 10,
                        time_ms: 1_700_000_000_000 + seq,
                        payload: Bytes::from(vec![seq as u8; seq as usize * 3]),
                    })
                    .collect(),
                seals: Vec::new(),
            },
        ),
        Frame::Ack(Receipt {
            received: 9,
            seen: 4,
            marks: MarksDiff {
                number: 6,
                base: 4,
                changes: vv(&[(2, 1), (3, 300)]),
            },
        }),
        Frame::Heartbeat(Receipt {
            received: 9,
            seen: 4,
            marks: MarksDiff {
                number: 6,
                base: 6,
                changes: VersionVector::new(),
            },
        }),
        Frame::Routes(Routes {
            number: 3,
            quiet: vec![StreamId::new(2), StreamId::new(300)],
            loud: vec![StreamId::new(7)],
        }),
        Frame::BareAck(300),
        sealed_delta(),
        Frame::HelloAgainst(frame::HelloAgainst {
            protocol: PROTOCOL_VERSION,
            stream: StreamId::new(0xb),
            frame_bytes_max: FRAME_BYTES_MAX as u32 | 1,
            base: meshlog_cursor::CheckpointName::from_bytes([0x11; 16]),
            marks: vv(&[(1, 9), (u64::MAX, 2)]),
            unfolded: vec![StreamId::new(2), StreamId::new(300)],
            floor: vv(&[(1, 2), (2, 1)]),
        }),
    ]
}

/// A delta of two keyed writers' runs, both sealed (the second with a
/// base), as a replica sends it: each seal over the run's chain.
fn sealed_delta() -> Frame {
    let mut keys = [
        WriterKey::from_bytes([1; 32]),
        WriterKey::from_bytes([2; 32]),
    ];
    keys.sort_by_key(|key| key.stream());
    let mut events = Vec::new();
    let mut seals = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let run: Vec<Event> = (1..=3)
            .map(|seq| Event {
                stream: key.stream(),
                seq: seq + 2 * i as u64,
                lamport: seq,
                time_ms: 1_700_000_000_000 + seq,
                payload: Bytes::from(vec![seq as u8; 4]),
            })
            .collect();
        let base = (i == 1).then(|| ChainHash::from_bytes([9; 32]));
        let head = base.unwrap_or(ChainHash::GENESIS).extend(&run);
        seals.push(RunSeal {
            key: key.public(),
            seal: Seal::sign(key, run[2].seq, head),
            base,
        });
        events.extend(run);
    }
    let floor = vv(&[(keys[1].stream().get(), 2)]);
    Frame::delta(
        2,
        Delta {
            floor_proofs: Default::default(),
            floor,
            events,
            seals,
        },
    )
}

/// The sections of a delta of [`frame_check::SECTIONS_PREFIX_RUNS`] runs
/// of streams 1 and 2, both sealed: a valid body for mode 3.
fn sealed_sections() -> Vec<u8> {
    let prefix = frame_check::sections_prefix();
    let Frame::Delta { number, mut delta } = frame::decode_payload(&prefix).unwrap() else {
        panic!("the prefix is a delta")
    };
    let key = WriterKey::from_bytes([1; 32]);
    delta.seals = [1, 2]
        .map(|stream| RunSeal {
            key: key.public(),
            seal: Seal::sign_for(&key, StreamId::new(stream), 2, ChainHash::GENESIS),
            base: (stream == 2).then_some(ChainHash::GENESIS),
        })
        .to_vec();
    let payload = frame::encode_payload(&Frame::delta(number, delta)).unwrap();
    payload[prefix.len()..].to_vec()
}

/// Hand-made inputs, each with what it must give. Mode byte first (see
/// `frame_check`): 0 stream of frames, 1 one payload, 2 payload after a
/// valid hello header, 3 a delta's sections after a valid delta of two
/// runs.
#[test]
fn hand_made_inputs_give_their_typed_errors() {
    type Expect = fn(&frame_check::Outcome) -> bool;
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        ("routes numbered 0", vec![1, 4, 0, 0, 0], |o| {
            matches!(
                &o.errors[..],
                [FrameError::Malformed { kind: "routes", .. }]
            )
        }),
        (
            "routes with quiet streams descending",
            vec![1, 4, 1, 2, 7, 2, 0],
            |o| {
                matches!(
                    &o.errors[..],
                    [FrameError::BadVector {
                        kind: "routes",
                        field: "quiet",
                        ..
                    }]
                )
            },
        ),
        (
            "routes with a stream both quiet and loud",
            vec![1, 4, 1, 1, 7, 1, 7],
            |o| matches!(&o.errors[..], [FrameError::Malformed { kind: "routes", detail }] if detail.contains("both")),
        ),
        (
            "routes claiming 2^32-1 quiet streams",
            vec![1, 4, 1, 0xff, 0xff, 0xff, 0xff, 0x0f],
            |o| matches!(&o.errors[..], [FrameError::BadVector { kind: "routes", field: "quiet", detail }] if detail.starts_with("4294967295 streams")),
        ),
        ("empty input", vec![], |o| {
            o.decoded == 0 && o.errors.is_empty()
        }),
        ("empty payload", vec![1], |o| {
            o.errors == [FrameError::Empty]
        }),
        ("prefix of 4 GiB", vec![0, 0xff, 0xff, 0xff, 0xff], |o| {
            matches!(
                o.errors[..],
                [FrameError::TooLarge {
                    len: 0xffff_ffff,
                    ..
                }]
            )
        }),
        (
            "prefix one above the limit",
            {
                let mut input = vec![0];
                input.extend(((FRAME_BYTES_MAX + 1) as u32).to_le_bytes());
                input
            },
            |o| matches!(o.errors[..], [FrameError::TooLarge { .. }]),
        ),
        (
            "prefix at the limit, payload missing",
            {
                let mut input = vec![0];
                input.extend((FRAME_BYTES_MAX as u32).to_le_bytes());
                input
            },
            |o| o.errors.is_empty() && o.decoded == 0,
        ),
        (
            "delta claiming 2^32-1 events in 7 bytes",
            vec![1, 1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f],
            |o| {
                o.errors
                    == [FrameError::TooManyEvents {
                        count: 0xffff_ffff,
                        max: DELTA_EVENTS_MAX,
                    }]
            },
        ),
        (
            "delta claiming one event more than the limit",
            // Mode 1; kind 1, number 1, empty floor, the count, a run of
            // that many events and each column one pair repeating 0.
            [vec![1], minimal_events(&[1, 1, 0], DELTA_EVENTS_MAX + 1, 0)].concat(),
            |o| {
                o.errors
                    == [FrameError::TooManyEvents {
                        count: DELTA_EVENTS_MAX + 1,
                        max: DELTA_EVENTS_MAX,
                    }]
            },
        ),
        // A delta's runs and columns (mode 1, kind 1, number 1, an empty
        // floor, then the events).
        (
            "delta of the limit's 8,192 empty events in 18 bytes",
            [vec![1], minimal_events(&[1, 1, 0], DELTA_EVENTS_MAX, 0)].concat(),
            |o| o.decoded == 1 && o.errors.is_empty(),
        ),
        (
            "delta column whose repeat runs past the count",
            vec![1, 1, 1, 0, 2, 1, 1, 2, 0, 0],
            |o| matches!(&o.errors[..], [FrameError::Malformed { kind: "delta", detail }] if detail.contains("a repeat run of 3 where 2")),
        ),
        (
            "delta column whose literal run runs past the count",
            vec![1, 1, 1, 0, 1, 1, 1, 1, 3, 0, 0],
            |o| matches!(&o.errors[..], [FrameError::Malformed { kind: "delta", detail }] if detail.contains("a literal run of 2 where 1")),
        ),
        (
            "delta column of two literal runs in a row",
            vec![1, 1, 1, 0, 2, 1, 1, 2, 1, 0, 1, 0],
            |o| matches!(&o.errors[..], [FrameError::Malformed { kind: "delta", detail }] if detail.contains("two literal runs")),
        ),
        (
            "delta column of three equal values in a literal run",
            vec![1, 1, 1, 0, 3, 1, 1, 3, 5, 0, 0, 0],
            |o| matches!(&o.errors[..], [FrameError::Malformed { kind: "delta", detail }] if detail.contains("three equal values")),
        ),
        (
            "delta payload longer than what is left",
            vec![1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 5, b'a'],
            |o| {
                o.errors
                    == [FrameError::CountAboveBytes {
                        field: "payloads",
                        count: 5,
                        bytes_left: 1,
                    }]
            },
        ),
        (
            "delta run of two events from seq u64::MAX",
            {
                let mut input = vec![1, 1, 1, 0, 2, 1];
                input.extend([0xff; 9]);
                input.extend([0x01, 2, 0, 2, 0, 2, 0, 2]);
                input
            },
            |o| {
                o.errors
                    == [FrameError::SeqOverflow {
                        stream: StreamId::new(1),
                        first_seq: u64::MAX,
                        count: 2,
                    }]
            },
        ),
        (
            "delta run ending at seq u64::MAX",
            {
                let mut input = vec![1, 1, 1, 0, 2, 1, 0xfe];
                input.extend([0xff; 8]);
                input.extend([0x01, 2, 3, 0, 0, 3, 0, 0, 3, 0, 0]);
                input
            },
            |o| o.decoded == 1 && o.errors.is_empty(),
        ),
        (
            "delta event stamped u64::MAX, then one more in its run",
            {
                // Gap u64::MAX - 1 above 0, plus one: u64::MAX; then gap 0
                // (a literal run of both).
                let mut input = vec![1, 1, 1, 0, 2, 7, 1, 2, 3, 0xfe];
                input.extend([0xff; 8]);
                input.extend([0x01, 0, 3, 0, 0, 3, 0, 0]);
                input
            },
            |o| {
                o.errors
                    == [FrameError::LamportOverflow {
                        stream: StreamId::new(7),
                        seq: 2,
                    }]
            },
        ),
        (
            "delta event whose lamport gap alone overflows",
            {
                let mut input = vec![1, 1, 1, 0, 1, 7, 1, 1, 1];
                input.extend([0xff; 9]);
                input.extend([0x01, 1, 0, 1, 0]);
                input
            },
            |o| {
                o.errors
                    == [FrameError::LamportOverflow {
                        stream: StreamId::new(7),
                        seq: 1,
                    }]
            },
        ),
        (
            "delta with lamport gaps of 0 (stamps 1 and 2)",
            vec![1, 1, 1, 0, 2, 1, 1, 2, 3, 0, 0, 3, 0, 0, 3, 0, 0],
            |o| o.decoded == 1 && o.errors.is_empty(),
        ),
        (
            "delta with two adjacent runs of one stream, seqs contiguous",
            vec![1, 1, 1, 0, 2, 1, 1, 1, 1, 2, 1, 0, 2, 0, 2, 0, 2],
            |o| {
                matches!(
                    &o.errors[..],
                    [FrameError::BadRun { stream, .. }] if *stream == StreamId::new(1)
                )
            },
        ),
        (
            "delta with runs of descending streams",
            vec![1, 1, 1, 0, 2, 2, 1, 1, 1, 1, 1, 0, 2, 0, 2, 0, 2],
            |o| {
                matches!(
                    &o.errors[..],
                    [FrameError::BadRun { stream, .. }] if *stream == StreamId::new(1)
                )
            },
        ),
        (
            "delta with an empty run",
            vec![1, 1, 1, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0, 1],
            |o| matches!(&o.errors[..], [FrameError::BadRun { detail, .. }] if detail.contains("no events")),
        ),
        (
            "delta run of more events than the delta's count",
            vec![1, 1, 1, 0, 1, 1, 1, 2, 0, 2, 0, 2, 0, 2],
            |o| matches!(&o.errors[..], [FrameError::BadRun { detail, .. }] if detail.contains("leaves 1")),
        ),
        (
            "delta with a byte after its payloads: a section cut short",
            vec![1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 9],
            |o| {
                matches!(&o.errors[..], [FrameError::Malformed { kind: "delta", detail }]
                    if detail.contains("section length"))
            },
        ),
        (
            "a sealed delta of two runs",
            {
                let mut input = vec![1];
                input.extend(frame::encode_payload(&sealed_delta()).unwrap());
                input
            },
            |o| o.decoded == 1 && o.errors.is_empty(),
        ),
        (
            "sections: an unknown one, skipped",
            vec![3, 9, 2, 0xff, 0xff],
            |o| o.decoded == 1 && o.errors.is_empty(),
        ),
        (
            "sections: the same tag twice",
            vec![3, 9, 0, 9, 0],
            |o| matches!(&o.errors[..], [FrameError::Malformed { detail, .. }] if detail.contains("section 9 follows section 9")),
        ),
        ("sections: a length past the frame", vec![3, 9, 5, 1], |o| {
            o.errors
                == [FrameError::CountAboveBytes {
                    field: "section",
                    count: 5,
                    bytes_left: 1,
                }]
        }),
        (
            "seals: more than the delta's runs",
            vec![3, 0, 1, 3],
            |o| matches!(&o.errors[..], [FrameError::Malformed { detail, .. }] if detail.contains("3 seals for 2 runs")),
        ),
        (
            "seals: two announced in a few bytes",
            vec![3, 0, 2, 2, 0],
            |o| {
                o.errors
                    == [FrameError::CountAboveBytes {
                        field: "seals",
                        count: 2,
                        bytes_left: 1,
                    }]
            },
        ),
        (
            "seals: the two seals of mode 3, valid",
            {
                let mut input = vec![3];
                input.extend(sealed_sections());
                input
            },
            |o| o.decoded == 1 && o.errors.is_empty(),
        ),
        (
            "seals: a key of small order",
            {
                let mut input = vec![3];
                input.extend(sealed_sections());
                // Tag, a length of two bytes, the count; then the key:
                // the identity point's encoding.
                let mut identity = [0u8; 32];
                identity[0] = 1;
                input[5..37].copy_from_slice(&identity);
                input
            },
            |o| matches!(&o.errors[..], [FrameError::BadSeal { stream, .. }] if stream.get() == 1),
        ),
        (
            "seals: a base flag of 2",
            {
                let mut input = vec![3];
                input.extend(sealed_sections());
                input[5 + 144] = 2;
                input
            },
            |o| matches!(&o.errors[..], [FrameError::BadSeal { detail, .. }] if detail.contains("base flag of 2")),
        ),
        (
            "hello claiming 2^32-1 marks",
            vec![2, 0x0b, 0xff, 0xff, 0xff, 0xff, 0x0f],
            |o| {
                matches!(
                    o.errors[..],
                    [FrameError::BadVector {
                        kind: "hello",
                        field: "marks",
                        ..
                    }]
                )
            },
        ),
        (
            "heartbeat claiming one stream more than a vector holds",
            {
                // Kind 3, received 0, seen 0, marks 1 from 0, the count of
                // changes, and one entry.
                let mut input = vec![1, 3, 0, 0, 1, 1];
                input.extend(postcard::to_stdvec(&(STREAMS_MAX as u64 + 1)).unwrap());
                input.extend([1, 1]);
                input
            },
            |o| {
                matches!(
                    o.errors[..],
                    [FrameError::BadVector {
                        kind: "heartbeat",
                        field: "changes",
                        ..
                    }]
                )
            },
        ),
        (
            "hello announcing a frame limit below the 4 MiB every peer takes",
            vec![1, 0, 4, 0x0b, 0, 0, 0xff, 0xff, 0xff, 0x01],
            |o| matches!(&o.errors[..], [FrameError::Malformed { kind: "hello", detail }] if detail.contains("4194303 bytes, below")),
        ),
        (
            "hello announcing a frame limit of 1 GiB",
            vec![1, 0, 4, 0x0b, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x04],
            |o| o.decoded == 1 && o.errors.is_empty(),
        ),
        ("hello of protocol version 5", vec![1, 0, 5], |o| {
            matches!(
                o.errors[..],
                [FrameError::ProtocolVersion { theirs: 5, ours: 4 }]
            )
        }),
        (
            "hello of protocol version 3, as v3 wrote it",
            vec![1, 0, 3, 0x0b, 1, 0x0b, 1, 0, 0x80, 0x80, 0x80, 0x02],
            |o| {
                matches!(
                    o.errors[..],
                    [FrameError::ProtocolVersion { theirs: 3, ours: 4 }]
                )
            },
        ),
        (
            "hello of protocol version 2, as v2 wrote it",
            vec![1, 0, 2, 0x0b, 1, 0x0b, 1, 0],
            |o| {
                matches!(
                    o.errors[..],
                    [FrameError::ProtocolVersion { theirs: 2, ours: 4 }]
                )
            },
        ),
        (
            "hello of protocol version 1, as v1 wrote it",
            vec![1, 0, 1, 0x0b, 1, 0x0b, 1, 0],
            |o| {
                matches!(
                    o.errors[..],
                    [FrameError::ProtocolVersion { theirs: 1, ours: 4 }]
                )
            },
        ),
        (
            "v1 ack: its marks read as a receipt cut short",
            vec![1, 2, 1, 1, 5],
            |o| matches!(o.errors[..], [FrameError::Malformed { kind: "ack", .. }]),
        ),
        (
            "delta number 0",
            vec![1, 1, 0, 0, 0],
            |o| matches!(&o.errors[..], [FrameError::Malformed { kind: "delta", detail }] if detail.contains("number 0")),
        ),
        (
            "ack whose base is above its number",
            vec![1, 2, 0, 0, 1, 2, 0],
            |o| matches!(&o.errors[..], [FrameError::Malformed { kind: "ack", detail }] if detail.contains("below 0")),
        ),
        (
            "ack of marks number 0",
            vec![1, 2, 0, 0, 0, 0, 0],
            |o| matches!(&o.errors[..], [FrameError::Malformed { kind: "ack", detail }] if detail.contains("number 0")),
        ),
        (
            "heartbeat of unchanged marks carrying changes",
            vec![1, 3, 0, 0, 1, 0, 1, 1, 1],
            |o| matches!(&o.errors[..], [FrameError::Malformed { kind: "heartbeat", detail }] if detail.contains("their own base")),
        ),
        (
            "hello with a version above u16",
            vec![1, 0, 0xff, 0xff, 0x7f],
            |o| matches!(o.errors[..], [FrameError::Malformed { kind: "hello", .. }]),
        ),
        // Kinds 6 and 7 are the checkpoint frames, 8 the statement: 9 is
        // the first unknown.
        ("unknown kind", vec![1, 10], |o| {
            matches!(o.errors[..], [FrameError::UnknownKind { tag: 10, .. }])
        }),
        ("statement frame without its statement", vec![1, 8], |o| {
            matches!(
                o.errors[..],
                [FrameError::Malformed {
                    kind: "statement",
                    ..
                }]
            )
        }),
        (
            "bare ack of delta 0",
            vec![1, 5, 0],
            |o| matches!(&o.errors[..], [FrameError::Malformed { kind: "bare ack", detail }] if detail.contains("received 0")),
        ),
        (
            "overlong kind varint",
            vec![1, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            |o| matches!(o.errors[..], [FrameError::Malformed { kind: "frame", .. }]),
        ),
        (
            "heartbeat with trailing bytes",
            vec![1, 3, 0, 0, 1, 0, 0, 9, 9],
            |o| {
                matches!(
                    o.errors[..],
                    [FrameError::TrailingBytes {
                        kind: "heartbeat",
                        len: 2
                    }]
                )
            },
        ),
        (
            "ack with descending streams",
            vec![1, 2, 0, 0, 1, 1, 2, 5, 1, 3, 1],
            |o| {
                matches!(
                    o.errors[..],
                    [FrameError::BadVector {
                        kind: "ack",
                        field: "changes",
                        ..
                    }]
                )
            },
        ),
        (
            "ack with a repeated stream",
            vec![1, 2, 0, 0, 1, 1, 2, 5, 1, 5, 2],
            |o| matches!(o.errors[..], [FrameError::BadVector { .. }]),
        ),
        (
            "hello whose floor has a zero seq",
            vec![2, 7, 0, 1, 3, 0, 0x80, 0x80, 0x80, 0x02],
            |o| {
                matches!(
                    o.errors[..],
                    [FrameError::BadVector {
                        kind: "hello",
                        field: "floor",
                        ..
                    }]
                )
            },
        ),
        (
            "valid hello after the helped header",
            vec![2, 7, 1, 7, 1, 0, 0x80, 0x80, 0x80, 0x02],
            |o| o.decoded == 1,
        ),
        (
            "two frames in a stream, the second cut short",
            {
                let mut input = vec![0];
                input.extend(frame::encode(&valid_frames()[2]).unwrap());
                let second = frame::encode(&valid_frames()[1]).unwrap();
                input.extend(&second[..second.len() - 1]);
                input
            },
            |o| o.decoded == 1 && o.errors.is_empty(),
        ),
    ];
    for (name, input, expect) in cases {
        let outcome = check(name, &input);
        assert!(expect(&outcome), "{name}: unexpected outcome {outcome:?}");
    }
}

/// A payload of `count` minimal events after `head`: one run of stream 1
/// from seq 1, every event a lamport gap of 0, a time of 0 (the first) or
/// a difference of 0, and an empty payload: 3 bytes each.
fn minimal_events(head: &[u8], count: usize, payload_len: u8) -> Vec<u8> {
    // One run (stream 1 from seq 1), each column one repeat of `count`
    // values (gaps 0, times 0, lengths `payload_len`), then the payloads.
    let count_bytes = postcard::to_stdvec(&(count as u64)).unwrap();
    let repeat_bytes = postcard::to_stdvec(&(2 * (count as u64 - 3))).unwrap();
    let mut payload = head.to_vec();
    payload.extend(&count_bytes);
    payload.extend([1, 1]);
    payload.extend(&count_bytes);
    for value in [0, 0, payload_len] {
        payload.extend(&repeat_bytes);
        payload.push(value);
    }
    payload.extend(std::iter::repeat_n(0u8, usize::from(payload_len) * count));
    payload
}

/// Found in review: a delta of minimal events filling a 4 MiB frame decoded
/// into about 800,000 events (50 to 100 MB, for each inbound session at
/// once). Now its count is refused before anything is decoded for its
/// events: the peak of live heap bytes stays within the slack, whatever the
/// frame's length. (The old decoder held over 50 MB here; here the frame
/// claims some 1,400,000 events of 3-byte payloads.)
#[test]
fn a_frame_full_of_minimal_events_is_refused_by_its_count_in_constant_memory() {
    let count = (FRAME_BYTES_MAX - 27) / 3;
    // Kind 1 (delta), number 1, an empty floor, then the events.
    let payload = minimal_events(&[1, 1, 0], count, 3);
    assert!(payload.len() <= FRAME_BYTES_MAX, "{} bytes", payload.len());
    let (decoded, peak) = peak_of(|| frame::decode_payload(&payload));
    assert_eq!(
        decoded,
        Err(FrameError::TooManyEvents {
            count,
            max: DELTA_EVENTS_MAX
        })
    );
    assert!(peak <= ALLOC_SLACK, "refusing it held {peak} heap bytes");

    // A vector: an ack of 2-byte entries filling the frame.
    // (Kind 2, received 0, seen 0, marks 1 from 0, then the changes.)
    let entries = (FRAME_BYTES_MAX - 8) / 2;
    let mut payload = vec![2, 0, 0, 1, 1];
    payload.extend(postcard::to_stdvec(&(entries as u64)).unwrap());
    payload.extend(std::iter::repeat_n([1u8, 1], entries).flatten());
    let (decoded, peak) = peak_of(|| frame::decode_payload(&payload));
    assert!(
        matches!(decoded, Err(FrameError::BadVector { kind: "ack", .. })),
        "{decoded:?}"
    );
    assert!(peak <= ALLOC_SLACK, "refusing it held {peak} heap bytes");
}

/// The most a delta frame decodes into: `DELTA_EVENTS_MAX` empty events
/// (the receiver takes what a sender may send), written in 18 bytes since
/// each column repeats one value, decode into 512 KiB of events reserved
/// once, and nothing more: the bound is the count's, not the frame's size.
#[test]
fn a_delta_at_the_event_limit_decodes_within_a_bounded_size() {
    let payload = minimal_events(&[1, 1, 0], DELTA_EVENTS_MAX, 0);
    assert_eq!(payload.len(), 18);
    let (decoded, peak) = peak_of(|| frame::decode_payload(&payload));
    let Ok(Frame::Delta { delta, .. }) = decoded else {
        panic!("{decoded:?}");
    };
    assert_eq!(delta.events.len(), DELTA_EVENTS_MAX);
    assert!(
        peak <= DELTA_EVENTS_BYTES + 1024,
        "decoding it held {peak} heap bytes"
    );
}

/// Replays `fuzz/regressions/frame_decode/`, where `fuzz/smoke.sh` copies
/// crashers of the fuzz target (none so far; the folder may not exist yet).
#[test]
fn fuzz_regressions_replay_clean() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/frame_decode");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    for path in paths {
        let bytes = std::fs::read(&path).unwrap();
        check(&path.display().to_string(), &bytes);
    }
}

#[test]
fn random_and_mutated_inputs_decode_totally_in_bounded_memory() {
    let encoded: Vec<Vec<u8>> = valid_frames()
        .iter()
        .map(|f| frame::encode(f).unwrap())
        .collect();
    let sections = sealed_sections();
    testkit::for_each_seed("random_and_mutated_inputs", 0xf4, 4, |seed| {
        let mut rng = SplitMix64::new(seed);
        for round in 0..3000 {
            let mut input = vec![rng.below(4) as u8];
            if input[0] == 3 {
                // Mode 3: a delta's sections, the valid seals mutated.
                let mut body = sections.clone();
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(body.len() as u64) as usize;
                    match rng.below(3) {
                        0 if at < body.len() => body[at] = rng.next_u64() as u8,
                        1 => body.truncate(at),
                        _ => body.insert(at, rng.next_u64() as u8),
                    }
                }
                input.extend(body);
            } else if rng.chance(0.3) {
                let len = rng.below(64) as usize;
                input.extend((0..len).map(|_| rng.next_u64() as u8));
            } else {
                let valid = &encoded[rng.below(encoded.len() as u64) as usize];
                // Mode 0 takes the prefix, modes 1 and 2 the payload.
                let skip = if input[0] == 0 {
                    0
                } else {
                    frame::LENGTH_PREFIX_BYTES
                };
                let mut body = valid[skip..].to_vec();
                for _ in 0..1 + rng.below(4) {
                    match rng.below(4) {
                        0 if !body.is_empty() => {
                            let at = rng.below(body.len() as u64) as usize;
                            body[at] = rng.next_u64() as u8;
                        }
                        1 if !body.is_empty() => {
                            body.truncate(rng.below(body.len() as u64) as usize)
                        }
                        2 => body.push(rng.next_u64() as u8),
                        _ => {
                            let at = rng.below(body.len() as u64 + 1) as usize;
                            body.insert(at, 0xff);
                        }
                    }
                }
                input.extend(body);
            }
            check(&format!("seed {seed} round {round}"), &input);
        }
    });
}

/// An arbitrary frame, and what it decodes to: itself, but for a delta's
/// events, which come back grouped by stream (`(stream, seq)` order).
#[derive(Debug, Clone)]
struct AnyFrame {
    frame: Frame,
    decoded: Frame,
}

fn any_vector(g: &mut Gen) -> VersionVector {
    Vec::<(u64, u64)>::arbitrary(g)
        .into_iter()
        .map(|(s, seq)| (StreamId::new(s), seq))
        .collect()
}

/// Routes: streams drawn at random, each either quiet or loud.
fn any_routes(g: &mut Gen) -> Routes {
    let mut streams = Vec::<u64>::arbitrary(g);
    streams.sort_unstable();
    streams.dedup();
    let (mut quiet, mut loud) = (Vec::new(), Vec::new());
    for stream in streams {
        if bool::arbitrary(g) {
            quiet.push(StreamId::new(stream));
        } else {
            loud.push(StreamId::new(stream));
        }
    }
    Routes {
        number: u64::arbitrary(g).max(1),
        quiet,
        loud,
    }
}

/// A number below `n` (n > 0).
fn below(g: &mut Gen, n: u64) -> u64 {
    u64::arbitrary(g) % n
}

/// A delta the model allows, its streams interleaved at random: per stream
/// a run of contiguous seqs (some ending at `u64::MAX`) with lamport stamps
/// rising by gaps small and huge (some reaching `u64::MAX`), times anywhere
/// in the `u64` range or a few milliseconds apart, either way.
fn any_model_delta(g: &mut Gen) -> Delta {
    let mut streams: Vec<u64> = Vec::<u64>::arbitrary(g);
    streams.truncate(8);
    streams.sort_unstable();
    streams.dedup();
    let mut time_ms = u64::arbitrary(g);
    let mut runs: Vec<std::collections::VecDeque<Event>> = Vec::new();
    for stream in streams {
        let len = 1 + below(g, 6);
        let first_seq = match below(g, 4) {
            0 => u64::MAX - (len - 1),
            1 => 1 + below(g, 1000),
            _ => u64::arbitrary(g).min(u64::MAX - (len - 1)),
        };
        let mut lamport = 0u64;
        let mut run = std::collections::VecDeque::new();
        for seq in first_seq..=first_seq + (len - 1) {
            let gap = match below(g, 4) {
                0 => u64::arbitrary(g),
                1 => 0,
                _ => below(g, 300),
            };
            let Some(next) = lamport.checked_add(1).and_then(|l| l.checked_add(gap)) else {
                // Up to u64::MAX, then the run ends.
                if lamport == u64::MAX {
                    break;
                }
                lamport = u64::MAX;
                run.push_back(any_event(g, stream, seq, lamport, &mut time_ms));
                break;
            };
            lamport = next;
            run.push_back(any_event(g, stream, seq, lamport, &mut time_ms));
        }
        runs.push(run);
    }
    // An arbitrary interleaving that keeps each stream's order.
    let mut events = Vec::new();
    loop {
        runs.retain(|run| !run.is_empty());
        if runs.is_empty() {
            break;
        }
        let at = below(g, runs.len() as u64) as usize;
        events.extend(runs[at].pop_front());
    }
    // Some runs sealed, at their last seq, streams ascending: what a
    // replica sends (the decoder judges only the structure, so the hash and
    // the signature are any bytes, under a valid key).
    let mut seals: Vec<RunSeal> = Vec::new();
    let mut streams: Vec<(StreamId, u64)> = Vec::new();
    for event in &events {
        match streams
            .iter_mut()
            .find(|(stream, _)| *stream == event.stream)
        {
            Some(last) => last.1 = last.1.max(event.seq),
            None => streams.push((event.stream, event.seq)),
        }
    }
    streams.sort_unstable();
    for (stream, last) in streams {
        if below(g, 2) == 0 {
            continue;
        }
        let key = WriterKey::from_bytes([1 + below(g, 3) as u8; 32]);
        seals.push(RunSeal {
            key: key.public(),
            seal: Seal {
                stream,
                seq: last,
                head: ChainHash::from_bytes([u8::arbitrary(g); 32]),
                signature: [u8::arbitrary(g); 64],
            },
            base: bool::arbitrary(g).then(|| ChainHash::from_bytes([u8::arbitrary(g); 32])),
        });
    }
    Delta {
        floor_proofs: Default::default(),
        floor: any_vector(g),
        events,
        seals,
    }
}

fn any_event(g: &mut Gen, stream: u64, seq: u64, lamport: u64, time_ms: &mut u64) -> Event {
    *time_ms = match below(g, 3) {
        0 => u64::arbitrary(g),
        1 => time_ms.wrapping_add(below(g, 50)),
        _ => time_ms.wrapping_sub(below(g, 50)),
    };
    Event {
        stream: StreamId::new(stream),
        seq,
        lamport,
        time_ms: *time_ms,
        payload: Bytes::from(Vec::<u8>::arbitrary(g)),
    }
}

/// What a delta decodes to: its events grouped by stream, in `(stream,
/// seq)` order.
fn in_stream_order(delta: &Delta) -> Delta {
    let mut events = delta.events.clone();
    events.sort_by_key(|event| (event.stream, event.seq));
    Delta {
        floor_proofs: Default::default(),
        floor: delta.floor.clone(),
        events,
        seals: delta.seals.clone(),
    }
}

/// A receipt a sender may send: marks numbered from 1, a base at most
/// the number, changes only when the base is another number.
fn any_receipt(g: &mut Gen) -> Receipt {
    let number = u64::arbitrary(g).max(1);
    let base = match u8::arbitrary(g) % 3 {
        0 => number,
        1 => 0,
        _ => u64::arbitrary(g) % number,
    };
    let changes = if base == number {
        VersionVector::new()
    } else {
        any_vector(g)
    };
    Receipt {
        received: u64::arbitrary(g),
        seen: u64::arbitrary(g),
        marks: MarksDiff {
            number,
            base,
            changes,
        },
    }
}

impl Arbitrary for AnyFrame {
    fn arbitrary(g: &mut Gen) -> Self {
        let frame = match u8::arbitrary(g) % 6 {
            0 => Frame::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                stream: StreamId::new(u64::arbitrary(g)),
                marks: any_vector(g),
                floor: any_vector(g),
                frame_bytes_max: FRAME_BYTES_MAX as u32 + u32::arbitrary(g) % 1024,
            }),
            1 => Frame::delta(u64::arbitrary(g).max(1), any_model_delta(g)),
            2 => Frame::Ack(any_receipt(g)),
            3 => Frame::Heartbeat(any_receipt(g)),
            4 => Frame::Routes(any_routes(g)),
            _ => Frame::BareAck(1 + u64::arbitrary(g) / 2),
        };
        let decoded = match &frame {
            Frame::Delta { number, delta } => Frame::delta(*number, in_stream_order(delta)),
            other => other.clone(),
        };
        AnyFrame { frame, decoded }
    }
}

#[test]
fn arbitrary_frames_round_trip() {
    fn round_trip(any: AnyFrame) -> bool {
        let bytes = frame::encode(&any.frame).unwrap();
        let Ok(Some((payload, used))) = frame::split_frame(&bytes) else {
            return false;
        };
        used == bytes.len()
            && frame::decode_payload(payload) == Ok(any.decoded.clone())
            && frame::decode(&bytes) == Ok(any.decoded)
    }
    // Seeded like every randomized test here: a failure prints its seed.
    testkit::for_each_seed("arbitrary_frames_round_trip", 0xf4a3e, 1, |seed| {
        QuickCheck::new()
            .rng(Gen::from_size_and_seed(100, seed))
            .tests(500)
            .quickcheck(round_trip as fn(AnyFrame) -> bool);
    });
}

/// Arbitrary events, most of them breaking the model (holes, repeats,
/// seqs out of order, lamport stamps standing still or falling, stamps of
/// 0), beside a reference model of what the layout carries: per stream, in
/// the order given, contiguous seqs and lamport stamps rising from 1.
/// Encoding succeeds exactly when the model says so, and what it encodes
/// decodes to the events in `(stream, seq)` order.
#[test]
fn arbitrary_events_encode_exactly_when_the_model_allows() {
    fn model_allows(events: &[Event]) -> bool {
        let mut last: std::collections::HashMap<StreamId, (u64, u64)> = Default::default();
        events.iter().all(|event| {
            let ok = match last.get(&event.stream) {
                None => event.lamport >= 1,
                Some(&(seq, lamport)) => {
                    seq.checked_add(1) == Some(event.seq) && event.lamport > lamport
                }
            };
            last.insert(event.stream, (event.seq, event.lamport));
            ok
        })
    }
    /// Small streams, seqs and stamps, so that valid runs are common.
    fn events_of(raw: Vec<(u8, u8, u8, u64, Vec<u8>)>) -> Vec<Event> {
        raw.into_iter()
            .map(|(stream, seq, lamport, time_ms, payload)| Event {
                stream: StreamId::new(u64::from(stream % 4)),
                seq: u64::from(seq % 8),
                lamport: u64::from(lamport % 16),
                time_ms,
                payload: Bytes::from(payload),
            })
            .collect()
    }
    testkit::for_each_seed(
        "arbitrary_events_encode_exactly_when_the_model_allows",
        0xe7e7,
        1,
        |seed| {
            let mut allowed = 0;
            let mut gen = Gen::from_size_and_seed(6, seed);
            for _ in 0..2000 {
                let raw = Vec::<(u8, u8, u8, u64, Vec<u8>)>::arbitrary(&mut gen);
                let delta = Delta {
                    floor_proofs: Default::default(),
                    floor: VersionVector::new(),
                    events: events_of(raw),
                    seals: Vec::new(),
                };
                let allows = model_allows(&delta.events);
                allowed += usize::from(allows);
                match frame::encode(&Frame::delta(1, delta.clone())) {
                    Ok(bytes) => {
                        assert!(allows, "seed {seed}: encoded {delta:?}");
                        assert_eq!(
                            frame::decode(&bytes),
                            Ok(Frame::delta(1, in_stream_order(&delta))),
                            "seed {seed}"
                        );
                    }
                    Err(FrameError::Encode { kind: "delta", .. }) => {
                        assert!(!allows, "seed {seed}: refused {delta:?}");
                    }
                    Err(error) => panic!("seed {seed}: {error} for {delta:?}"),
                }
            }
            // Both sides of the property were exercised.
            assert!(allowed > 100, "only {allowed} of 2000 allowed");
            assert!(allowed < 1900, "{allowed} of 2000 allowed");
        },
    );
}

/// A decoded delta's payloads are slices of one buffer. An event the
/// receiver keeps pending (above a hole) copies its payload out, so that a
/// few bytes held for later do not keep the whole frame alive: after the
/// delta is dropped, what the replica still holds is about that event, not
/// the frame's 100 KiB of payloads.
#[test]
fn an_event_kept_pending_does_not_keep_its_frame_alive() {
    use meshlog_replica::Replica;
    let x = StreamId::new(7);
    let mut writer = Replica::new(x);
    for i in 0..100u8 {
        writer.append_at(Bytes::from(vec![i; 1024]), 1_000).unwrap();
    }
    let mut receiver = Replica::new(StreamId::new(9));
    receiver
        .apply(&writer.delta_for(&VersionVector::new(), usize::MAX))
        .unwrap();
    // The writer's 100 events again (duplicates), and seq 2 of a third
    // stream, whose seq 1 the receiver lacks.
    let mut events = writer.delta_for(&VersionVector::new(), usize::MAX).events;
    events.push(Event {
        stream: StreamId::new(11),
        seq: 2,
        lamport: 500,
        time_ms: 1_000,
        payload: Bytes::from_static(b"early"),
    });
    let bytes = frame::encode(&Frame::delta(
        1,
        Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events,
            seals: Vec::new(),
        },
    ))
    .unwrap();
    let (report, measured) = alloc::measure(|| {
        let Ok(Frame::Delta { delta, .. }) = frame::decode(&bytes) else {
            panic!("a delta");
        };
        receiver.apply(&delta).unwrap()
    });
    assert_eq!((report.duplicates, report.pending), (100, 1), "{report:?}");
    assert!(
        measured.bytes_net < 16 * 1024,
        "the pending event keeps {} bytes alive",
        measured.bytes_net
    );
}

/// Found by `fuzz/smoke.sh` (`minimized-from-8fd6e…`): the first protocol 3
/// decoder reserved its 512 KiB of events as soon as it read the count, so
/// a 5-byte delta announcing 8,192 events, or one whose columns are broken,
/// cost 512 KiB before being refused. Now the run headers, the columns and
/// the payloads are checked before anything is allocated for the events:
/// refusing these takes no more than the slack.
#[test]
fn a_malformed_delta_allocates_nothing_for_the_events_it_claims() {
    let count = postcard::to_stdvec(&(DELTA_EVENTS_MAX as u64)).unwrap();
    // A repeat of the whole count, and one of a value more.
    let repeat = postcard::to_stdvec(&(2 * (DELTA_EVENTS_MAX as u64 - 3))).unwrap();
    let past = postcard::to_stdvec(&(2 * (DELTA_EVENTS_MAX as u64 - 2))).unwrap();
    // Kind 1, number 1, no floor, the count, then: nothing; one run and no
    // columns; one run and a gaps column repeating past the count; the
    // columns and a payload length past the end.
    let mut cases: Vec<Vec<u8>> = Vec::new();
    for tail in [
        vec![],
        [vec![1, 1], count.clone()].concat(),
        [vec![1, 1], count.clone(), past, vec![0]].concat(),
        [
            vec![1, 1],
            count.clone(),
            repeat.clone(),
            vec![0],
            repeat.clone(),
            vec![0],
            repeat.clone(),
            vec![1],
        ]
        .concat(),
    ] {
        cases.push([vec![1, 1, 0], count.clone(), tail].concat());
    }
    for payload in &cases {
        let (decoded, peak) = peak_of(|| frame::decode_payload(payload));
        assert!(decoded.is_err(), "{payload:02x?}: {decoded:?}");
        assert!(
            peak <= ALLOC_SLACK,
            "refusing {payload:02x?} ({decoded:?}) held {peak} heap bytes"
        );
    }
}

/// The fuzz regressions of delta sections 1 and 2 (statements, floor
/// hashes; `docs/PROTOCOL.md`, "Delta sections"), hand-made in mode 3 (the
/// prefix's floor names streams 1 and 2): each with its outcome.
#[test]
fn the_floor_proof_regressions_have_their_outcomes() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/frame_decode");
    let malformed = |detail: &'static str| move |o: &frame_check::Outcome| matches!(&o.errors[..], [FrameError::Malformed { detail: d, .. }] if d.contains(detail));
    type Expect = Box<dyn Fn(&frame_check::Outcome) -> bool>;
    let decodes: Expect = Box::new(|o| o.decoded == 1 && o.errors.is_empty());
    let cases: Vec<(&str, Expect)> = vec![
        ("statements-one-valid-entry", decodes),
        (
            "statements-count-above-floor",
            Box::new(malformed("one per stream of the floor at most")),
        ),
        (
            "statements-stream-not-in-floor",
            Box::new(malformed("which the delta's floor does not name")),
        ),
        (
            "statements-not-ascending",
            Box::new(malformed("streams strictly ascending")),
        ),
        (
            "statements-signer-not-a-key",
            Box::new(malformed("compaction signer")),
        ),
        (
            "floor-hashes-one-entry",
            Box::new(|o| o.decoded == 1 && o.errors.is_empty()),
        ),
        (
            "floor-hashes-body-short",
            Box::new(malformed("1 entries of 40 bytes in a body of 39")),
        ),
    ];
    for (name, expect) in cases {
        let bytes = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let outcome = check(name, &bytes);
        assert!(expect(&outcome), "{name}: {outcome:?}");
    }
}
