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
//! - quickcheck: arbitrary frames encode, split and decode to themselves.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;

use bytes::Bytes;
use meshlog_cursor::token::STREAMS_MAX;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Event};
use meshlog_sync::frame::{self, Frame, Hello};
use meshlog_sync::testkit::{self, frame_check, SplitMix64};
use meshlog_sync::{FrameError, DELTA_EVENTS_MAX, FRAME_BYTES_MAX, PROTOCOL_VERSION};
use quickcheck::{Arbitrary, Gen, QuickCheck};

/// Live heap bytes allowed per input byte, plus `ALLOC_SLACK`. The largest
/// cost per byte: a decoded event (64 bytes in memory) from 5 input bytes,
/// held in a vector that may have doubled, then re-encoded by the checks.
const ALLOC_PER_BYTE: i64 = 64;
const ALLOC_SLACK: i64 = 16 * 1024;

struct Counting;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn count(delta: i64) {
    // `try_with`: the allocator may run while a thread's locals are torn down.
    let _ = LIVE.try_with(|live| {
        live.set(live.get() + delta);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
    });
}

// SAFETY: forwards every call to the system allocator unchanged; it only
// counts bytes on the side, in const-initialized thread locals that never
// allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            count(layout.size() as i64);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            count(new_size as i64);
            count(-(layout.size() as i64));
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `work` and returns its output with the peak of live heap bytes on
/// this thread while it ran, above what was live before.
fn peak_of<T>(work: impl FnOnce() -> T) -> (T, i64) {
    let before = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(before));
    let out = work();
    (out, PEAK.with(Cell::get) - before)
}

/// Runs the fuzz target's checks on `data` and asserts the memory bound.
fn check(name: &str, data: &[u8]) -> frame_check::Outcome {
    let (outcome, peak) = peak_of(|| frame_check::check_input(data));
    let bound = ALLOC_PER_BYTE * data.len() as i64 + ALLOC_SLACK;
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
        }),
        Frame::Delta(Delta {
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
        }),
        Frame::Ack {
            marks: vv(&[(2, 1), (3, 300)]),
        },
        Frame::Heartbeat {
            marks: VersionVector::new(),
        },
    ]
}

/// Hand-made inputs, each with what it must give. Mode byte first (see
/// `frame_check`): 0 stream of frames, 1 one payload, 2 payload after a
/// valid hello header.
#[test]
fn hand_made_inputs_give_their_typed_errors() {
    type Expect = fn(&frame_check::Outcome) -> bool;
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
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
            vec![1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f],
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
            {
                // Kind 1, empty floor, the count, and one minimal event.
                let mut input = vec![1, 1, 0];
                input.extend(postcard::to_stdvec(&(DELTA_EVENTS_MAX as u64 + 1)).unwrap());
                input.extend([1, 1, 1, 0, 0]);
                input
            },
            |o| {
                o.errors
                    == [FrameError::TooManyEvents {
                        count: DELTA_EVENTS_MAX + 1,
                        max: DELTA_EVENTS_MAX,
                    }]
            },
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
                // Kind 3, the count, and one entry.
                let mut input = vec![1, 3];
                input.extend(postcard::to_stdvec(&(STREAMS_MAX as u64 + 1)).unwrap());
                input.extend([1, 1]);
                input
            },
            |o| {
                matches!(
                    o.errors[..],
                    [FrameError::BadVector {
                        kind: "heartbeat",
                        field: "marks",
                        ..
                    }]
                )
            },
        ),
        ("hello of protocol version 2", vec![1, 0, 2], |o| {
            matches!(
                o.errors[..],
                [FrameError::ProtocolVersion { theirs: 2, ours: 1 }]
            )
        }),
        (
            "hello with a version above u16",
            vec![1, 0, 0xff, 0xff, 0x7f],
            |o| matches!(o.errors[..], [FrameError::Malformed { kind: "hello", .. }]),
        ),
        ("unknown kind", vec![1, 4], |o| {
            matches!(o.errors[..], [FrameError::UnknownKind { tag: 4, .. }])
        }),
        (
            "overlong kind varint",
            vec![1, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            |o| matches!(o.errors[..], [FrameError::Malformed { kind: "frame", .. }]),
        ),
        ("heartbeat with trailing bytes", vec![1, 3, 0, 9, 9], |o| {
            matches!(
                o.errors[..],
                [FrameError::TrailingBytes {
                    kind: "heartbeat",
                    len: 2
                }]
            )
        }),
        (
            "ack with descending streams",
            vec![1, 2, 2, 5, 1, 3, 1],
            |o| {
                matches!(
                    o.errors[..],
                    [FrameError::BadVector {
                        kind: "ack",
                        field: "marks",
                        ..
                    }]
                )
            },
        ),
        (
            "ack with a repeated stream",
            vec![1, 2, 2, 5, 1, 5, 2],
            |o| matches!(o.errors[..], [FrameError::BadVector { .. }]),
        ),
        (
            "hello whose floor has a zero seq",
            vec![2, 7, 0, 1, 3, 0],
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
            vec![2, 7, 1, 7, 1, 0],
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

/// A payload of `count` minimal events (stream 1, seq, lamport and time 0..,
/// empty payload: 5 bytes each), after `head`.
fn minimal_events(head: &[u8], count: usize) -> Vec<u8> {
    let mut payload = head.to_vec();
    payload.extend(postcard::to_stdvec(&(count as u64)).unwrap());
    for _ in 0..count {
        payload.extend([1, 1, 1, 0, 0]);
    }
    payload
}

/// Found in review: a delta of minimal events filling a 4 MiB frame decoded
/// into about 800,000 events (50 to 100 MB, for each inbound session at
/// once). Now its count is refused before anything is decoded for its
/// events: the peak of live heap bytes stays within the slack, whatever the
/// frame's length. (The old decoder held over 50 MB here.)
#[test]
fn a_frame_full_of_minimal_events_is_refused_by_its_count_in_constant_memory() {
    let count = (FRAME_BYTES_MAX - 3) / 5 - 1;
    // Kind 1 (delta), an empty floor, then the events.
    let payload = minimal_events(&[1, 0], count);
    assert!(payload.len() <= FRAME_BYTES_MAX, "{} bytes", payload.len());
    let (decoded, peak) = peak_of(|| frame::decode(&payload));
    assert_eq!(
        decoded,
        Err(FrameError::TooManyEvents {
            count,
            max: DELTA_EVENTS_MAX
        })
    );
    assert!(peak <= ALLOC_SLACK, "refusing it held {peak} heap bytes");

    // A vector: an ack of 2-byte entries filling the frame.
    let entries = (FRAME_BYTES_MAX - 4) / 2;
    let mut payload = vec![2];
    payload.extend(postcard::to_stdvec(&(entries as u64)).unwrap());
    payload.extend(std::iter::repeat_n([1u8, 1], entries).flatten());
    let (decoded, peak) = peak_of(|| frame::decode(&payload));
    assert!(
        matches!(decoded, Err(FrameError::BadVector { kind: "ack", .. })),
        "{decoded:?}"
    );
    assert!(peak <= ALLOC_SLACK, "refusing it held {peak} heap bytes");
}

/// The most a delta frame decodes into: `DELTA_EVENTS_MAX` minimal events
/// decode (the receiver takes what a sender may send) into about 1 MiB.
#[test]
fn a_delta_at_the_event_limit_decodes_within_a_bounded_size() {
    let payload = minimal_events(&[1, 0], DELTA_EVENTS_MAX);
    let (decoded, peak) = peak_of(|| frame::decode(&payload));
    let Ok(Frame::Delta(delta)) = decoded else {
        panic!("{decoded:?}");
    };
    assert_eq!(delta.events.len(), DELTA_EVENTS_MAX);
    assert!(peak <= 1 << 20, "decoding it held {peak} heap bytes");
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
    testkit::for_each_seed("random_and_mutated_inputs", 0xf4, 4, |seed| {
        let mut rng = SplitMix64::new(seed);
        for round in 0..3000 {
            let mut input = vec![rng.below(3) as u8];
            if rng.chance(0.3) {
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
            check(&format!("seed {seed:#x} round {round}"), &input);
        }
    });
}

#[derive(Debug, Clone)]
struct AnyFrame(Frame);

fn any_vector(g: &mut Gen) -> VersionVector {
    Vec::<(u64, u64)>::arbitrary(g)
        .into_iter()
        .map(|(s, seq)| (StreamId::new(s), seq))
        .collect()
}

impl Arbitrary for AnyFrame {
    fn arbitrary(g: &mut Gen) -> Self {
        AnyFrame(match u8::arbitrary(g) % 4 {
            0 => Frame::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                stream: StreamId::new(u64::arbitrary(g)),
                marks: any_vector(g),
                floor: any_vector(g),
            }),
            1 => Frame::Delta(Delta {
                floor: any_vector(g),
                events: Vec::<(u64, u64, u64, u64, Vec<u8>)>::arbitrary(g)
                    .into_iter()
                    .map(|(stream, seq, lamport, time_ms, payload)| Event {
                        stream: StreamId::new(stream),
                        seq,
                        lamport,
                        time_ms,
                        payload: Bytes::from(payload),
                    })
                    .collect(),
            }),
            2 => Frame::Ack {
                marks: any_vector(g),
            },
            _ => Frame::Heartbeat {
                marks: any_vector(g),
            },
        })
    }
}

#[test]
fn arbitrary_frames_round_trip() {
    fn round_trip(frame: AnyFrame) -> bool {
        let bytes = frame::encode(&frame.0).unwrap();
        let Ok(Some((payload, used))) = frame::split_frame(&bytes) else {
            return false;
        };
        used == bytes.len() && frame::decode(payload) == Ok(frame.0)
    }
    // Seeded like every randomized test here: a failure prints its seed.
    testkit::for_each_seed("arbitrary_frames_round_trip", 0xf4a3e, 1, |seed| {
        QuickCheck::new()
            .rng(Gen::from_size_and_seed(100, seed))
            .tests(500)
            .quickcheck(round_trip as fn(AnyFrame) -> bool);
    });
}
