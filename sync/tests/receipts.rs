//! Protocol 2's receipts, through the sans-I/O core with a simulated clock
//! and a simulated link (no task, no stream):
//!
//! - An idle heartbeat costs the same few bytes at 10, 1,000 and 10,000
//!   streams: marks travel as a difference from marks the peer holds.
//! - On a slow link (a round trip of several ticks) heartbeats re-send
//!   nothing that is still in flight.
//! - A lost delta is repaired when the ack of the next one comes back, one
//!   round trip after the loss, not at a later heartbeat.
//! - A burst of deltas is acknowledged once within the ack delay (at
//!   least every 8 deltas), and a delta after a gap at once.
//!
//! The link is a queue per direction with a fixed one-way delay; frames
//! are lost by number where a test says so. Everything is deterministic.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Event};
use meshlog_sync::frame::{self, Frame, LENGTH_PREFIX_BYTES};
use meshlog_sync::proto::Protocol;
use meshlog_sync::{testkit, SessionConfig, SharedReplica};

const TICK: Duration = Duration::from_secs(1);

/// One side of a simulated link: its replica, its core, and the frames on
/// their way to the other side (arrival time, bytes).
struct Side {
    replica: SharedReplica,
    core: Protocol,
    in_transit: VecDeque<(Instant, Vec<u8>)>,
    /// Delta frames this side sent, counted from 1, and which to drop.
    deltas_sent: u64,
    drop_deltas: Vec<u64>,
    /// Events this side sent in deltas.
    events_sent: u64,
}

impl Side {
    fn new(replica: SharedReplica, now: Instant) -> Side {
        let config = SessionConfig {
            read_timeout: Duration::from_secs(3600),
            ..SessionConfig::with_heartbeat(TICK)
        };
        Side {
            core: Protocol::new(replica.stream(), config, now),
            replica,
            in_transit: VecDeque::new(),
            deltas_sent: 0,
            drop_deltas: Vec::new(),
            events_sent: 0,
        }
    }

    /// Queues what the core has to send, to arrive after `delay`.
    fn send(&mut self, now: Instant, delay: Duration) {
        while let Some(bytes) = self.core.poll_transmit(now, &self.replica).unwrap() {
            if let Ok(Frame::Delta { delta, .. }) = frame::decode(&bytes) {
                self.deltas_sent += 1;
                if self.drop_deltas.contains(&self.deltas_sent) {
                    continue;
                }
                self.events_sent += delta.events.len() as u64;
            }
            self.in_transit.push_back((now + delay, bytes));
        }
    }
}

/// Hands `to` every frame of `from` that has arrived by `now`.
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

/// Runs the pair from `start` to `end` in steps of `step`: timeouts, sends,
/// deliveries.
fn run(a: &mut Side, b: &mut Side, start: Instant, end: Instant, step: Duration, delay: Duration) {
    let mut now = start;
    while now <= end {
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
        now += step;
    }
}

/// A replica holding one event of each of `streams` writers.
fn replica_with_streams(id: u64, streams: u64) -> SharedReplica {
    let replica = SharedReplica::in_memory(StreamId::new(id));
    let events: Vec<Event> = (0..streams)
        .map(|i| Event {
            stream: StreamId::new(1000 + i),
            seq: 1,
            lamport: 1,
            time_ms: 0,
            payload: Bytes::from_static(b"x"),
        })
        .collect();
    for chunk in events.chunks(4096) {
        replica
            .apply(Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events: chunk.to_vec(),
                seals: Vec::new(),
            })
            .unwrap();
    }
    replica
}

/// Bytes one side sends in a minute of idle heartbeats, after the pair
/// converged, between two replicas that hold `streams` streams each.
fn idle_bytes_per_minute(streams: u64) -> u64 {
    let start = Instant::now();
    let mut a = Side::new(replica_with_streams(1, streams), start);
    let mut b = Side::new(replica_with_streams(2, streams), start);
    let delay = Duration::from_millis(20);
    let step = Duration::from_millis(100);
    // Converge, and let a few heartbeats settle what each holds of the
    // other's marks.
    let settled = start + 5 * TICK;
    run(&mut a, &mut b, start, settled, step, delay);
    assert_eq!(a.replica.digest(), b.replica.digest());
    let before = a.core.state().bytes_sent;
    let minute_later = settled + Duration::from_secs(60);
    run(&mut a, &mut b, settled + step, minute_later, step, delay);
    a.core.state().bytes_sent - before
}

#[test]
fn an_idle_heartbeat_costs_the_same_few_bytes_whatever_the_stream_count() {
    let rows: Vec<(u64, u64)> = [10, 1_000, 10_000]
        .into_iter()
        .map(|streams| (streams, idle_bytes_per_minute(streams)))
        .collect();
    println!("idle heartbeat bytes per minute (streams, bytes): {rows:?}");
    for &(streams, bytes) in &rows {
        assert!(bytes < 1024, "{streams} streams: {bytes} bytes a minute");
    }
    assert!(
        rows.iter().all(|&(_, bytes)| bytes == rows[0].1),
        "not flat: {rows:?}"
    );
}

/// A replica of stream `id` that wrote `events` events of 1 KiB, at
/// lamports 1, 2, 3...
fn writer(id: u64, events: u64) -> SharedReplica {
    let replica = SharedReplica::in_memory(StreamId::new(id));
    for i in 0..events {
        replica.append_at(vec![i as u8; 1024], 0).unwrap();
    }
    replica
}

#[test]
fn heartbeats_on_a_slow_link_resend_nothing_in_flight() {
    // A one-way delay of 2.5 ticks: every delta is still in flight when
    // two or three of the peer's heartbeats arrive, each showing marks
    // without it.
    let start = Instant::now();
    let mut a = Side::new(writer(1, 200), start);
    let mut b = Side::new(SharedReplica::in_memory(StreamId::new(2)), start);
    let delay = TICK * 5 / 2;
    let step = Duration::from_millis(50);
    // The first exchange measures the round trip.
    let mut now = start + 20 * TICK;
    run(&mut a, &mut b, start, now, step, delay);
    assert_eq!(a.replica.digest(), b.replica.digest());
    let sent_before = a.events_sent;
    let duplicates_before = b.core.state().events_duplicate;
    // Then appends while the link runs: a delta goes out every tick.
    let appended = 20 * 50;
    for _ in 0..20 {
        now += step;
        for _ in 0..50 {
            a.replica.append(vec![0u8; 1024]).unwrap();
        }
        run(&mut a, &mut b, now, now + TICK, step, delay);
        now += TICK;
    }
    run(&mut a, &mut b, now + step, now + 10 * TICK, step, delay);
    assert_eq!(a.replica.digest(), b.replica.digest());
    let sent = a.events_sent - sent_before;
    let duplicates = b.core.state().events_duplicate - duplicates_before;
    println!("slow link: {sent} events sent for {appended} appended, {duplicates} duplicates");
    assert_eq!(sent, appended, "events re-sent while in flight");
    assert_eq!(duplicates, 0);
}

#[test]
fn a_lost_delta_is_repaired_one_round_trip_after_the_next_is_acked() {
    let start = Instant::now();
    // Three deltas' worth at a 4 KiB budget: the second is lost.
    let mut a = Side::new(writer(1, 12), start);
    let config = SessionConfig {
        delta_bytes_max: 4 * 1024,
        read_timeout: Duration::from_secs(3600),
        ..SessionConfig::with_heartbeat(TICK)
    };
    a.core = Protocol::new(StreamId::new(1), config, start);
    a.drop_deltas = vec![2];
    let mut b = Side::new(SharedReplica::in_memory(StreamId::new(2)), start);
    let delay = Duration::from_millis(50);
    let step = Duration::from_millis(10);
    // Well within a tick: no heartbeat, no retransmission timeout helps.
    let until = start + Duration::from_millis(400);
    let mut now = start;
    let mut converged_at = None;
    while now <= until {
        run(&mut a, &mut b, now, now, step, delay);
        if converged_at.is_none() && a.replica.digest() == b.replica.digest() {
            converged_at = Some(now - start);
        }
        now += step;
    }
    let converged_at = converged_at.expect("repaired before the first heartbeat");
    println!("a lost delta repaired; converged after {converged_at:?}");
    // Hellos cross (one way), deltas 1 and 3 go out (one way), the ack of
    // 3 comes back (one way), the repair goes out (one way): four delays.
    assert!(converged_at <= 4 * delay + 4 * step, "{converged_at:?}");
    assert!(a.deltas_sent >= 4, "the lost delta was sent again");
}

/// Counts the receipts among frames sent (acks, and heartbeats, which a
/// repair goes out as): (receipts, the highest delta number any of them
/// acknowledged).
fn acks_in(bytes: &[Vec<u8>]) -> (usize, u64) {
    let mut acks = 0;
    let mut received = 0;
    for raw in bytes {
        if let Ok(Frame::Ack(receipt) | Frame::Heartbeat(receipt)) = frame::decode(raw) {
            acks += 1;
            received = received.max(receipt.received);
        }
    }
    (acks, received)
}

/// A burst of small deltas is acknowledged once, within the ack delay,
/// where each delta used to get its own receipt; at least every 8 deltas;
/// and a delta arriving after a gap in the numbers is acknowledged at
/// once, so the delay never holds up a repair.
#[test]
fn a_burst_of_deltas_is_acknowledged_once_and_a_gap_at_once() {
    let start = Instant::now();
    let a = SharedReplica::in_memory(StreamId::new(1));
    let b = SharedReplica::in_memory(StreamId::new(2));
    let mut a = Side::new(a, start);
    let mut b = Side::new(b, start);
    // Each append its own delta: the sender's coalescing is
    // `coalescing.rs`'s.
    a.core = Protocol::new(
        a.replica.stream(),
        SessionConfig {
            send_delay: Duration::ZERO,
            read_timeout: Duration::from_secs(3600),
            ..SessionConfig::with_heartbeat(TICK)
        },
        start,
    );
    let delay = Duration::from_millis(5);
    let ack_delay = SessionConfig::default().ack_delay;
    assert_eq!(ack_delay, Duration::from_millis(20));
    // Hellos cross.
    run(
        &mut a,
        &mut b,
        start,
        start + delay * 2,
        Duration::from_millis(1),
        delay,
    );
    // A appends 5 events one at a time, each sent as its own delta at once.
    let mut now = start + delay * 3;
    for i in 0..5u8 {
        a.replica.append(vec![i]).unwrap();
        a.send(now, delay);
        now += Duration::from_millis(1);
    }
    assert_eq!(a.deltas_sent, 5);
    // B takes them as they arrive: no ack yet, one due within the delay.
    let arrive = now + delay;
    deliver(arrive, &mut a, &mut b);
    let mut sent = Vec::new();
    while let Some(bytes) = b.core.poll_transmit(arrive, &b.replica).unwrap() {
        sent.push(bytes);
    }
    assert_eq!(acks_in(&sent).0, 0, "acked before the delay");
    let due = b.core.poll_timeout();
    assert!(due <= arrive + ack_delay, "{:?}", due - arrive);
    b.core.handle_timeout(due).unwrap();
    while let Some(bytes) = b.core.poll_transmit(due, &b.replica).unwrap() {
        sent.push(bytes);
    }
    assert_eq!(acks_in(&sent), (1, 5), "one ack for the burst");

    // Eight deltas in a row: acknowledged at once, without waiting.
    let mut now = due + Duration::from_millis(1);
    for i in 0..8u8 {
        a.replica.append(vec![i]).unwrap();
        a.send(now, delay);
        now += Duration::from_micros(10);
    }
    deliver(now + delay, &mut a, &mut b);
    let mut sent = Vec::new();
    while let Some(bytes) = b.core.poll_transmit(now + delay, &b.replica).unwrap() {
        sent.push(bytes);
    }
    assert_eq!(acks_in(&sent), (1, 13), "every 8 deltas at once");

    // Deltas 14, 15 and 16, with 15 lost: 14 waits for the delay, 16
    // arrives after a gap and is acknowledged at once.
    a.drop_deltas.push(15);
    let mut now = now + delay * 2;
    for i in 0..3u8 {
        a.replica.append(vec![i]).unwrap();
        a.send(now, delay);
        now += Duration::from_micros(10);
    }
    assert_eq!(a.deltas_sent, 16);
    deliver(now + delay, &mut a, &mut b);
    let mut sent = Vec::new();
    while let Some(bytes) = b.core.poll_transmit(now + delay, &b.replica).unwrap() {
        sent.push(bytes);
    }
    assert_eq!(acks_in(&sent), (1, 16), "a gap is acknowledged at once");
}
