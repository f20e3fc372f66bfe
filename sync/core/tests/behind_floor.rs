//! A stream behind a peer's floor, in the protocol core (issue 29,
//! `docs/SIGNING.md`, "Floors with an authority").
//!
//! What it proves:
//!
//! - A newcomer that knows a writer's stream is keyed (here: it requires
//!   seals) and holds nothing of it refuses a hostile peer's unsigned floor
//!   above its head: the stream stays behind that floor. The session asks
//!   the stream quiet once and never loud again while the gap is open, so
//!   a peer that answers every loud ask with the same floor is asked for
//!   it once, and one that repeats it unasked gets no routes frame back.
//!   Before, the core took "holds nothing above its floor" for "the peer's
//!   floor was then taken" and asked the stream loud at the next poll: the
//!   session looped (floor, refused, loud, floor, ...), a routes frame and
//!   a `warn` per turn. Once another peer brings the writer's real events
//!   past the floor, the stream is asked loud again.
//! - A stream whose events the receiver held below the peer's floor, and
//!   then compacted, is asked loud again and the peer's floor is taken (the
//!   rule the fix keeps).
//! - An honest relay's retention floor on a keyed stream still reaches a
//!   newcomer that knows the key, with the writer's sealed run that vouches
//!   for it, when the relay's backlog takes more than one delta (the floor
//!   went in the first, the run in a later one) or one delta split into
//!   frames (the floor went in the first part, the run in a later part):
//!   the floor now goes with the stream's first run, in its part. Before,
//!   the floor came alone, unvouched, and the newcomer was behind it; with
//!   the stream then kept quiet (above), it never came from that relay.
//! - A relay that held nothing of such a stream above its floor, and later
//!   takes the writer's next run, serves it in the same session: the
//!   newcomer asks the stream loud again once the relay's marks of it
//!   rise, and takes the floor with the run that vouches for it.
//!
//! How: the receiver's `Protocol` driven by hand, frames handed in as a
//! peer would send them and every frame it sends decoded; replicas in
//! memory, keys from fixed secrets; the time is an argument.

use std::time::Instant;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Binding, Commits, Config, Delta, MemStore, Membership, Replica, ReplicaError, SharedReplica,
    WriterKey,
};
use meshlog_sync_core::frame::LENGTH_PREFIX_BYTES;
use meshlog_sync_core::frame::{self, Frame, Hello, PROTOCOL_VERSION};
use meshlog_sync_core::proto::{hand_in, Protocol, Received};
use meshlog_sync_core::{sync_once, SessionConfig, DELTA_EVENTS_MAX, FRAME_BYTES_MAX};

const HOSTILE: StreamId = StreamId::new(0xc);
/// The hostile peer's floor, above the writer's first events.
const FLOOR: u64 = 9;
/// How many times the hostile peer answers a loud ask (the old code asked
/// loud every time).
const ANSWERS_MAX: usize = 50;

fn keyed(config: Config) -> SharedReplica {
    let replica = Replica::open(config, MemStore::default()).expect("an empty store opens");
    SharedReplica::with_commits(replica, Commits::Inline)
}

fn floor_only(stream: StreamId, floor: u64) -> Delta {
    Delta {
        floor: [(stream, floor)].into_iter().collect(),
        ..Delta::default()
    }
}

/// The receiver's core after the hostile peer's hello (marks past `FLOOR`
/// on `stream`, and its floor there).
fn core_after_hello(receiver: &SharedReplica, stream: StreamId, now: Instant) -> Protocol {
    let mut core = Protocol::new(receiver.stream(), SessionConfig::default(), now);
    let hello = Frame::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        stream: HOSTILE,
        marks: [(stream, FLOOR + 3)].into_iter().collect(),
        floor: [(stream, FLOOR)].into_iter().collect(),
        frame_bytes_max: FRAME_BYTES_MAX as u32,
    });
    let received = core.handle_frame(now, hello, receiver).expect("the hello");
    assert_eq!(received, Received::Nothing);
    core
}

/// Hands `frame` to the core and applies what it hands back.
fn hand(core: &mut Protocol, now: Instant, frame: Frame, replica: &SharedReplica) {
    if let Received::Apply(columns) = core
        .handle_frame(now, frame, replica)
        .expect("the session goes on")
    {
        let applied: Result<_, ReplicaError> = replica.apply_columns(columns);
        core.handle_applied(now, applied)
            .expect("a floor behind does not end the session");
    }
}

/// What the core sends until it has nothing more: per routes frame, the
/// streams asked quiet and loud.
fn routes_sent(
    core: &mut Protocol,
    now: Instant,
    replica: &SharedReplica,
) -> Vec<(Vec<StreamId>, Vec<StreamId>)> {
    let mut routes = Vec::new();
    while let Some(bytes) = core.poll_transmit(now, replica).expect("sends") {
        if let Frame::Routes(frame) = frame::decode(&bytes).expect("decodes") {
            routes.push((frame.quiet, frame.loud));
        }
    }
    routes
}

/// Issue 29 (the last stop note, "noticed and left alone"): a hostile
/// peer repeating an unsigned floor on a keyed stream made the newcomer's
/// session loop. Now: one quiet ask, no loud one while the gap is open,
/// and the loud ask once the writer's real events fill it.
#[test]
fn a_refused_floor_on_a_keyed_stream_is_not_asked_for_again_and_again() {
    let writer = keyed(Config::with_key(WriterKey::from_bytes([1; 32])));
    for i in 0..FLOOR + 3 {
        writer.append(vec![i as u8]).expect("append");
    }
    let stream = writer.stream();
    let newcomer = keyed(Config {
        require_seals: true,
        ..Config::with_key(WriterKey::from_bytes([2; 32]))
    });
    let now = Instant::now();
    let mut core = core_after_hello(&newcomer, stream, now);

    // The peer sends the floor, and again each time the stream is asked
    // loud (as a sender pushes a stream asked loud).
    let mut number = 0;
    let mut routes = Vec::new();
    loop {
        number += 1;
        hand(
            &mut core,
            now,
            Frame::delta(number, floor_only(stream, FLOOR)),
            &newcomer,
        );
        let sent = routes_sent(&mut core, now, &newcomer);
        let asked_loud = sent.iter().any(|(_, loud)| loud.contains(&stream));
        routes.extend(sent);
        if !asked_loud || number as usize == ANSWERS_MAX {
            break;
        }
    }
    assert_eq!(
        number,
        1,
        "the floor was asked for again ({} routes frames)",
        routes.len()
    );
    assert_eq!(routes, [(vec![stream], vec![])], "asked quiet once");
    // Repeated unasked, it is refused again and costs no routes frame.
    for _ in 0..10 {
        number += 1;
        hand(
            &mut core,
            now,
            Frame::delta(number, floor_only(stream, FLOOR)),
            &newcomer,
        );
        let sent = routes_sent(&mut core, now, &newcomer);
        assert!(sent.is_empty(), "{sent:?}");
    }
    assert_eq!(core.state().behind_floor, [(stream, FLOOR)]);
    assert_eq!(newcomer.floor().get(stream), 0, "nothing recorded lost");
    assert_eq!(newcomer.marks().get(stream), 0);

    // Another peer brings the writer's real events past the floor: the
    // stream is asked loud again here.
    let real = writer
        .try_delta_for(&VersionVector::new(), usize::MAX)
        .expect("the writer reads");
    newcomer.apply(real).expect("the writer's sealed events");
    assert_eq!(newcomer.marks().get(stream), FLOOR + 3);
    let sent = routes_sent(&mut core, now, &newcomer);
    assert_eq!(sent, [(vec![], vec![stream])], "asked loud once filled");
    assert!(core.state().behind_floor.is_empty());
}

/// The rule the fix keeps: a stream whose events the receiver held below
/// the peer's floor, compacted by the receiver, is asked loud again, and
/// the peer's floor then taken.
#[test]
fn a_stream_held_below_the_floor_and_compacted_is_asked_loud_and_the_floor_taken() {
    let writer = SharedReplica::in_memory(StreamId::new(0xb));
    for i in 0..5u8 {
        writer.append(vec![i]).expect("append");
    }
    let stream = writer.stream();
    let receiver = SharedReplica::in_memory(StreamId::new(0xa));
    let delta = writer
        .try_delta_for(&VersionVector::new(), usize::MAX)
        .expect("the writer reads");
    receiver.apply(delta).expect("the writer's events");
    let now = Instant::now();
    let mut core = core_after_hello(&receiver, stream, now);

    hand(
        &mut core,
        now,
        Frame::delta(1, floor_only(stream, FLOOR)),
        &receiver,
    );
    assert_eq!(
        routes_sent(&mut core, now, &receiver),
        [(vec![stream], vec![])]
    );
    assert_eq!(core.state().behind_floor, [(stream, FLOOR)]);
    assert!(
        routes_sent(&mut core, now, &receiver).is_empty(),
        "still behind"
    );

    let to: VersionVector = [(stream, 5)].into_iter().collect();
    receiver.compact(&to).expect("compacts");
    assert_eq!(
        routes_sent(&mut core, now, &receiver),
        [(vec![], vec![stream])]
    );
    hand(
        &mut core,
        now,
        Frame::delta(2, floor_only(stream, FLOOR)),
        &receiver,
    );
    assert_eq!(
        receiver.floor().get(stream),
        FLOOR,
        "the peer's floor taken"
    );
    assert!(core.state().behind_floor.is_empty());
    assert!(routes_sent(&mut core, now, &receiver).is_empty());
}

/// A relay holding an unkeyed writer's `others` events, then a keyed
/// writer's 10 events stamped after them (so a delta carries them last),
/// compacted to 5 (a retention floor: no statement); and the keyed
/// writer's stream.
fn relay_with_a_retention_floor(others: usize) -> (SharedReplica, StreamId) {
    let other = SharedReplica::in_memory(StreamId::new(0x58));
    for chunk in (0..others).collect::<Vec<_>>().chunks(1000) {
        let batch = chunk.iter().map(|&i| Bytes::from(vec![i as u8])).collect();
        other.append_batch(batch).expect("append");
    }
    let writer = keyed(Config::with_key(WriterKey::from_bytes([1; 32])));
    let everything = |from: &SharedReplica, to: &SharedReplica| {
        let delta = from.try_delta_for(&to.marks(), usize::MAX).expect("reads");
        to.apply(delta).expect("taken");
    };
    everything(&other, &writer);
    for i in 0..10u8 {
        writer.append(vec![i]).expect("append");
    }
    let relay = SharedReplica::in_memory(StreamId::new(0x7e));
    everything(&writer, &relay);
    let to: VersionVector = [(writer.stream(), 5)].into_iter().collect();
    relay.compact(&to).expect("compacts");
    (relay, writer.stream())
}

/// A newcomer whose membership binds the keyed writer's stream to its key:
/// it knows the stream is keyed before any of it arrives.
fn newcomer_knowing(stream: StreamId) -> SharedReplica {
    let key = WriterKey::from_bytes([1; 32]).public();
    assert_eq!(key.stream(), stream);
    let mut membership = Membership::open();
    membership.bind(Binding { stream, key });
    keyed(Config {
        membership,
        ..Config::new(StreamId::new(0x11))
    })
}

/// Syncs a newcomer that knows the keyed stream from the relay under
/// `config`: it takes the floor and the run above it, and every other
/// event, nothing behind.
fn newcomer_takes_the_floor_with_its_run(others: usize, config: &SessionConfig) {
    let (relay, stream) = relay_with_a_retention_floor(others);
    let newcomer = newcomer_knowing(stream);
    let report = sync_once(Instant::now(), &relay, &newcomer, config).expect("syncs");
    assert!(report.quiescent);
    assert!(
        report.b.behind_floor.is_empty(),
        "{:?}",
        report.b.behind_floor
    );
    assert_eq!(
        (newcomer.floor().get(stream), newcomer.marks().get(stream)),
        (5, 10),
        "the keyed stream"
    );
    assert_eq!(newcomer.marks(), relay.marks());
    assert_eq!(newcomer.chain(stream), relay.chain(stream));
}

/// The relay's backlog takes more than one delta (the default budget
/// holds about 5,000 events): the floor waits for the delta that carries
/// the run.
#[test]
fn a_retention_floor_goes_with_its_sealed_run_across_deltas() {
    newcomer_takes_the_floor_with_its_run(6_000, &SessionConfig::default());
}

/// One delta split into frames (a budget above a frame's event limit):
/// the floor goes in the part that carries the run.
#[test]
fn a_retention_floor_goes_with_its_sealed_run_in_a_split_delta() {
    let config = SessionConfig {
        delta_bytes_max: 2 << 20,
        ..SessionConfig::default()
    };
    newcomer_takes_the_floor_with_its_run(DELTA_EVENTS_MAX + 100, &config);
}

/// Carries frames both ways between two cores at `now` until neither has
/// anything to send.
fn exchange(
    now: Instant,
    (a_core, a): (&mut Protocol, &SharedReplica),
    (b_core, b): (&mut Protocol, &SharedReplica),
) {
    let mut idle = 0;
    let mut a_turn = true;
    while idle < 2 {
        let (from, from_replica, to, to_replica) = if a_turn {
            (&mut *a_core, a, &mut *b_core, b)
        } else {
            (&mut *b_core, b, &mut *a_core, a)
        };
        let mut sent = Vec::new();
        while let Some(bytes) = from.poll_transmit(now, from_replica).expect("sends") {
            sent.push(bytes);
        }
        for bytes in &sent {
            hand_in(now, to, &bytes[LENGTH_PREFIX_BYTES..], to_replica).expect("takes");
        }
        idle = if sent.is_empty() { idle + 1 } else { 0 };
        a_turn = !a_turn;
    }
}

/// A relay that compacted a keyed writer's whole stream cannot serve it:
/// the newcomer is behind its floor and asks the stream quiet. The writer
/// writes on and the relay takes the new run: once the relay's marks show
/// it (a heartbeat at the next tick), the newcomer asks the stream loud
/// again and takes the floor with the run, in the same session. (With the
/// stream kept quiet until the gap was filled, it never came.)
#[test]
fn a_relay_that_takes_the_writers_next_run_serves_it_in_the_same_session() {
    let writer = keyed(Config::with_key(WriterKey::from_bytes([1; 32])));
    let stream = writer.stream();
    let relay = SharedReplica::in_memory(StreamId::new(0x7e));
    let catch_up = |to: &SharedReplica| {
        let delta = writer
            .try_delta_for(&to.marks(), usize::MAX)
            .expect("reads");
        to.apply(delta).expect("the writer's sealed run");
    };
    for i in 0..10u8 {
        writer.append(vec![i]).expect("append");
    }
    catch_up(&relay);
    let to: VersionVector = [(stream, 10)].into_iter().collect();
    relay.compact(&to).expect("compacts");
    let newcomer = newcomer_knowing(stream);
    let config = SessionConfig::default();
    let now = Instant::now();
    let mut relay_core = Protocol::new(relay.stream(), config.clone(), now);
    let mut newcomer_core = Protocol::new(newcomer.stream(), config.clone(), now);
    exchange(
        now,
        (&mut relay_core, &relay),
        (&mut newcomer_core, &newcomer),
    );
    assert_eq!(newcomer_core.state().behind_floor, [(stream, 10)]);
    assert_eq!(newcomer.marks().get(stream), 0);

    for i in 10..13u8 {
        writer.append(vec![i]).expect("append");
    }
    catch_up(&relay);
    // Still behind while the relay's marks say nothing new.
    exchange(
        now,
        (&mut relay_core, &relay),
        (&mut newcomer_core, &newcomer),
    );
    assert_eq!(newcomer.marks().get(stream), 0);
    let tick = now + config.heartbeat_interval;
    for core in [&mut relay_core, &mut newcomer_core] {
        core.handle_timeout(tick).expect("a tick");
    }
    exchange(
        tick,
        (&mut relay_core, &relay),
        (&mut newcomer_core, &newcomer),
    );
    assert!(newcomer_core.state().behind_floor.is_empty());
    assert_eq!(
        (newcomer.floor().get(stream), newcomer.marks().get(stream)),
        (10, 13)
    );
    assert_eq!(newcomer.chain(stream), relay.chain(stream));
}
