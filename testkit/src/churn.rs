//! Replicas after writer churn: live writers' streams beside retired
//! ones compacted to their head, for the tests that measure what a
//! retired writer costs a link (`sync/core/tests/quiet_links.rs`,
//! `sync/tests/dialer_hello.rs`).

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Event, SharedReplica};

/// A stream id spread over 64 bits, as a writer's key-derived id is (the
/// varint of one is 9 or 10 bytes, as in a real mesh).
pub fn spread(i: u64) -> StreamId {
    StreamId::new((i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1 << 63)
}

/// A replica of stream `own` holding `live` writers' streams (one event
/// each, `spread(0..live)`) and `retired` writers' streams (three events
/// each, compacted to their head: retired and compacted), and a
/// checkpoint minted from its marks.
///
/// # Panics
/// If the replica refuses the events, the compaction or the mint (a
/// test's setup failing).
pub fn churned(own: u64, live: u64, retired: u64) -> SharedReplica {
    let replica = SharedReplica::in_memory(StreamId::new(own));
    let event = |stream, seq| Event {
        stream,
        seq,
        lamport: seq,
        time_ms: 0,
        payload: Bytes::from_static(b"w"),
    };
    let mut events: Vec<Event> = (0..live).map(|i| event(spread(i), 1)).collect();
    for i in 0..retired {
        events.extend((1..=3).map(|seq| event(spread(1_000_000 + i), seq)));
    }
    replica
        .apply(Delta {
            events,
            ..Delta::default()
        })
        .expect("the churned replica takes its events");
    let retired: VersionVector = (0..retired).map(|i| (spread(1_000_000 + i), 3)).collect();
    replica
        .compact(&retired)
        .expect("the churned replica compacts its retired streams");
    replica
        .mint_checkpoint(1_700_000_000_000)
        .expect("the churned replica mints");
    replica
}
