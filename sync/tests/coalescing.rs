//! A sender coalesces a trickle of events into few deltas, and never holds
//! back the first delta after a quiet period.
//!
//! - While a small delta is in flight, new events wait for its ack, or at
//!   most `send_delay` after it went, and then go in one delta: a trickle
//!   of one event every few milliseconds costs a few bytes an event, not a
//!   frame each, and no event waits longer than the send delay.
//! - With nothing in flight (a quiet period, or every delta acknowledged),
//!   a new event goes at once; an ack ends the wait at once.
//! - On a session that shares a routes table, an ack is a bare ack, the
//!   delta number alone (the sender counts what it acknowledges as held),
//!   and nothing is sent twice.
//!
//! Through the sans-I/O core on a simulated clock and a simulated link
//! (a queue per direction with a fixed one-way delay), as in `receipts.rs`.
//! The trickle's timing is drawn from a seed, printed on failure
//! (`MESHLOG_SEED=<seed>` replays it).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use meshlog_cursor::StreamId;
use meshlog_sync::frame::{self, Frame, LENGTH_PREFIX_BYTES};
use meshlog_sync::proto::Protocol;
use meshlog_sync::testkit::{self, SplitMix64};
use meshlog_sync::{PeerDirection, Routes, SessionConfig, SharedReplica};

/// One side of a simulated link.
struct Side {
    replica: SharedReplica,
    core: Protocol,
    in_transit: VecDeque<(Instant, Vec<u8>)>,
    /// Per delta sent: when, and how many events it carried.
    deltas: Vec<(Instant, usize)>,
    /// Per seq of our own stream, when a delta first carried it.
    sent_at: HashMap<u64, Instant>,
    /// Acks sent, and how many of them carried marks changes.
    acks: u64,
    acks_with_changes: u64,
}

impl Side {
    fn new(id: u64, routes: Option<(&Routes, PeerDirection)>, now: Instant) -> Side {
        let replica = SharedReplica::in_memory(StreamId::new(id));
        let mut core = Protocol::new(replica.stream(), SessionConfig::default(), now);
        if let Some((routes, direction)) = routes {
            core = core.with_routes(routes, direction);
        }
        Side {
            replica,
            core,
            in_transit: VecDeque::new(),
            deltas: Vec::new(),
            sent_at: HashMap::new(),
            acks: 0,
            acks_with_changes: 0,
        }
    }

    fn send(&mut self, now: Instant, delay: Duration) {
        while let Some(bytes) = self.core.poll_transmit(now, &self.replica).unwrap() {
            match frame::decode(&bytes).unwrap() {
                Frame::Delta { delta, .. } => {
                    self.deltas.push((now, delta.events.len()));
                    for event in &delta.events {
                        self.sent_at.entry(event.seq).or_insert(now);
                    }
                }
                Frame::Ack(receipt) => {
                    self.acks += 1;
                    self.acks_with_changes += u64::from(!receipt.marks.changes.is_empty());
                }
                Frame::BareAck(_) => self.acks += 1,
                _ => {}
            }
            self.in_transit.push_back((now + delay, bytes));
        }
    }
}

fn deliver(now: Instant, from: &mut Side, to: &mut Side) {
    while from.in_transit.front().is_some_and(|(at, _)| *at <= now) {
        let (_, bytes) = from.in_transit.pop_front().unwrap();
        testkit::hand_in(
            now,
            &mut to.core,
            &bytes[LENGTH_PREFIX_BYTES..],
            &to.replica,
        )
        .unwrap();
    }
}

/// One step of the pair at `now`: timeouts, sends, deliveries, sends.
fn step(a: &mut Side, b: &mut Side, now: Instant, delay: Duration) {
    for side in [&mut *a, &mut *b] {
        if side.core.poll_timeout() <= now {
            side.core.handle_timeout(now).unwrap();
        }
    }
    a.send(now, delay);
    b.send(now, delay);
    deliver(now, a, b);
    deliver(now, b, a);
    a.send(now, delay);
    b.send(now, delay);
}

const DELAY: Duration = Duration::from_millis(5);
const STEP: Duration = Duration::from_millis(1);

/// Two sides with their hellos crossed, at the returned time.
fn connected(routes: bool) -> (Side, Side, Instant) {
    let start = Instant::now();
    let tables = [Routes::new(), Routes::new()];
    let (mut a, mut b) = if routes {
        (
            Side::new(1, Some((&tables[0], PeerDirection::Outbound)), start),
            Side::new(2, Some((&tables[1], PeerDirection::Inbound)), start),
        )
    } else {
        (Side::new(1, None, start), Side::new(2, None, start))
    };
    let mut now = start;
    while now < start + 4 * DELAY {
        step(&mut a, &mut b, now, DELAY);
        now += STEP;
    }
    (a, b, now)
}

fn trickle(seed: u64, routes: bool) {
    let mut rng = SplitMix64::new(seed);
    let (mut a, mut b, mut now) = connected(routes);
    let send_delay = SessionConfig::default().send_delay;
    // One 32-byte event every 1 to 4 ms for a second and a half.
    let mut appended = 0u64;
    let mut next_append = now;
    let end = now + Duration::from_millis(1500);
    let mut appended_at: HashMap<u64, Instant> = HashMap::new();
    while now < end + Duration::from_millis(500) {
        if now >= next_append && now < end {
            a.replica.append(vec![7u8; 32]).unwrap();
            appended += 1;
            appended_at.insert(appended, now);
            next_append = now + Duration::from_millis(1 + rng.below(4));
        }
        step(&mut a, &mut b, now, DELAY);
        now += STEP;
    }
    assert_eq!(a.replica.digest(), b.replica.digest(), "converged");
    let deltas = a.deltas.len() as u64;
    let events_sent: u64 = a.deltas.iter().map(|&(_, events)| events as u64).sum();
    let bytes = a.core.state().bytes_sent + b.core.state().bytes_sent;
    let per_event = bytes as f64 / appended as f64;
    let waited_max = appended_at
        .iter()
        .map(|(seq, at)| a.sent_at[seq] - *at)
        .max()
        .unwrap();
    println!(
        "seed {seed:#x}, routes {routes}: {appended} events in {deltas} deltas, {} acks \
         ({} with marks), {bytes} B both ways ({per_event:.1} B an event), longest wait {waited_max:?}",
        b.acks, b.acks_with_changes
    );
    assert_eq!(events_sent, appended, "an event sent twice");
    // A delta a round trip plus the peer's ack delay (30 ms here), where
    // each event had its own before: at least five events a delta.
    assert!(
        deltas * 5 <= appended,
        "{deltas} deltas for {appended} events"
    );
    // No event waits past the send delay (and the step that serves it).
    assert!(waited_max <= send_delay + STEP, "waited {waited_max:?}");
    // Bytes: the payloads, plus per delta its frame (prefix, kind, number,
    // floor, count, a run header and each column's pieces: under 32 bytes
    // for one writer's steady events) and one ack of at most 16 bytes
    // (a receipt whose numbers are below 2^14; a bare ack is 6), plus a
    // few heartbeats.
    let ack_max = if routes { 6 } else { 16 };
    let bound = appended * 32 + deltas * (32 + ack_max) + 2 * 64;
    assert!(bytes <= bound, "{bytes} bytes, bound {bound}");
    if routes {
        assert_eq!(b.acks_with_changes, 0, "an ack carried marks");
    }
}

#[test]
fn a_trickle_goes_in_few_deltas_and_waits_at_most_the_send_delay() {
    testkit::for_each_seed(
        "a_trickle_goes_in_few_deltas_and_waits_at_most_the_send_delay",
        0xc0a1,
        3,
        |seed| {
            trickle(seed, false);
            trickle(seed, true);
        },
    );
}

/// The first event after a quiet period goes at once, with nothing in
/// flight; the next one waits while the first is in flight, until its ack
/// arrives (earlier than the send delay), and then goes at once.
#[test]
fn a_delta_after_a_quiet_period_is_not_held_and_an_ack_ends_the_wait() {
    let (mut a, mut b, mut now) = connected(false);
    // Quiet for a while: everything acknowledged.
    for _ in 0..200 {
        step(&mut a, &mut b, now, DELAY);
        now += STEP;
    }
    a.replica.append(&b"first"[..]).unwrap();
    a.send(now, DELAY);
    assert_eq!(
        a.deltas.len(),
        1,
        "the first event after quiet went at once"
    );
    let first_at = now;

    now += STEP;
    a.replica.append(&b"second"[..]).unwrap();
    a.send(now, DELAY);
    assert_eq!(
        a.deltas.len(),
        1,
        "the second waits while the first is in flight"
    );
    let send_delay = SessionConfig::default().send_delay;
    assert!(a.core.poll_timeout() <= first_at + send_delay);

    // B acks after its ack delay (20 ms); the ack arrives 5 ms later, 26 ms
    // after the first delta, and the second goes at that step.
    let ack_delay = SessionConfig::default().ack_delay;
    while a.deltas.len() == 1 {
        now += STEP;
        step(&mut a, &mut b, now, DELAY);
    }
    let waited = now - first_at;
    assert!(
        waited < send_delay,
        "waited {waited:?}: the ack did not end it"
    );
    assert!(
        waited <= DELAY * 2 + ack_delay + STEP * 2,
        "waited {waited:?}"
    );
    assert_eq!(a.deltas[1].1, 1);
}

/// On a routed session an ack is bare, unless we hold a stream the peer
/// pushes to us further than its deltas carried (another session, or
/// another path, brought it first): then the ack carries our marks, so the
/// peer does not push what we hold.
#[test]
fn an_ack_carries_marks_only_when_they_hold_news_for_the_peer() {
    let (mut a, mut b, mut now) = connected(true);
    let third = StreamId::new(3);
    // A holds three events of a third writer and pushes them to B.
    let writer = SharedReplica::in_memory(third);
    for _ in 0..3 {
        writer.append(&b"w"[..]).unwrap();
    }
    let all = writer.delta_for(&meshlog_cursor::VersionVector::new(), usize::MAX);
    a.replica.apply(all.clone()).unwrap();
    a.replica.append(&b"a1"[..]).unwrap();
    while b.acks == 0 {
        step(&mut a, &mut b, now, DELAY);
        now += STEP;
    }
    assert_eq!(
        b.acks_with_changes, 0,
        "a bare ack while B holds nothing new"
    );

    // The writer goes on; B gets its next events by another path first,
    // and then a delta from A: its ack carries B's marks.
    for _ in 0..3 {
        writer.append(&b"w"[..]).unwrap();
    }
    let newer = writer.delta_for(&b.replica.marks(), usize::MAX);
    b.replica.apply(newer.clone()).unwrap();
    a.replica.append(&b"a2"[..]).unwrap();
    let acks_before = b.acks;
    while b.acks == acks_before {
        step(&mut a, &mut b, now, DELAY);
        now += STEP;
    }
    assert_eq!(b.acks_with_changes, 1, "the ack told A what B holds");
    // When A gets those events too, it does not push them to B.
    for _ in 0..20 {
        step(&mut a, &mut b, now, DELAY);
        now += STEP;
    }
    let a_events_before: usize = a.deltas.iter().map(|&(_, events)| events).sum();
    a.replica.apply(newer).unwrap();
    for _ in 0..200 {
        step(&mut a, &mut b, now, DELAY);
        now += STEP;
    }
    let a_events: usize = a.deltas.iter().map(|&(_, events)| events).sum();
    assert_eq!(
        a_events, a_events_before,
        "A pushed what B's ack said it holds"
    );
    assert_eq!(a.replica.digest(), b.replica.digest());
}
