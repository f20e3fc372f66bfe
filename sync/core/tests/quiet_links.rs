//! What a link costs and tolerates between two protocol cores driven on a
//! simulated clock (no task, stream or timer: the time is an argument),
//! with every frame carried both ways and counted by kind:
//!
//! - a quiet link sends a heartbeat every tick until three in a row said
//!   the same, then every other tick (under 1 KB a minute a link), and no
//!   side times the other out; anything new brings them back every tick;
//! - a frame of a kind this side does not know is skipped and counted, and
//!   the session goes on and converges;
//! - a peer whose hello does not say it skips unknown kinds (a build before
//!   the flag) gets no checkpoint frame; one whose hello says so does;
//! - writer churn (issue 27): what a retired, compacted writer costs per
//!   hello, per session opening, per heartbeat and receipt, and per head
//!   token; the accepting side's hello against a checkpoint, fetched by a
//!   dialer that lacks it, and whole to a dialer that does not read one;
//!   the dialer's, once it remembers from a first session that the peer
//!   reads one, fetched by an acceptor that lacks it, and sent again whole
//!   to a peer that no longer reads one;
//! - what a receipt echoes back (the simulator's first quiet minute), and
//!   a lost routes frame asking a stream loud, asked again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Event, SharedReplica};
use meshlog_sync_core::frame::{
    self, Frame, Hello, HELLO_SKIPS_UNKNOWN_KINDS, LENGTH_PREFIX_BYTES,
};
use meshlog_sync_core::proto::{PeerMemory, Protocol, Received};
use meshlog_sync_core::{PeerDirection, Routes, SessionConfig, FRAME_BYTES_MAX, PROTOCOL_VERSION};
use meshlog_testkit::churn::{churned, spread};

/// One side of a link: its replica, its core, and what it sent, by kind.
struct Side {
    replica: SharedReplica,
    core: Protocol,
    sent: BTreeMap<&'static str, (u64, u64)>,
}

impl Side {
    fn new(stream: u64, now: Instant) -> Side {
        let replica = SharedReplica::in_memory(StreamId::new(stream));
        let core = Protocol::new(replica.stream(), SessionConfig::default(), now);
        Side {
            replica,
            core,
            sent: BTreeMap::new(),
        }
    }

    fn count(&self, kind: &str) -> (u64, u64) {
        self.sent.get(kind).copied().unwrap_or_default()
    }
}

/// Carries every frame `from` has to send into `to`, applying deltas;
/// whether any moved.
fn carry(now: Instant, from: &mut Side, to: &mut Side) -> bool {
    carry_but(now, from, to, |_| false)
}

/// Carries every frame `from` has for `to` (each counted as sent) but
/// those `lost` says are lost on the way; whether any moved.
fn carry_but(
    now: Instant,
    from: &mut Side,
    to: &mut Side,
    mut lost: impl FnMut(&str) -> bool,
) -> bool {
    let mut moved = false;
    while let Some(bytes) = from.core.poll_transmit(now, &from.replica).unwrap() {
        moved = true;
        let payload = &bytes[LENGTH_PREFIX_BYTES..];
        let kind = frame::decode_payload_limited(payload, 8 << 20)
            .unwrap()
            .kind();
        let entry = from.sent.entry(kind).or_default();
        entry.0 += 1;
        entry.1 += bytes.len() as u64;
        if lost(kind) {
            continue;
        }
        match to.core.handle_payload(now, payload, &to.replica).unwrap() {
            Received::Apply(columns) => {
                let applied = to.replica.apply_columns(columns);
                to.core.handle_applied(now, applied).unwrap();
            }
            Received::Checkpoint(checkpoint) => {
                to.replica.keep_checkpoint(checkpoint).unwrap();
            }
            Received::Nothing => {}
        }
    }
    moved
}

/// Both ways until neither side has anything to say.
fn settle(now: Instant, a: &mut Side, b: &mut Side) {
    while carry(now, a, b) | carry(now, b, a) {}
}

/// Runs `ticks` ticks of one second (the default heartbeat), each side's
/// timeouts served (a read timeout fails the test), then settles.
fn run_ticks(now: &mut Instant, ticks: u32, a: &mut Side, b: &mut Side) {
    for _ in 0..ticks {
        *now += Duration::from_secs(1);
        a.core.handle_timeout(*now).expect("a keeps the link");
        b.core.handle_timeout(*now).expect("b keeps the link");
        settle(*now, a, b);
    }
}

#[test]
fn a_quiet_link_sends_a_heartbeat_every_other_tick_under_1_kb_a_minute_and_stays_up() {
    let mut now = Instant::now();
    let mut a = Side::new(1, now);
    let mut b = Side::new(2, now);
    for i in 0..10u8 {
        a.replica.append(vec![i; 16]).unwrap();
        b.replica.append(vec![i; 16]).unwrap();
    }
    settle(now, &mut a, &mut b);
    assert_eq!(a.replica.digest(), b.replica.digest());
    // Into the quiet: the first ticks carry the receipts that settle the
    // marks both ways; then three alike at every tick.
    run_ticks(&mut now, 5, &mut a, &mut b);
    let before = (a.count("heartbeat"), b.count("heartbeat"));
    run_ticks(&mut now, 60, &mut a, &mut b);
    let beats_a = a.count("heartbeat").0 - before.0 .0;
    let beats_b = b.count("heartbeat").0 - before.1 .0;
    let bytes = a.count("heartbeat").1 - before.0 .1 + b.count("heartbeat").1 - before.1 .1;
    // Every other tick, each way (the old protocol sent 60 each way, 1,200
    // bytes); nothing else crossed.
    assert_eq!((beats_a, beats_b), (30, 30), "{:?} {:?}", a.sent, b.sent);
    assert_eq!(bytes, 600, "{:?} {:?}", a.sent, b.sent);
    assert!(bytes < 1000);

    // Something new: A appends. Its delta goes at once, and the next
    // heartbeats go at every tick (three alike again) before they space out.
    a.replica.append(&b"news"[..]).unwrap();
    settle(now, &mut a, &mut b);
    assert_eq!(a.replica.digest(), b.replica.digest());
    let before = (a.count("heartbeat").0, b.count("heartbeat").0);
    run_ticks(&mut now, 3, &mut a, &mut b);
    assert_eq!(
        (
            a.count("heartbeat").0 - before.0,
            b.count("heartbeat").0 - before.1
        ),
        (3, 3),
        "{:?} {:?}",
        a.sent,
        b.sent
    );
}

#[test]
fn a_read_timeout_of_under_ten_ticks_keeps_a_heartbeat_every_tick() {
    // A peer taken to time out sooner than five spaced heartbeats: no
    // spacing at all.
    let mut now = Instant::now();
    let config = SessionConfig {
        read_timeout: Duration::from_secs(9),
        ..SessionConfig::default()
    };
    let mut a = Side::new(1, now);
    let mut b = Side::new(2, now);
    a.core = Protocol::new(a.replica.stream(), config.clone(), now);
    b.core = Protocol::new(b.replica.stream(), config, now);
    settle(now, &mut a, &mut b);
    run_ticks(&mut now, 5, &mut a, &mut b);
    let before = a.count("heartbeat").0;
    run_ticks(&mut now, 20, &mut a, &mut b);
    assert_eq!(a.count("heartbeat").0 - before, 20);
}

#[test]
fn a_frame_of_an_unknown_kind_is_skipped_and_the_session_converges() {
    let mut now = Instant::now();
    let mut a = Side::new(1, now);
    let mut b = Side::new(2, now);
    a.replica.append(&b"before"[..]).unwrap();
    settle(now, &mut a, &mut b);
    // A later build's kind 64, with a body this side cannot read: skipped.
    let unknown = [0x40, 0x01, 0xff, 0xff, 0x07];
    assert_eq!(
        b.core.handle_payload(now, &unknown, &b.replica).unwrap(),
        Received::Nothing
    );
    assert_eq!(b.core.state().frames_skipped, 1);
    // The session goes on: both ways, events cross and converge.
    a.replica.append(&b"after"[..]).unwrap();
    b.replica.append(&b"from b"[..]).unwrap();
    // (A delta waits while one is in flight: the ticks end the wait.)
    run_ticks(&mut now, 2, &mut a, &mut b);
    assert_eq!(a.replica.digest(), b.replica.digest());
    assert_eq!(b.replica.marks().get(StreamId::new(1)), 2);
    assert_eq!(b.core.state().frames_skipped, 1);
}

/// One event on each of streams `100 ..= 399`: enough moved streams for a
/// checkpoint to be due.
fn many_writers() -> Delta {
    let events = (100..400u64)
        .map(|s| Event {
            stream: StreamId::new(s),
            seq: 1,
            lamport: s,
            time_ms: 0,
            payload: Bytes::from_static(b"w"),
        })
        .collect();
    Delta {
        events,
        ..Delta::default()
    }
}

/// The frames a core holding a checkpoint sends after `hello`, by kind.
fn kinds_after(hello: Hello) -> (bool, Vec<&'static str>) {
    let now = Instant::now();
    let a = SharedReplica::in_memory(StreamId::new(1));
    a.apply(many_writers()).unwrap();
    a.mint_checkpoint(1_700_000_000_000).unwrap().expect("due");
    let mut core = Protocol::new(a.stream(), SessionConfig::default(), now);
    assert_eq!(
        core.handle_frame(now, Frame::Hello(hello), &a).unwrap(),
        Received::Nothing
    );
    let mut kinds = Vec::new();
    while let Some(bytes) = core.poll_transmit(now, &a).unwrap() {
        kinds.push(frame::decode(&bytes).unwrap().kind());
    }
    (core.gossips_checkpoints(), kinds)
}

fn hello(frame_bytes_max: u32) -> Hello {
    Hello {
        protocol: PROTOCOL_VERSION,
        stream: StreamId::new(9),
        marks: VersionVector::new(),
        floor: VersionVector::new(),
        frame_bytes_max,
    }
}

#[test]
fn a_hello_from_an_older_peer_turns_checkpoint_gossip_off() {
    // A protocol-4 peer built before the flag announces its plain limit.
    let (on, kinds) = kinds_after(hello(FRAME_BYTES_MAX as u32));
    assert!(!on);
    assert!(!kinds.contains(&"checkpoint"), "{kinds:?}");
    assert!(kinds.contains(&"delta"), "{kinds:?}");
    // One that skips unknown kinds says so, and gets the checkpoint.
    let (on, kinds) = kinds_after(hello(FRAME_BYTES_MAX as u32 | HELLO_SKIPS_UNKNOWN_KINDS));
    assert!(on);
    assert!(kinds.contains(&"checkpoint"), "{kinds:?}");
}

#[test]
fn our_hello_says_we_skip_unknown_kinds_and_an_older_peer_reads_our_usual_limit() {
    let a = SharedReplica::in_memory(StreamId::new(1));
    let mut core = Protocol::new(a.stream(), SessionConfig::default(), Instant::now());
    let bytes = core.poll_transmit(Instant::now(), &a).unwrap().unwrap();
    let Frame::Hello(ours) = frame::decode(&bytes).unwrap() else {
        panic!("the first frame is the hello");
    };
    assert!(ours.skips_unknown_kinds());
    assert!(ours.takes_hello_against());
    // An older peer reads the two flag bits as a limit 3 bytes larger.
    assert_eq!(ours.frame_bytes_max as usize, FRAME_BYTES_MAX + 3);
    assert_eq!(ours.frame_limit(), FRAME_BYTES_MAX);
}

/// What one link costs with `retired` retired, compacted writers beside
/// 20 live ones, both sides holding the same, in its second session (A
/// dials B again, remembering what the first session learned of B).
#[derive(Debug, PartialEq, Eq)]
struct LinkCosts {
    /// The dialer's hello in the first session (whole: it knew nothing of
    /// B), the bytes of each.
    first_hello: u64,
    /// The dialer's and the acceptor's hello bytes, second session.
    hellos: (u64, u64),
    /// The bytes A and B sent besides their hellos over the session's
    /// first ten ticks.
    opening: (u64, u64),
    /// An idle heartbeat's bytes.
    idle: u64,
    /// The bytes of A's receipts after one live writer's event.
    receipts: u64,
    /// The head token's characters.
    token: u64,
}

/// A dials B, B accepts, over fresh cores: A starting from `memory`.
fn dial(now: Instant, a: &mut Side, b: &mut Side, memory: &PeerMemory) {
    let routes = (Routes::new(), Routes::new());
    a.core = Protocol::new(a.replica.stream(), SessionConfig::default(), now)
        .with_routes(&routes.0, PeerDirection::Outbound)
        .with_peer_memory(memory);
    b.core = Protocol::new(b.replica.stream(), SessionConfig::default(), now)
        .with_routes(&routes.1, PeerDirection::Inbound);
    a.sent.clear();
    b.sent.clear();
}

/// The bytes `side` sent of kinds other than the hello's two.
fn besides_hello(side: &Side) -> u64 {
    let hellos = side.count("hello").1 + side.count("hello against").1;
    side.sent.values().map(|(_, bytes)| bytes).sum::<u64>() - hellos
}

fn link_costs(retired: u64) -> LinkCosts {
    let mut now = Instant::now();
    let mut a = Side::new(1, now);
    let mut b = Side::new(2, now);
    a.replica = churned(1, 20, retired);
    b.replica = churned(2, 20, retired);
    // The first session: A knows nothing of B, and its hello goes whole;
    // B answers against the checkpoint both keep.
    dial(now, &mut a, &mut b, &PeerMemory::default());
    assert_eq!(b.core.poll_transmit(now, &b.replica).unwrap(), None);
    settle(now, &mut a, &mut b);
    assert_eq!(b.count("hello"), (0, 0));
    assert_eq!(b.count("hello against").0, 1);
    let first_hello = a.count("hello").1;
    run_ticks(&mut now, 3, &mut a, &mut b);
    let memory = a.core.peer_memory();
    assert!(memory.reads_hello_against, "{memory:?}");
    // The second: A remembers that B reads a hello against a checkpoint
    // and holds theirs; its hello goes against it too.
    dial(now, &mut a, &mut b, &memory);
    settle(now, &mut a, &mut b);
    let hello_bytes = |side: &Side| side.count("hello").1 + side.count("hello against").1;
    let hellos = (hello_bytes(&a), hello_bytes(&b));
    run_ticks(&mut now, 10, &mut a, &mut b);
    let opening = (besides_hello(&a), besides_hello(&b));
    let before = a.count("heartbeat");
    run_ticks(&mut now, 2, &mut a, &mut b);
    let idle = a.count("heartbeat").1 - before.1;
    assert_eq!(a.count("heartbeat").0 - before.0, 1, "{:?}", a.sent);
    // A live writer's event, from B: A receives it, acks and reports it.
    let live = spread(0);
    let moved = Delta {
        events: vec![Event {
            stream: live,
            seq: 2,
            lamport: 2,
            time_ms: 0,
            payload: Bytes::from_static(b"w"),
        }],
        ..Delta::default()
    };
    b.replica.apply(moved).unwrap();
    let before = a.count("heartbeat").1 + a.count("ack").1 + a.count("bare ack").1;
    settle(now, &mut a, &mut b);
    run_ticks(&mut now, 3, &mut a, &mut b);
    assert_eq!(a.replica.marks().get(live), 2);
    let receipts = a.count("heartbeat").1 + a.count("ack").1 + a.count("bare ack").1 - before;
    let token = a.replica.token(&a.replica.marks()).unwrap().len() as u64;
    LinkCosts {
        first_hello,
        hellos,
        opening,
        idle,
        receipts,
        token,
    }
}

/// Issue 27's writer churn, measured: what a retired writer costs once
/// compacted, per hello, per session opening (the frames after the
/// hello), per heartbeat and receipt, and per head token, as the bytes at
/// 400 retired writers less those at 200 (20 live writers either way; a
/// vector's count is a 2-byte varint at both), in a link's second
/// session.
///
/// Heartbeats and receipts carry marks as differences, and a head token
/// is a checkpoint's name and differences, so neither grows. A session's
/// first receipt carried the whole marks (a difference from nothing, as
/// if the peer held no hello of ours): 11 bytes a retired writer a
/// session, now a difference from the hello's marks. A hello carries the
/// whole marks and floor: each retired writer costs its stream id and seq
/// twice in it. The accepting side's hello goes against a checkpoint
/// (`docs/PROTOCOL.md`, "A hello against a checkpoint"), where a retired
/// writer costs nothing; so does the dialer's once it remembers, from the
/// link's first session, that the peer reads one ("The dialer's hello"):
/// it was whole in every session (it speaks first, to a peer that may be
/// of an older build). The acceptor gossiped the checkpoint both held,
/// whole, at every session's opening (11 bytes a retired writer); a
/// checkpoint a hello was written against is now known held.
#[test]
fn a_retired_compacted_writer_costs_a_link_nothing_after_its_first_session() {
    let none = link_costs(200);
    let many = link_costs(400);
    println!("retired 200: {none:?}");
    println!("retired 400: {many:?}");
    assert_eq!(many.hellos.0, none.hellos.0, "the dialer's hello grew");
    assert_eq!(many.opening, none.opening, "the session's opening grew");
    assert_eq!(many.idle, none.idle, "an idle heartbeat grew");
    assert_eq!(
        many.receipts, none.receipts,
        "the receipts of one event grew"
    );
    assert_eq!(many.token, none.token, "the head token grew");
    assert_eq!(many.hellos.1, none.hellos.1, "the acceptor's hello grew");
    assert_eq!(
        many.hellos,
        (230, 230),
        "both hellos against the checkpoint"
    );
    // The first session's dialer knew nothing of the peer: per retired
    // writer, a 10-byte stream id and a 1-byte seq, in the marks and
    // again in the floor of its whole hello (no retired writer: 233 bytes).
    assert_eq!(many.first_hello - none.first_hello, 200 * 2 * (10 + 1));
}

/// The cause of the simulator's first quiet minute (141 KB a link at
/// 8,641 streams, `docs/BENCHMARKS.md`): a receipt reports every stream
/// whose mark moved since the marks the peer last said it holds, even
/// those the peer itself delivered (its deltas were acknowledged, so it
/// knows). After writes stop, the first receipts each way carry about
/// every stream written in the last tick, whichever link brought it:
/// here, A's receipts after B delivered 300 streams carry all 300 back
/// to B.
#[test]
fn a_receipt_echoes_the_streams_the_peers_own_deltas_moved() {
    let mut now = Instant::now();
    let mut a = Side::new(1, now);
    let mut b = Side::new(2, now);
    settle(now, &mut a, &mut b);
    run_ticks(&mut now, 5, &mut a, &mut b);
    b.replica.apply(many_writers()).unwrap();
    let mut echoed = VersionVector::new();
    loop {
        let moved = carry(now, &mut b, &mut a);
        while let Some(bytes) = a.core.poll_transmit(now, &a.replica).unwrap() {
            if let Ok(Frame::Ack(receipt) | Frame::Heartbeat(receipt)) = frame::decode(&bytes) {
                echoed.join(&receipt.marks.changes);
            }
            let payload = &bytes[LENGTH_PREFIX_BYTES..];
            if let Received::Apply(columns) =
                b.core.handle_payload(now, payload, &b.replica).unwrap()
            {
                let applied = b.replica.apply_columns(columns);
                b.core.handle_applied(now, applied).unwrap();
            }
        }
        if !moved {
            if echoed.len() > 1 || now.elapsed() > Duration::from_secs(3) {
                break;
            }
            now += Duration::from_secs(1);
            a.core.handle_timeout(now).unwrap();
            b.core.handle_timeout(now).unwrap();
        }
    }
    assert_eq!(a.replica.digest(), b.replica.digest());
    let delivered = (100..400u64).filter(|&s| echoed.get(StreamId::new(s)) == 1);
    assert_eq!(delivered.count(), 300, "echoed back: {}", echoed.len());
}

/// A dialer that does not keep the checkpoint the acceptor's hello was
/// written against asks for it by name, keeps it (checked against its
/// name), takes the hello, and the session converges as any does.
#[test]
fn a_hello_against_a_checkpoint_the_dialer_lacks_is_fetched_and_taken() {
    let mut now = Instant::now();
    let mut a = Side::new(1, now);
    let mut b = Side::new(2, now);
    b.replica = churned(2, 20, 300);
    a.replica.append(&b"from a"[..]).unwrap();
    let routes = (Routes::new(), Routes::new());
    a.core = Protocol::new(a.replica.stream(), SessionConfig::default(), now)
        .with_routes(&routes.0, PeerDirection::Outbound);
    b.core = Protocol::new(b.replica.stream(), SessionConfig::default(), now)
        .with_routes(&routes.1, PeerDirection::Inbound);
    settle(now, &mut a, &mut b);
    run_ticks(&mut now, 3, &mut a, &mut b);
    assert_eq!(b.count("hello against").0, 1, "{:?}", b.sent);
    assert_eq!(a.count("checkpoint want").0, 1, "{:?}", a.sent);
    assert!(b.count("checkpoint").0 >= 1, "{:?}", b.sent);
    let base = b.replica.checkpoint_names()[0];
    assert!(a.replica.checkpoint(base).is_some());
    assert_eq!(a.replica.digest(), b.replica.digest());
    assert_eq!(a.replica.floor(), b.replica.floor());
}

/// A dialer that remembers its peer reads a hello against a checkpoint,
/// but not which checkpoints it holds, writes its hello against the
/// newest it keeps; an acceptor that does not keep that one asks for it
/// by name before it answers, the dialer answers (before it has the
/// acceptor's hello), and the session converges as any does.
#[test]
fn a_dialers_hello_against_a_checkpoint_the_acceptor_lacks_is_fetched_and_taken() {
    let mut now = Instant::now();
    let mut a = Side::new(1, now);
    let mut b = Side::new(2, now);
    a.replica = churned(1, 20, 300);
    b.replica.append(&b"from b"[..]).unwrap();
    let base = a.replica.checkpoint_names()[0];
    let memory = PeerMemory {
        reads_hello_against: true,
        checkpoints: Vec::new(),
    };
    dial(now, &mut a, &mut b, &memory);
    settle(now, &mut a, &mut b);
    run_ticks(&mut now, 3, &mut a, &mut b);
    assert_eq!(a.count("hello against").0, 1, "{:?}", a.sent);
    assert_eq!(a.count("hello").0, 0, "{:?}", a.sent);
    assert_eq!(b.count("checkpoint want").0, 1, "{:?}", b.sent);
    assert!(a.count("checkpoint").0 >= 1, "{:?}", a.sent);
    assert!(b.replica.checkpoint(base).is_some());
    assert_eq!(a.replica.digest(), b.replica.digest());
    assert_eq!(a.replica.floor(), b.replica.floor());
    // What the session leaves for the next: B reads one, and holds it.
    let memory = a.core.peer_memory();
    assert!(memory.reads_hello_against);
    assert!(memory.checkpoints.contains(&base), "{memory:?}");
}

/// A dialer that remembers its peer reads a hello against a checkpoint,
/// where the peer no longer does (it turned checkpoints off: it skips
/// kind 9 and sends its own hello at once, without the flag), sends its
/// hello again, whole, in the same session; the session converges and
/// leaves "reads none" for the next, whose hello goes whole.
#[test]
fn a_dialer_whose_peer_no_longer_reads_a_hello_against_one_sends_it_whole() {
    let mut now = Instant::now();
    let mut a = Side::new(1, now);
    let mut b = Side::new(2, now);
    a.replica = churned(1, 20, 300);
    b.replica.append(&b"from b"[..]).unwrap();
    let memory = PeerMemory {
        reads_hello_against: true,
        checkpoints: a.replica.checkpoint_names(),
    };
    let off = SessionConfig {
        checkpoints: false,
        ..SessionConfig::default()
    };
    for session in 0..2 {
        let memory = if session == 0 {
            memory.clone()
        } else {
            a.core.peer_memory()
        };
        dial(now, &mut a, &mut b, &memory);
        b.core = Protocol::new(b.replica.stream(), off.clone(), now)
            .with_routes(&Routes::new(), PeerDirection::Inbound);
        settle(now, &mut a, &mut b);
        // At once, before any tick: against (the first session), skipped,
        // then whole.
        let against = u64::from(session == 0);
        assert_eq!(
            a.count("hello against").0,
            against,
            "{session}: {:?}",
            a.sent
        );
        assert_eq!(b.core.state().frames_skipped, against, "{session}");
        assert_eq!(a.count("hello").0, 1, "{session}: {:?}", a.sent);
        run_ticks(&mut now, 3, &mut a, &mut b);
        assert_eq!(a.replica.digest(), b.replica.digest(), "{session}");
        assert!(!a.core.peer_memory().reads_hello_against, "{session}");
    }
}

/// A dialer whose hello does not say it reads a hello against a
/// checkpoint (an older build, or checkpoints off) gets a whole hello.
#[test]
fn a_dialer_that_does_not_read_a_hello_against_a_checkpoint_gets_a_whole_one() {
    let now = Instant::now();
    let b = churned(2, 20, 300);
    let mut core = Protocol::new(b.stream(), SessionConfig::default(), now)
        .with_routes(&Routes::new(), PeerDirection::Inbound);
    assert_eq!(core.poll_transmit(now, &b).unwrap(), None);
    let older = hello(FRAME_BYTES_MAX as u32 | HELLO_SKIPS_UNKNOWN_KINDS);
    assert!(!older.takes_hello_against());
    assert_eq!(
        core.handle_frame(now, Frame::Hello(older), &b).unwrap(),
        Received::Nothing
    );
    let bytes = core.poll_transmit(now, &b).unwrap().unwrap();
    let Frame::Hello(ours) = frame::decode(&bytes).unwrap() else {
        panic!("a whole hello");
    };
    assert_eq!(ours.marks, b.marks());
    assert_eq!(ours.floor, b.floor());
}

/// Regression (found by `sync/tests/convergence.rs`, seed
/// 11469765292980228007, once an accepting side began to wait for the
/// dialer's hello): a routes frame asking a stream loud again was sent
/// once, so when it was lost the peer kept the stream quiet for the
/// session, and a stream only the peer held (its own, written while it was
/// cut off) never came. Now a stream the peer's marks show ahead of ours
/// for longer than the lag allowed, not asked quiet, is asked loud again.
#[test]
fn a_lost_loud_is_asked_again_and_the_stream_comes() {
    let mut now = Instant::now();
    let mut a = Side::new(1, now);
    let mut b = Side::new(2, now);
    let mut c = Side::new(3, now);
    let b_routes = Routes::new();
    a.core = Protocol::new(a.replica.stream(), SessionConfig::default(), now)
        .with_routes(&Routes::new(), PeerDirection::Outbound);
    b.core = Protocol::new(b.replica.stream(), SessionConfig::default(), now)
        .with_routes(&b_routes, PeerDirection::Inbound);
    // B's second session, with C, shares B's table.
    let mut b_to_c = Side::new(2, now);
    b_to_c.replica = b.replica.clone();
    b_to_c.core = Protocol::new(b.replica.stream(), SessionConfig::default(), now)
        .with_routes(&b_routes, PeerDirection::Outbound);
    settle(now, &mut a, &mut b);
    settle(now, &mut c, &mut b_to_c);
    // A's stream reaches B through C first: B asks A quiet for it.
    let first = a.replica.append(&b"one"[..]).unwrap();
    c.replica
        .apply(Delta {
            events: vec![first],
            ..Delta::default()
        })
        .unwrap();
    settle(now, &mut c, &mut b_to_c);
    settle(now, &mut a, &mut b);
    assert_eq!(b.core.state().peer_quiet_streams, 0);
    assert_eq!(a.core.state().peer_quiet_streams, 1, "B asked A quiet");
    // C's session ends: B asks A loud again, and that frame is lost.
    drop(b_to_c);
    while carry_but(now, &mut b, &mut a, |kind| kind == "routes") | carry(now, &mut a, &mut b) {}
    assert_eq!(a.core.state().peer_quiet_streams, 1, "the loud was lost");
    // A writes; only A holds it. Within a few ticks B asks loud again.
    a.replica.append(&b"two"[..]).unwrap();
    run_ticks(&mut now, 10, &mut a, &mut b);
    assert_eq!(a.core.state().peer_quiet_streams, 0);
    assert_eq!(b.replica.marks().get(StreamId::new(1)), 2);
}

/// Carries every frame `from` has for `to` but the first `lose` frames of
/// kind `kind`, which are lost; whether any moved.
fn carry_losing(now: Instant, from: &mut Side, to: &mut Side, kind: &str, lose: &mut u32) -> bool {
    carry_but(now, from, to, |sent| {
        let lost = sent == kind && *lose > 0;
        *lose -= u32::from(lost);
        lost
    })
}

/// The ask for the checkpoint a hello was written against, or its
/// answer, may be lost: the dialer asks again when the hello comes again
/// (a lost ask: the acceptor re-sends its hello at the tick) or at the
/// next tick (a lost answer, the acceptor having seen the ask), and the
/// session comes up and converges.
#[test]
fn a_lost_ask_or_answer_for_the_hellos_checkpoint_is_asked_again() {
    for lost in ["checkpoint want", "checkpoint"] {
        let mut now = Instant::now();
        let mut a = Side::new(1, now);
        let mut b = Side::new(2, now);
        b.replica = churned(2, 20, 300);
        a.replica.append(&b"from a"[..]).unwrap();
        a.core = Protocol::new(a.replica.stream(), SessionConfig::default(), now)
            .with_routes(&Routes::new(), PeerDirection::Outbound);
        b.core = Protocol::new(b.replica.stream(), SessionConfig::default(), now)
            .with_routes(&Routes::new(), PeerDirection::Inbound);
        let (mut from_a, mut from_b) = (u32::from(lost == "checkpoint want"), 0);
        if lost == "checkpoint" {
            // The gossip of it after the hello, and the answer to the ask.
            from_b = 2;
        }
        for _ in 0..5 {
            while carry_losing(now, &mut a, &mut b, lost, &mut from_a)
                | carry_losing(now, &mut b, &mut a, lost, &mut from_b)
            {}
            now += Duration::from_secs(1);
            a.core.handle_timeout(now).expect("a keeps the link");
            b.core.handle_timeout(now).expect("b keeps the link");
        }
        assert_eq!((from_a, from_b), (0, 0), "{lost}: the loss happened");
        assert!(b.sent.contains_key("hello against"), "{lost}: {:?}", b.sent);
        assert_eq!(a.replica.digest(), b.replica.digest(), "{lost}");
        assert_eq!(a.replica.floor(), b.replica.floor(), "{lost}");
    }
}
