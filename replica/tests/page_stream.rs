//! `Replica::page_stream` (issue 25): one writer's page, the cursor's other
//! entries carried unchanged. It proves that only the paged stream's floor
//! makes a cursor stale (the answer names that stream alone and its
//! `resume` keeps the other entries), that a limit pages the stream in seq
//! order to `at_head`, and that other streams never leak into the page.

use meshlog_cursor::{LostRange, StreamId, VersionVector};
use meshlog_replica::{PageError, Replica};

fn vector(entries: &[(u64, u64)]) -> VersionVector {
    entries
        .iter()
        .map(|&(stream, seq)| (StreamId::new(stream), seq))
        .collect()
}

/// Replica 1 holding its own `a1..a3`, compacted to seq 2, and replica 2's
/// `b1, b2`.
fn two_streams() -> Replica {
    let mut a = Replica::new(StreamId::new(1));
    let mut b = Replica::new(StreamId::new(2));
    for payload in ["a1", "a2", "a3"] {
        a.append(payload.as_bytes().to_vec()).unwrap();
    }
    for payload in ["b1", "b2"] {
        b.append(payload.as_bytes().to_vec()).unwrap();
    }
    a.apply(&b.delta_for(&a.marks(), usize::MAX)).unwrap();
    a.compact(&vector(&[(1, 2)])).unwrap();
    assert_eq!(a.floor(), vector(&[(1, 2)]));
    a
}

#[test]
fn a_stream_is_paged_alone_whatever_the_other_streams_floors() {
    let replica = two_streams();
    // Stream 1's entry (0) is below its floor, but only stream 2 is read.
    let first = replica
        .page_stream(StreamId::new(2), &VersionVector::new(), 1)
        .unwrap();
    assert_eq!(first.events.len(), 1);
    assert_eq!(&first.events[0].payload[..], b"b1");
    assert_eq!(first.next, vector(&[(2, 1)]));
    assert!(!first.at_head);
    let second = replica
        .page_stream(StreamId::new(2), &first.next, 10)
        .unwrap();
    assert_eq!(&second.events[0].payload[..], b"b2");
    assert_eq!(second.events.len(), 1);
    assert_eq!(second.next, vector(&[(2, 2)]));
    assert!(second.at_head);
}

#[test]
fn a_stale_stream_names_itself_alone_and_resume_keeps_the_other_entries() {
    let replica = two_streams();
    let after = vector(&[(2, 1), (9, 4)]);
    let stale = match replica.page_stream(StreamId::new(1), &after, 10) {
        Err(PageError::Stale(stale)) => stale,
        other => panic!("expected a stale answer, got {other:?}"),
    };
    assert_eq!(
        stale.lost(),
        [LostRange {
            stream: StreamId::new(1),
            first_seq: 1,
            last_seq: 2,
        }]
    );
    assert_eq!(stale.resume(), &vector(&[(1, 2), (2, 1), (9, 4)]));
    let page = replica
        .page_stream(StreamId::new(1), stale.resume(), 10)
        .unwrap();
    assert_eq!(page.events.len(), 1);
    assert_eq!(&page.events[0].payload[..], b"a3");
    assert_eq!(page.next, vector(&[(1, 3), (2, 1), (9, 4)]));
    assert!(page.at_head);
}

#[test]
fn a_limit_above_the_bound_is_refused_before_the_floor_is_read() {
    let replica = two_streams();
    let max = replica.config().page_len_max;
    assert!(matches!(
        replica.page_stream(StreamId::new(1), &VersionVector::new(), max + 1),
        Err(PageError::LimitTooLarge { .. })
    ));
}
