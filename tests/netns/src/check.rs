//! The checker: reads one schedule's history after the run and judges it,
//! the way Jepsen judges a database: from what clients were told, not from
//! the nodes' insides.
//!
//! What it demands:
//!
//! - **No lost append.** Every event a `201` acknowledged is in every node's
//!   final log (read to the end after the final heal) with the payload that
//!   was sent, unless that node's floor covers it (compacted, which a stale
//!   reader would be told).
//! - **No refused append appears.** An append that was definitely refused
//!   (connection refused, `4xx`, `503`) is in no node's final log.
//! - **Final logs agree and have no holes.** Each node holds each stream as
//!   `floor+1 ..= head` with no seq missing or repeated; all nodes hold the
//!   same events.
//! - **No event twice to a reader.** Across all of a reader's pages, on
//!   whichever nodes it hopped to, no `(stream, seq)` comes back twice.
//! - **Every walk is complete.** A reader that reached the head after the
//!   heal was given every event of every stream exactly once, or was told
//!   by a `410` that it was lost; never both, never neither.
//! - **Pages are in order.** Within a page, `(lamport, stream)` strictly
//!   ascends (`docs/HTTP.md`).
//! - **Convergence.** All nodes reported one digest within the bound after
//!   the last heal.
//! - **Chain heads agree.** The nodes' final chain heads (`GET /marks`'s
//!   `chains`) list the same streams at the same heads, with equal chain
//!   hashes wherever both nodes hold the stream anchored
//!   ([`chains_agree`]), whatever each compacted.
//! - **No forgery.** Every event a node holds or a reader is given carries
//!   a payload an honest writer sent, in that writer's stream; no node's
//!   floor lies past what a compaction could set (its stream's head minus
//!   the smallest `keep_last`; no floor at all without a compaction).
//! - **With the hostile node** (`--hostile-node`): no forged event was
//!   acknowledged and held by a node, and every kind of forgery was
//!   refused (an unsealed first run: cut; a floor: acknowledged) at least
//!   once, so the run shows it was really tried.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::history::{AppendOutcome, Event, Forgery, ForgeryOutcome, PageOutcome, Record};

/// Whether two `GET /marks` `chains` objects agree: the same streams at
/// the same heads, and equal chain hashes wherever both are non-null (a
/// `null` hash is a stream the node holds unanchored: it counts by its
/// head alone). Answers what differs, in words.
pub fn chains_agree(a: &serde_json::Value, b: &serde_json::Value) -> Result<(), String> {
    let streams = |v: &serde_json::Value| v["streams"].as_object().cloned();
    let (Some(a), Some(b)) = (streams(a), streams(b)) else {
        return Err("a chains object without streams".into());
    };
    for (stream, left) in &a {
        let Some(right) = b.get(stream) else {
            return Err(format!("stream {stream} is listed on one node only"));
        };
        if left["head"] != right["head"] {
            return Err(format!(
                "stream {stream} heads {} and {}",
                left["head"], right["head"]
            ));
        }
        if let (Some(x), Some(y)) = (left["hash"].as_str(), right["hash"].as_str()) {
            if x != y {
                return Err(format!(
                    "stream {stream} at head {}: chain hashes {x} and {y}",
                    left["head"]
                ));
            }
        }
    }
    match b.keys().find(|stream| !a.contains_key(*stream)) {
        Some(stream) => Err(format!("stream {stream} is listed on one node only")),
        None => Ok(()),
    }
}

/// Every pair of nodes' final chain heads agree ([`chains_agree`]); a
/// history recorded before nodes answered them has none to compare.
fn check_chains(records: &[Record], violations: &mut Vec<Violation>) {
    let chains: Vec<(usize, &serde_json::Value)> = records
        .iter()
        .filter_map(|record| match record {
            Record::Final { node, chains, .. } if !chains.is_null() => Some((*node, chains)),
            _ => None,
        })
        .collect();
    for (i, (node, left)) in chains.iter().enumerate() {
        for (other, right) in &chains[i + 1..] {
            if let Err(detail) = chains_agree(left, right) {
                violations.push(Violation::ChainsDiffer {
                    node: *node,
                    other: *other,
                    detail,
                });
            }
        }
    }
}

/// `(stream, seq)`, the stream parsed from its decimal text.
pub type EventId = (u64, u64);

/// A node's final log (id -> payload) and its floor (stream -> seq).
type FinalLog = (BTreeMap<EventId, String>, BTreeMap<u64, u64>);

/// One thing the history shows went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// An acknowledged event is not in a node's final log.
    Lost {
        /// The node missing it.
        node: usize,
        /// The event.
        id: EventId,
    },
    /// A node's final log, a page or a second acknowledgement shows a
    /// payload other than the one acknowledged for this event.
    WrongPayload {
        /// Where it was seen (`node 2`, `reader 1`, `ack`).
        seen_by: String,
        /// The event.
        id: EventId,
    },
    /// A definitely refused append (connection refused, `4xx`, `503`)
    /// shows up in a node's final log anyway.
    RefusedButApplied {
        /// The node holding it.
        node: usize,
        /// The payload.
        payload: String,
    },
    /// A node's final log has a hole or a repeat in a stream.
    FinalNotPrefix {
        /// The node.
        node: usize,
        /// The stream.
        stream: u64,
    },
    /// Two nodes' final logs differ.
    Diverged {
        /// One node.
        node: usize,
        /// The other.
        other: usize,
    },
    /// A reader was given an event twice.
    Duplicate {
        /// The reader.
        reader: usize,
        /// The event.
        id: EventId,
    },
    /// A reader's walk ended at the head without the event, and no `410`
    /// reported it lost.
    Skipped {
        /// The reader.
        reader: usize,
        /// The event.
        id: EventId,
    },
    /// A reader was given an event a `410` also reported lost.
    SeenAndStale {
        /// The reader.
        reader: usize,
        /// The event.
        id: EventId,
    },
    /// A reader was given an event no node holds after the heal.
    Phantom {
        /// The reader.
        reader: usize,
        /// The event.
        id: EventId,
    },
    /// Within one page, `(lamport, stream)` did not strictly ascend.
    OutOfOrder {
        /// The reader.
        reader: usize,
        /// The page's index among the reader's successful pages.
        page: usize,
        /// The event that came too early or too late.
        id: EventId,
    },
    /// A reader's walk never reached the head after the heal.
    ReaderUnfinished {
        /// The reader.
        reader: usize,
    },
    /// A node could not be read to the end after the heal.
    FinalUnread {
        /// The node.
        node: usize,
    },
    /// The nodes' digests were not equal within the bound after the heal.
    NotConverged,
    /// Two nodes' final chain heads disagree on a stream: another head, or
    /// another chain hash where both hold it anchored.
    ChainsDiffer {
        /// The first node.
        node: usize,
        /// The other node.
        other: usize,
        /// What differs, in words.
        detail: String,
    },
    /// An event no honest writer sent (its payload was never sent, or was
    /// sent by another stream's writer) is held by a node or was given to
    /// a reader.
    Forged {
        /// Where it was seen (`node 2`, `reader 1`).
        seen_by: String,
        /// The event.
        id: EventId,
        /// Its payload.
        payload: String,
    },
    /// A node's floor on a stream lies past anything a compaction could
    /// have set: events were erased without authority.
    Erased {
        /// The node.
        node: usize,
        /// The stream.
        stream: u64,
        /// The node's floor.
        floor: u64,
        /// The highest floor a compaction could have set.
        bound: u64,
    },
    /// A node acknowledged a forged event (applied the delta carrying it).
    ForgeryTaken {
        /// The node.
        node: usize,
        /// What was forged.
        forgery: Forgery,
        /// The event forged or altered.
        id: EventId,
    },
    /// The hostile node never had a forgery of this kind refused (or, for
    /// an unsealed first run, cut; for a floor, acknowledged and ignored):
    /// the run does not show it was tried.
    ForgeryUntried {
        /// The kind.
        forgery: Forgery,
    },
    /// A stream id in the history is not a decimal `u64`.
    BadStream {
        /// The text.
        stream: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = |(stream, seq): &EventId| format!("stream {stream} seq {seq}");
        match self {
            Violation::Lost { node, id: e } => {
                write!(f, "lost: acknowledged {} missing on node {node}", id(e))
            }
            Violation::WrongPayload { seen_by, id: e } => {
                write!(f, "wrong payload: {} as seen by {seen_by}", id(e))
            }
            Violation::RefusedButApplied { node, payload } => {
                write!(f, "append {payload:?} was refused but node {node} holds it")
            }
            Violation::FinalNotPrefix { node, stream } => {
                write!(
                    f,
                    "node {node} holds stream {stream} with a hole or a repeat"
                )
            }
            Violation::Diverged { node, other } => {
                write!(f, "nodes {node} and {other} hold different logs")
            }
            Violation::Duplicate { reader, id: e } => {
                write!(f, "duplicate: reader {reader} was given {} twice", id(e))
            }
            Violation::Skipped { reader, id: e } => write!(
                f,
                "skipped: reader {reader} never got {} and was not told it was lost",
                id(e)
            ),
            Violation::SeenAndStale { reader, id: e } => write!(
                f,
                "reader {reader} got {} and was also told it was lost",
                id(e)
            ),
            Violation::Phantom { reader, id: e } => {
                write!(f, "phantom: reader {reader} got {} no node holds", id(e))
            }
            Violation::OutOfOrder {
                reader,
                page,
                id: e,
            } => write!(
                f,
                "out of order: reader {reader} page {page} has {} out of (lamport, stream) order",
                id(e)
            ),
            Violation::ReaderUnfinished { reader } => {
                write!(f, "reader {reader} never reached the head after the heal")
            }
            Violation::FinalUnread { node } => {
                write!(f, "node {node} could not be read to the end after the heal")
            }
            Violation::NotConverged => write!(f, "digests not equal within the bound"),
            Violation::ChainsDiffer {
                node,
                other,
                detail,
            } => write!(
                f,
                "nodes {node} and {other} differ in chain heads: {detail}"
            ),
            Violation::Forged { .. }
            | Violation::Erased { .. }
            | Violation::ForgeryTaken { .. }
            | Violation::ForgeryUntried { .. } => self.fmt_forgery(f),
            Violation::BadStream { stream } => write!(f, "stream id {stream:?} is not a u64"),
        }
    }
}

impl Violation {
    /// The forgery rules' violations, in words.
    fn fmt_forgery(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = |(stream, seq): &EventId| format!("stream {stream} seq {seq}");
        match self {
            Violation::Forged {
                seen_by,
                id: e,
                payload,
            } => write!(
                f,
                "forged: {} with payload {payload:?}, which no honest writer of that stream sent, as seen by {seen_by}",
                id(e)
            ),
            Violation::Erased {
                node,
                stream,
                floor,
                bound,
            } => write!(
                f,
                "erased: node {node}'s floor on stream {stream} is {floor}, past the {bound} a compaction could set"
            ),
            Violation::ForgeryTaken {
                node,
                forgery,
                id: e,
            } => write!(
                f,
                "forgery taken: node {node} acknowledged {forgery:?} at {}",
                id(e)
            ),
            Violation::ForgeryUntried { forgery } => write!(
                f,
                "forgery untried: the hostile node never had {forgery:?} {}",
                forgery.answer_word()
            ),
            _ => Ok(()),
        }
    }
}

/// What the checker counted and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Events acknowledged by a `201`.
    pub acknowledged: usize,
    /// Append requests with no answer (their events may or may not exist).
    pub unknown_appends: usize,
    /// Events held by the nodes after the heal (one node's count).
    pub final_events: usize,
    /// Event checks made: acknowledged events looked up on every node, plus
    /// every event every reader was given.
    pub checked: usize,
    /// Successful pages.
    pub pages: usize,
    /// `410` answers.
    pub stale_pages: usize,
    /// Faults applied (records whose action is neither a heal nor the
    /// final compaction).
    pub faults: usize,
    /// Milliseconds from the final heal to equal digests (the first
    /// measurement, links possibly still impaired).
    pub converged_ms: Option<u64>,
    /// Per kind of forgery the hostile node sent: `(sent, shown)`, sent
    /// on a session (tried and answered, or not), and shown answered as
    /// it must be (an event refused, a floor acknowledged).
    pub forgeries: BTreeMap<Forgery, (usize, usize)>,
    /// What went wrong; empty when the history passes.
    pub violations: Vec<Violation>,
}

impl Verdict {
    /// Whether the history passed every check.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

fn parse_stream(text: &str, violations: &mut Vec<Violation>) -> Option<u64> {
    match text.parse() {
        Ok(stream) => Some(stream),
        Err(_) => {
            violations.push(Violation::BadStream {
                stream: text.to_owned(),
            });
            None
        }
    }
}

/// Judges one schedule's history.
pub fn check(records: &[Record]) -> Verdict {
    let mut verdict = Verdict::default();
    let mut violations = Vec::new();
    // First, so that a forgery a node took is named before what follows
    // from it (divergence, lost and forged events).
    check_forgeries(records, &mut verdict.forgeries, &mut violations);

    // What was acknowledged: id -> payload; and what was refused.
    let mut acked: BTreeMap<EventId, String> = BTreeMap::new();
    let mut refused: BTreeSet<&str> = BTreeSet::new();
    for record in records {
        match record {
            Record::Append {
                payloads, outcome, ..
            } => match outcome {
                AppendOutcome::Ok { events } => {
                    for (ack, payload) in events.iter().zip(payloads) {
                        let Some(stream) = parse_stream(&ack.stream, &mut violations) else {
                            continue;
                        };
                        let id = (stream, ack.seq);
                        verdict.acknowledged += 1;
                        if let Some(earlier) = acked.insert(id, payload.clone()) {
                            if &earlier != payload {
                                violations.push(Violation::WrongPayload {
                                    seen_by: "a second acknowledgement".into(),
                                    id,
                                });
                            }
                        }
                    }
                }
                AppendOutcome::Unknown { .. } => verdict.unknown_appends += 1,
                AppendOutcome::Failed { .. } => {
                    refused.extend(payloads.iter().map(String::as_str));
                }
            },
            Record::Fault { action, .. }
                if !action.starts_with("heal") && !action.starts_with("final") =>
            {
                verdict.faults += 1
            }
            Record::Converged { after_heal_ms, .. } if verdict.converged_ms.is_none() => {
                verdict.converged_ms = *after_heal_ms
            }
            _ => {}
        }
    }
    // The last measurement is the one that counts: the earlier ones may
    // have been taken on impaired links, or before the final compaction
    // (comparing marks); the last must find equal digests.
    let last_converged = records.iter().rev().find_map(|r| match r {
        Record::Converged {
            after_heal_ms,
            compared,
            ..
        } => Some((*after_heal_ms, compared.as_str())),
        _ => None,
    });
    if !matches!(last_converged, Some((Some(_), "digest"))) {
        violations.push(Violation::NotConverged);
    }

    // The nodes' final logs: id -> payload, and floors.
    let mut finals: BTreeMap<usize, FinalLog> = BTreeMap::new();
    for record in records {
        match record {
            Record::Final {
                node,
                events,
                floor,
                ..
            } => {
                let mut held = BTreeMap::new();
                let mut floors = BTreeMap::new();
                for (stream, seq) in floor {
                    if let Some(stream) = parse_stream(stream, &mut violations) {
                        floors.insert(stream, *seq);
                    }
                }
                let mut per_stream: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
                for event in events {
                    let Some(stream) = parse_stream(&event.stream, &mut violations) else {
                        continue;
                    };
                    held.insert((stream, event.seq), event.payload.clone());
                    per_stream.entry(stream).or_default().push(event.seq);
                }
                for (stream, mut seqs) in per_stream {
                    seqs.sort_unstable();
                    let first = floors.get(&stream).copied().unwrap_or(0) + 1;
                    let expected: Vec<u64> = (first..first + seqs.len() as u64).collect();
                    if seqs != expected {
                        violations.push(Violation::FinalNotPrefix {
                            node: *node,
                            stream,
                        });
                    }
                }
                finals.insert(*node, (held, floors));
            }
            Record::FinalFailed { node, .. } => {
                violations.push(Violation::FinalUnread { node: *node });
            }
            _ => {}
        }
    }
    for (node, (held, _)) in &finals {
        for payload in held.values() {
            if refused.contains(payload.as_str()) {
                violations.push(Violation::RefusedButApplied {
                    node: *node,
                    payload: payload.clone(),
                });
            }
        }
    }
    check_chains(records, &mut violations);
    check_forged(records, &mut violations);
    check_floors(records, &finals, &mut violations);
    if let Some((first_node, (first_held, _))) = finals.iter().next() {
        verdict.final_events = first_held.len();
        for (node, (held, _)) in finals.iter().skip(1) {
            if held != first_held {
                violations.push(Violation::Diverged {
                    node: *first_node,
                    other: *node,
                });
            }
        }
    }
    for (id, payload) in &acked {
        for (node, (held, floors)) in &finals {
            verdict.checked += 1;
            match held.get(id) {
                Some(found) if found == payload => {}
                Some(_) => violations.push(Violation::WrongPayload {
                    seen_by: format!("node {node}"),
                    id: *id,
                }),
                None if floors.get(&id.0).is_some_and(|floor| id.1 <= *floor) => {}
                None => violations.push(Violation::Lost {
                    node: *node,
                    id: *id,
                }),
            }
        }
    }
    // Every event that exists after the heal: per stream, seqs 1..=head
    // (compacted ones included: a walk must have got them or been told).
    let mut heads: BTreeMap<u64, u64> = BTreeMap::new();
    let mut payloads: BTreeMap<EventId, String> = acked.clone();
    for (held, floors) in finals.values() {
        for ((stream, seq), payload) in held {
            let head = heads.entry(*stream).or_default();
            *head = (*head).max(*seq);
            payloads.entry((*stream, *seq)).or_insert(payload.clone());
        }
        for (stream, floor) in floors {
            let head = heads.entry(*stream).or_default();
            *head = (*head).max(*floor);
        }
    }

    // Readers.
    let readers: BTreeSet<usize> = records
        .iter()
        .filter_map(|r| match r {
            Record::Page { reader, .. } | Record::ReaderDone { reader, .. } => Some(*reader),
            _ => None,
        })
        .collect();
    for reader in readers {
        let mut seen: BTreeSet<EventId> = BTreeSet::new();
        let mut told_lost: BTreeSet<(u64, u64, u64)> = BTreeSet::new();
        let mut page_index = 0;
        let mut finished = false;
        for record in records {
            match record {
                Record::Page {
                    reader: r, outcome, ..
                } if *r == reader => match outcome {
                    PageOutcome::Ok { events, .. } => {
                        verdict.pages += 1;
                        check_page(
                            reader,
                            page_index,
                            events,
                            &payloads,
                            &mut seen,
                            &mut verdict.checked,
                            &mut violations,
                        );
                        page_index += 1;
                    }
                    PageOutcome::Stale { lost, .. } => {
                        verdict.stale_pages += 1;
                        for range in lost {
                            if let Some(stream) = parse_stream(&range.stream, &mut violations) {
                                told_lost.insert((stream, range.first, range.last));
                            }
                        }
                    }
                    PageOutcome::Error { .. } => {}
                },
                Record::ReaderDone {
                    reader: r, at_head, ..
                } if *r == reader => finished = *at_head,
                _ => {}
            }
        }
        let is_lost = |(stream, seq): EventId| {
            told_lost
                .iter()
                .any(|&(s, first, last)| s == stream && (first..=last).contains(&seq))
        };
        for id in &seen {
            if is_lost(*id) {
                violations.push(Violation::SeenAndStale { reader, id: *id });
            }
            if heads.get(&id.0).is_none_or(|head| id.1 > *head) {
                violations.push(Violation::Phantom { reader, id: *id });
            }
        }
        if !finished {
            violations.push(Violation::ReaderUnfinished { reader });
            continue;
        }
        for (stream, head) in &heads {
            for seq in 1..=*head {
                let id = (*stream, seq);
                if !seen.contains(&id) && !is_lost(id) {
                    violations.push(Violation::Skipped { reader, id });
                }
            }
        }
    }
    verdict.violations = violations;
    verdict
}

/// No node holds, and no reader was given, an event whose payload no
/// writer sent, or sent for another stream than the event's
/// ([`Violation::Forged`]). A writer's stream is its node's (the start
/// record); payloads are unique in a run.
fn check_forged(records: &[Record], violations: &mut Vec<Violation>) {
    let streams: Vec<&str> = records
        .iter()
        .find_map(|r| match r {
            Record::Start { nodes, .. } => Some(nodes.iter().map(|n| n.stream.as_str()).collect()),
            _ => None,
        })
        .unwrap_or_default();
    let mut sent: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    for record in records {
        if let Record::Append {
            writer, payloads, ..
        } = record
        {
            for payload in payloads {
                sent.insert(payload, streams.get(*writer).copied());
            }
        }
    }
    let mut judge = |seen_by: String, event: &Event| {
        let honest = match sent.get(event.payload.as_str()) {
            None => false,
            Some(stream) => stream.is_none_or(|stream| stream == event.stream),
        };
        if !honest {
            violations.push(Violation::Forged {
                seen_by,
                id: (event.stream.parse().unwrap_or(0), event.seq),
                payload: event.payload.clone(),
            });
        }
    };
    for record in records {
        match record {
            Record::Final { node, events, .. } => {
                events.iter().for_each(|e| judge(format!("node {node}"), e))
            }
            Record::Page {
                reader,
                outcome: PageOutcome::Ok { events, .. },
                ..
            } => events
                .iter()
                .for_each(|e| judge(format!("reader {reader}"), e)),
            _ => {}
        }
    }
}

/// No node's floor lies past what a compaction could set
/// ([`Violation::Erased`]): a compaction keeps each stream's last
/// `keep_last` events (and a floor learned from a peer is that peer's), so
/// a floor is at most the stream's highest head minus the smallest
/// `keep_last` the history's compactions used; without one, 0.
fn check_floors(
    records: &[Record],
    finals: &BTreeMap<usize, FinalLog>,
    violations: &mut Vec<Violation>,
) {
    let keep_min = records
        .iter()
        .filter_map(|r| match r {
            Record::Fault { action, .. } => action
                .split("keep_last ")
                .nth(1)?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok(),
            _ => None,
        })
        .min();
    let mut heads: BTreeMap<u64, u64> = BTreeMap::new();
    for (held, _) in finals.values() {
        for (stream, seq) in held.keys() {
            let head = heads.entry(*stream).or_default();
            *head = (*head).max(*seq);
        }
    }
    for (node, (_, floors)) in finals {
        for (stream, floor) in floors {
            let head = heads.get(stream).copied().unwrap_or(0);
            let bound = keep_min.map_or(0, |keep| head.saturating_sub(keep));
            if *floor > bound {
                violations.push(Violation::Erased {
                    node: *node,
                    stream: *stream,
                    floor: *floor,
                    bound,
                });
            }
        }
    }
}

/// The hostile node's attempts: no forged event acknowledged (for an
/// unsealed first run, acknowledged and held: [`ForgeryOutcome::Cut`] is
/// acknowledged with nothing held) ([`Violation::ForgeryTaken`]), and, in
/// a run the start record marks hostile, every kind refused (an unsealed
/// first run: cut; a floor: acknowledged) at least once
/// ([`Violation::ForgeryUntried`]; but the stolen key's forgery, which a
/// node cannot refuse: it is planted to be taken).
fn check_forgeries(
    records: &[Record],
    counts: &mut BTreeMap<Forgery, (usize, usize)>,
    violations: &mut Vec<Violation>,
) {
    let hostile = records
        .iter()
        .any(|r| matches!(r, Record::Start { hostile: true, .. }));
    let mut shown: BTreeSet<Forgery> = BTreeSet::new();
    for record in records {
        let Record::Forgery {
            node,
            forgery,
            stream,
            seq,
            outcome,
            ..
        } = record
        else {
            continue;
        };
        if forgery.is_event() && *outcome == ForgeryOutcome::Acknowledged {
            violations.push(Violation::ForgeryTaken {
                node: *node,
                forgery: *forgery,
                id: (stream.parse().unwrap_or(0), *seq),
            });
        }
        let count = counts.entry(*forgery).or_default();
        if !matches!(
            outcome,
            ForgeryOutcome::NoSession { .. } | ForgeryOutcome::NotTried { .. }
        ) {
            count.0 += 1;
        }
        if forgery.shown_by(outcome) {
            count.1 += 1;
            shown.insert(*forgery);
        }
    }
    if !hostile {
        return;
    }
    for forgery in Forgery::ALL {
        if forgery != Forgery::StolenKey && !shown.contains(&forgery) {
            violations.push(Violation::ForgeryUntried { forgery });
        }
    }
}

fn check_page(
    reader: usize,
    page: usize,
    events: &[Event],
    payloads: &BTreeMap<EventId, String>,
    seen: &mut BTreeSet<EventId>,
    checked: &mut usize,
    violations: &mut Vec<Violation>,
) {
    let mut previous: Option<(u64, u64)> = None;
    for event in events {
        let Some(stream) = parse_stream(&event.stream, violations) else {
            continue;
        };
        let id = (stream, event.seq);
        *checked += 1;
        let key = (event.lamport, stream);
        if previous.is_some_and(|previous| previous >= key) {
            violations.push(Violation::OutOfOrder { reader, page, id });
        }
        previous = Some(key);
        if !seen.insert(id) {
            violations.push(Violation::Duplicate { reader, id });
        }
        if payloads.get(&id).is_some_and(|p| p != &event.payload) {
            violations.push(Violation::WrongPayload {
                seen_by: format!("reader {reader}"),
                id,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    //! Synthetic histories, each with one planted fault, and the violation
    //! the checker must name for it; plus the clean history it must pass.

    use super::*;
    use crate::history::{Ack, LostRange, NodeInfo};

    fn event(stream: u64, seq: u64, lamport: u64) -> Event {
        Event {
            stream: stream.to_string(),
            seq,
            lamport,
            payload: format!("p{stream}-{seq}"),
        }
    }

    fn append(stream: u64, seq: u64, lamport: u64) -> Record {
        Record::Append {
            t_ms: 0,
            writer: stream as usize,
            node: stream as usize,
            payloads: vec![format!("p{stream}-{seq}")],
            outcome: AppendOutcome::Ok {
                events: vec![Ack {
                    stream: stream.to_string(),
                    seq,
                    lamport,
                }],
            },
        }
    }

    fn page(reader: usize, events: Vec<Event>) -> Record {
        Record::Page {
            t_ms: 0,
            reader,
            node: 0,
            after: String::new(),
            outcome: PageOutcome::Ok {
                events,
                next: "t".into(),
                at_head: false,
                behind: false,
            },
        }
    }

    fn final_log(node: usize, events: Vec<Event>) -> Record {
        Record::Final {
            node,
            events,
            floor: BTreeMap::new(),
            digest: serde_json::Value::Null,
            chains: serde_json::Value::Null,
        }
    }

    /// Two streams, three events: `1:1@1`, `2:1@1`, `1:2@2`, held by two
    /// nodes, walked by one reader in two pages.
    fn clean() -> Vec<Record> {
        let all = vec![event(1, 1, 1), event(2, 1, 1), event(1, 2, 2)];
        vec![
            Record::Start {
                seed: 1,
                nodes: vec![NodeInfo {
                    name: "n1".into(),
                    url: "http://10.77.0.11:7070".into(),
                    stream: "1".into(),
                }],
                hostile: false,
            },
            append(1, 1, 1),
            append(2, 1, 1),
            append(1, 2, 2),
            Record::Fault {
                t_ms: 1,
                action: "isolate n1".into(),
            },
            Record::Fault {
                t_ms: 2,
                action: "heal".into(),
            },
            page(0, vec![event(1, 1, 1), event(2, 1, 1)]),
            page(0, vec![event(1, 2, 2)]),
            Record::Converged {
                after_heal_ms: Some(120),
                under_impairment: false,
                compared: "digest".into(),
            },
            Record::ReaderDone {
                reader: 0,
                at_head: true,
            },
            final_log(0, all.clone()),
            final_log(1, all),
        ]
    }

    fn violations(records: &[Record]) -> Vec<Violation> {
        check(records).violations
    }

    #[test]
    fn a_clean_history_passes_and_is_counted() {
        let verdict = check(&clean());
        assert_eq!(verdict.violations, vec![]);
        assert_eq!(verdict.acknowledged, 3);
        assert_eq!(verdict.final_events, 3);
        assert_eq!(verdict.faults, 1);
        assert_eq!(verdict.pages, 2);
        // 3 acks on 2 nodes, 3 events given to the reader.
        assert_eq!(verdict.checked, 9);
        assert_eq!(verdict.converged_ms, Some(120));
    }

    #[test]
    fn a_lost_acknowledged_append_is_named_per_node() {
        let mut records = clean();
        // Node 1 never got 1:2, and neither did the reader's walk.
        records[11] = final_log(1, vec![event(1, 1, 1), event(2, 1, 1)]);
        let found = violations(&records);
        assert!(
            found.contains(&Violation::Lost {
                node: 1,
                id: (1, 2)
            }),
            "{found:?}"
        );
        assert!(found.contains(&Violation::Diverged { node: 0, other: 1 }));
        // Lost everywhere (and the walk never saw it): lost on both nodes.
        let mut records = clean();
        records.truncate(6);
        records.push(page(0, vec![event(1, 1, 1), event(2, 1, 1)]));
        records.push(Record::Converged {
            after_heal_ms: Some(1),
            under_impairment: false,
            compared: "digest".into(),
        });
        records.push(Record::ReaderDone {
            reader: 0,
            at_head: true,
        });
        records.push(final_log(0, vec![event(1, 1, 1), event(2, 1, 1)]));
        records.push(final_log(1, vec![event(1, 1, 1), event(2, 1, 1)]));
        assert_eq!(
            violations(&records),
            vec![
                Violation::Lost {
                    node: 0,
                    id: (1, 2)
                },
                Violation::Lost {
                    node: 1,
                    id: (1, 2)
                },
            ]
        );
    }

    /// Final chain heads: equal ones pass, a stream unanchored on one node
    /// (`null`) is compared by its head alone, and another hash or head on
    /// an anchored stream is named with both nodes.
    #[test]
    fn final_chain_heads_that_differ_on_an_anchored_stream_are_named() {
        let chains = |one: Option<&str>, two_head: u64| {
            serde_json::json!({
                "hash": "00",
                "streams": {
                    "1": {"head": 2, "hash": one},
                    "2": {"head": two_head, "hash": "bb"},
                },
            })
        };
        let with_chains = |records: &mut Vec<Record>, node: usize, value: serde_json::Value| {
            for record in records.iter_mut() {
                if let Record::Final {
                    node: n, chains, ..
                } = record
                {
                    if *n == node {
                        *chains = value.clone();
                    }
                }
            }
        };
        let mut records = clean();
        with_chains(&mut records, 0, chains(Some("aa"), 1));
        with_chains(&mut records, 1, chains(Some("aa"), 1));
        assert_eq!(violations(&records), vec![]);
        // Unanchored on node 1: its head alone counts.
        with_chains(&mut records, 1, chains(None, 1));
        assert_eq!(violations(&records), vec![]);
        // Another hash where both are anchored.
        with_chains(&mut records, 1, chains(Some("ab"), 1));
        let found = violations(&records);
        assert!(
            matches!(
                found.as_slice(),
                [Violation::ChainsDiffer { node: 0, other: 1, detail }]
                    if detail.contains("stream 1") && detail.contains("ab")
            ),
            "{found:?}"
        );
        // Another head.
        with_chains(&mut records, 1, chains(Some("aa"), 3));
        let found = violations(&records);
        assert!(
            matches!(
                found.as_slice(),
                [Violation::ChainsDiffer { detail, .. }] if detail.contains("stream 2 heads 1 and 3")
            ),
            "{found:?}"
        );
        // A node's chains missing entirely (an older history) is not judged.
        with_chains(&mut records, 1, serde_json::Value::Null);
        assert_eq!(violations(&records), vec![]);
    }

    #[test]
    fn a_duplicate_delivery_is_named() {
        let mut records = clean();
        records[7] = page(0, vec![event(2, 1, 1), event(1, 2, 2)]);
        assert_eq!(
            violations(&records),
            vec![Violation::Duplicate {
                reader: 0,
                id: (2, 1)
            }]
        );
    }

    #[test]
    fn a_skipped_range_not_reported_stale_is_named() {
        let mut records = clean();
        records[6] = page(0, vec![event(1, 1, 1)]);
        assert_eq!(
            violations(&records),
            vec![Violation::Skipped {
                reader: 0,
                id: (2, 1)
            }]
        );
    }

    #[test]
    fn a_skipped_range_reported_stale_passes_but_seen_and_stale_does_not() {
        let stale = |first, last| Record::Page {
            t_ms: 0,
            reader: 0,
            node: 0,
            after: String::new(),
            outcome: PageOutcome::Stale {
                lost: vec![LostRange {
                    stream: "2".into(),
                    first,
                    last,
                }],
                resume: "r".into(),
            },
        };
        let mut records = clean();
        records[6] = page(0, vec![event(1, 1, 1)]);
        records.insert(6, stale(1, 1));
        assert_eq!(violations(&records), vec![]);
        assert_eq!(check(&records).stale_pages, 1);

        let mut records = clean();
        records.insert(6, stale(1, 1));
        assert_eq!(
            violations(&records),
            vec![Violation::SeenAndStale {
                reader: 0,
                id: (2, 1)
            }]
        );
    }

    #[test]
    fn an_out_of_order_page_is_named() {
        let mut records = clean();
        // (1, stream 2) before (1, stream 1): the stream tiebreak is broken.
        records[6] = page(0, vec![event(2, 1, 1), event(1, 1, 1)]);
        assert_eq!(
            violations(&records),
            vec![Violation::OutOfOrder {
                reader: 0,
                page: 0,
                id: (1, 1)
            }]
        );
        // Lamport going down within a page.
        let mut records = clean();
        records[6] = page(0, vec![]);
        records[7] = page(0, vec![event(1, 2, 2), event(1, 1, 1), event(2, 1, 1)]);
        assert_eq!(
            violations(&records),
            vec![Violation::OutOfOrder {
                reader: 0,
                page: 1,
                id: (1, 1)
            }]
        );
    }

    #[test]
    fn unfinished_readers_unconverged_nodes_holes_and_phantoms_are_named() {
        let mut records = clean();
        records[8] = Record::Converged {
            after_heal_ms: None,
            under_impairment: true,
            compared: "digest".into(),
        };
        records[9] = Record::ReaderDone {
            reader: 0,
            at_head: false,
        };
        records[7] = page(0, vec![event(1, 2, 2), event(3, 1, 3)]);
        records[10] = final_log(0, vec![event(1, 2, 2), event(1, 1, 1), event(2, 1, 1)]);
        records[11] = final_log(1, vec![event(1, 1, 1), event(2, 1, 1), event(1, 3, 2)]);
        let found = violations(&records);
        for expected in [
            Violation::NotConverged,
            Violation::ReaderUnfinished { reader: 0 },
            Violation::Phantom {
                reader: 0,
                id: (3, 1),
            },
            Violation::FinalNotPrefix { node: 1, stream: 1 },
            Violation::Lost {
                node: 1,
                id: (1, 2),
            },
        ] {
            assert!(found.contains(&expected), "{expected:?} not in {found:?}");
        }
        // Node 0's events are out of page order but a whole prefix: fine.
        assert!(!found.contains(&Violation::FinalNotPrefix { node: 0, stream: 1 }));
    }

    #[test]
    fn a_refused_append_that_was_applied_anyway_is_named() {
        let mut records = clean();
        let mut extra = event(3, 1, 3);
        extra.payload = "refused".into();
        records.insert(
            4,
            Record::Append {
                t_ms: 0,
                writer: 3,
                node: 3,
                payloads: vec!["refused".into()],
                outcome: AppendOutcome::Failed {
                    message: "connect: refused".into(),
                },
            },
        );
        records[12] = final_log(
            1,
            vec![event(1, 1, 1), event(2, 1, 1), event(1, 2, 2), extra],
        );
        let found = violations(&records);
        assert!(
            found.contains(&Violation::RefusedButApplied {
                node: 1,
                payload: "refused".into()
            }),
            "{found:?}"
        );
    }

    #[test]
    fn a_payload_other_than_the_acknowledged_one_is_named() {
        let mut records = clean();
        let mut forged = event(1, 2, 2);
        forged.payload = "forged".into();
        records[7] = page(0, vec![forged]);
        // A payload no writer sent is also a forgery.
        assert_eq!(
            violations(&records),
            vec![
                Violation::Forged {
                    seen_by: "reader 0".into(),
                    id: (1, 2),
                    payload: "forged".into()
                },
                Violation::WrongPayload {
                    seen_by: "reader 0".into(),
                    id: (1, 2)
                }
            ]
        );
    }

    /// The clean history with node 1 holding `extra` besides the rest.
    fn held_by_node_1(extra: Event) -> Vec<Record> {
        let mut records = clean();
        records[11] = final_log(
            1,
            vec![event(1, 1, 1), event(2, 1, 1), event(1, 2, 2), extra],
        );
        records
    }

    #[test]
    fn an_event_no_honest_writer_sent_is_named_forged() {
        // A payload no writer sent, at the next seq of stream 1.
        let mut forged = event(1, 3, 3);
        forged.payload = "forged-1".into();
        let found = violations(&held_by_node_1(forged));
        assert!(
            found.contains(&Violation::Forged {
                seen_by: "node 1".into(),
                id: (1, 3),
                payload: "forged-1".into()
            }),
            "{found:?}"
        );
        // A payload writer 0 (node n1, stream 1) sent, claimed for
        // stream 2.
        let mut records = clean();
        if let Record::Append { writer, .. } = &mut records[1] {
            *writer = 0;
        }
        let mut moved = event(2, 2, 3);
        moved.payload = "p1-1".into();
        records[11] = final_log(
            1,
            vec![event(1, 1, 1), event(2, 1, 1), event(1, 2, 2), moved],
        );
        let found = violations(&records);
        assert!(
            found.contains(&Violation::Forged {
                seen_by: "node 1".into(),
                id: (2, 2),
                payload: "p1-1".into()
            }),
            "{found:?}"
        );
    }

    #[test]
    fn a_floor_past_what_a_compaction_could_set_is_named_erased() {
        // No compaction in the history: any floor is an erasure.
        let mut records = clean();
        if let Record::Final { floor, events, .. } = &mut records[11] {
            floor.insert("1".into(), 1);
            events.retain(|e| (e.stream.as_str(), e.seq) != ("1", 1));
        }
        let found = violations(&records);
        assert!(
            found.contains(&Violation::Erased {
                node: 1,
                stream: 1,
                floor: 1,
                bound: 0
            }),
            "{found:?}"
        );
        // A compaction keeping 1 allows floor 1 on stream 1 (head 2), not 2.
        records.insert(
            5,
            Record::Fault {
                t_ms: 3,
                action: "compact every node, keep_last 1 (n1 dropped 1)".into(),
            },
        );
        assert!(!violations(&records)
            .iter()
            .any(|v| matches!(v, Violation::Erased { .. })));
        if let Record::Final { floor, .. } = &mut records[12] {
            floor.insert("1".into(), 2);
        }
        assert!(violations(&records).contains(&Violation::Erased {
            node: 1,
            stream: 1,
            floor: 2,
            bound: 1
        }));
    }

    fn forgery(forgery: Forgery, outcome: ForgeryOutcome) -> Record {
        Record::Forgery {
            t_ms: 1,
            node: 0,
            forgery,
            stream: "2".into(),
            seq: 2,
            outcome,
        }
    }

    #[test]
    fn a_forgery_taken_or_never_refused_is_named() {
        let mut records = clean();
        if let Record::Start { hostile, .. } = &mut records[0] {
            *hostile = true;
        }
        // Every kind shown once: refused, cut (an unsealed first run), or
        // (a floor) acknowledged.
        for kind in Forgery::ALL {
            let outcome = if kind == Forgery::UnsealedFirst {
                ForgeryOutcome::Cut
            } else if kind.is_event() {
                ForgeryOutcome::Refused
            } else {
                ForgeryOutcome::Acknowledged
            };
            if kind != Forgery::StolenKey {
                records.push(forgery(kind, outcome));
            }
        }
        assert_eq!(violations(&records), vec![]);
        // A node acknowledged a forged event.
        records.push(forgery(Forgery::WrongKey, ForgeryOutcome::Acknowledged));
        assert_eq!(
            violations(&records),
            vec![Violation::ForgeryTaken {
                node: 0,
                forgery: Forgery::WrongKey,
                id: (2, 2)
            }]
        );
        // An altered run that was never refused (only closed, not tried).
        records.pop();
        records.retain(|r| {
            !matches!(
                r,
                Record::Forgery {
                    forgery: Forgery::AlteredLamport,
                    ..
                }
            )
        });
        records.push(forgery(Forgery::AlteredLamport, ForgeryOutcome::Closed));
        records.push(forgery(
            Forgery::AlteredLamport,
            ForgeryOutcome::NotTried { why: "none".into() },
        ));
        assert_eq!(
            violations(&records),
            vec![Violation::ForgeryUntried {
                forgery: Forgery::AlteredLamport
            }]
        );
    }

    /// An unsealed first run is shown only by a cut: a node that took it
    /// (acknowledged and held) took a forgery, and one that refused it
    /// shows only that it held the writer's real first event by then.
    #[test]
    fn an_unsealed_first_run_must_be_cut_not_taken() {
        let mut records = clean();
        if let Record::Start { hostile, .. } = &mut records[0] {
            *hostile = true;
        }
        for kind in Forgery::ALL {
            if kind != Forgery::StolenKey && kind != Forgery::UnsealedFirst {
                let outcome = if kind.is_event() {
                    ForgeryOutcome::Refused
                } else {
                    ForgeryOutcome::Acknowledged
                };
                records.push(forgery(kind, outcome));
            }
        }
        records.push(forgery(Forgery::UnsealedFirst, ForgeryOutcome::Refused));
        assert_eq!(
            violations(&records),
            vec![Violation::ForgeryUntried {
                forgery: Forgery::UnsealedFirst
            }]
        );
        records.push(forgery(
            Forgery::UnsealedFirst,
            ForgeryOutcome::Acknowledged,
        ));
        assert_eq!(
            violations(&records),
            vec![
                Violation::ForgeryTaken {
                    node: 0,
                    forgery: Forgery::UnsealedFirst,
                    id: (2, 2)
                },
                Violation::ForgeryUntried {
                    forgery: Forgery::UnsealedFirst
                }
            ]
        );
        records.pop();
        records.push(forgery(Forgery::UnsealedFirst, ForgeryOutcome::Cut));
        assert_eq!(violations(&records), vec![]);
    }
}
