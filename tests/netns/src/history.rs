//! The history: one JSON object per line, written by the harness while a
//! schedule runs and read back by the checker. Every operation a client
//! completes (or gives up on) and every fault the nemesis applies is one
//! [`Record`], appended in the order it completed.
//!
//! Stream ids are decimal strings, as the node's API writes them.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// A schedule starts: its seed, the nodes and their streams.
    Start {
        /// The schedule's seed (`--seed` replays it).
        seed: u64,
        /// The nodes, by index: name, URL and stream id.
        nodes: Vec<NodeInfo>,
        /// Whether a hostile peer ran beside the nodes (`--hostile-node`):
        /// then the checker also demands that its forgeries were tried
        /// and refused (absent from histories recorded before it existed).
        #[serde(default)]
        hostile: bool,
    },
    /// A writer's append, one HTTP request carrying `payloads`.
    Append {
        /// Milliseconds since the schedule started.
        t_ms: u64,
        /// Which writer.
        writer: usize,
        /// Which node it was sent to.
        node: usize,
        /// The payloads, each unique in the run.
        payloads: Vec<String>,
        /// What the node answered.
        outcome: AppendOutcome,
    },
    /// A reader's page request.
    Page {
        /// Milliseconds since the schedule started.
        t_ms: u64,
        /// Which reader.
        reader: usize,
        /// Which node it asked.
        node: usize,
        /// The token sent as `after` (empty: the start).
        after: String,
        /// What the node answered.
        outcome: PageOutcome,
    },
    /// A reader's walk is over: `at_head` if its last page, after the final
    /// heal and convergence, was at the head.
    ReaderDone {
        /// Which reader.
        reader: usize,
        /// Whether the walk reached the head.
        at_head: bool,
    },
    /// The nemesis applied or healed a fault.
    Fault {
        /// Milliseconds since the schedule started.
        t_ms: u64,
        /// What it did, in words (`isolate n3`, `heal`).
        action: String,
    },
    /// After a step's heal, with the writers still running: how long until
    /// every node held everything any node held at the heal (its marks
    /// dominate the join of all marks taken then).
    CaughtUp {
        /// Milliseconds since the schedule started, at the heal.
        t_ms: u64,
        /// The heal (`heal partitions`, `heal: restart n3`).
        heal: String,
        /// Milliseconds from the heal until caught up; `None` if not within
        /// the bound (10 s).
        after_heal_ms: Option<u64>,
    },
    /// All nodes reported one digest after the last heal, or did not within
    /// the bound.
    Converged {
        /// Milliseconds from the last heal to equal digests; `None` if they
        /// were not equal within the bound.
        after_heal_ms: Option<u64>,
        /// Whether link impairments (loss, duplication, slow links) were
        /// still in place while converging.
        under_impairment: bool,
        /// What was compared: `digest`, or `marks` (the heads) while
        /// compaction left the floors apart.
        compared: String,
    },
    /// A node's whole log, read to the end after the final heal.
    Final {
        /// Which node.
        node: usize,
        /// Every event it holds, in page order.
        events: Vec<Event>,
        /// Its floor (`GET /marks`).
        floor: BTreeMap<String, u64>,
        /// Its digest (`GET /marks`).
        digest: serde_json::Value,
        /// Its chain heads (`GET /marks`'s `chains`; absent from a
        /// history recorded before they existed).
        #[serde(default)]
        chains: serde_json::Value,
    },
    /// One forgery the hostile peer sent to an honest node, on a sync
    /// session of its own, and what came of it.
    Forgery {
        /// Milliseconds since the schedule started.
        t_ms: u64,
        /// The honest node it was sent to.
        node: usize,
        /// What was forged.
        forgery: Forgery,
        /// The stream it names (decimal; empty when not tried).
        stream: String,
        /// The seq forged, altered or claimed as a floor.
        seq: u64,
        /// What the node did with it.
        outcome: ForgeryOutcome,
    },
    /// A node's final read failed.
    FinalFailed {
        /// Which node.
        node: usize,
        /// Why.
        message: String,
    },
}

/// What the hostile peer forges (`docs/FAULTS.md`, "The hostile node").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Forgery {
    /// Another writer's next event, without a seal.
    UnsealedNext,
    /// Another admitted writer's first event (seq 1), without a seal, sent
    /// to each node as the mesh starts, before the node holds (or has
    /// pinned a key for) that stream.
    UnsealedFirst,
    /// Another writer's next event, sealed by a key that is not its
    /// writer's.
    WrongKey,
    /// A real sealed run the node lacks, one payload altered.
    AlteredPayload,
    /// A real sealed run the node lacks, one lamport altered (still
    /// rising).
    AlteredLamport,
    /// A floor at a writer's head on the node plus 5.
    FloorAhead,
    /// A floor at `LAMPORT_MAX`.
    FloorMax,
    /// A floor below the node's head: it would erase held events.
    FloorErasing,
    /// Another writer's next event, sealed with that writer's own key,
    /// which the hostile peer was given (`--plant stolen-key`): the one
    /// forgery the nodes cannot tell from the writer's.
    StolenKey,
}

impl Forgery {
    /// Every forgery the hostile peer tries, in the order it tries them
    /// (the first runs as the mesh starts, then, round after round, the
    /// altered runs first, while what it just took is still new to the
    /// others).
    pub const ALL: [Forgery; 9] = [
        Forgery::UnsealedFirst,
        Forgery::AlteredPayload,
        Forgery::AlteredLamport,
        Forgery::UnsealedNext,
        Forgery::WrongKey,
        Forgery::FloorAhead,
        Forgery::FloorMax,
        Forgery::FloorErasing,
        Forgery::StolenKey,
    ];

    /// Whether it forges an event, which a node must never take (refuse:
    /// end the session, count the delta refused; or, an unsealed first
    /// run, cut); the floors it must instead take as "this peer cannot
    /// serve those" and erase nothing.
    pub fn is_event(self) -> bool {
        !matches!(
            self,
            Forgery::FloorAhead | Forgery::FloorMax | Forgery::FloorErasing
        )
    }

    /// Whether `outcome` shows this forgery really tried and answered as
    /// it must be: an event refused, a floor acknowledged, an unsealed
    /// first run cut (a refusal would show only that the node held the
    /// writer's real event by then, not that it cuts what it cannot
    /// verify).
    pub fn shown_by(self, outcome: &ForgeryOutcome) -> bool {
        match (self, outcome) {
            (Forgery::UnsealedFirst, outcome) => *outcome == ForgeryOutcome::Cut,
            (_, ForgeryOutcome::Refused) => self.is_event(),
            (_, ForgeryOutcome::Acknowledged) => !self.is_event(),
            _ => false,
        }
    }

    /// What a node that did as it must did with it, in words: refused,
    /// cut, or (a floor) ignored.
    pub fn answer_word(self) -> &'static str {
        match self {
            Forgery::UnsealedFirst => "cut",
            _ if self.is_event() => "refused",
            _ => "ignored",
        }
    }
}

/// What an honest node did with a forgery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ForgeryOutcome {
    /// The node closed the session without acknowledging the delta, and
    /// its `meshlog_deltas_refused_total` rose.
    Refused,
    /// The node closed the session without acknowledging it, but its
    /// refusal count did not rise (a fault cut the link, or it restarted).
    Closed,
    /// The node acknowledged the delta: applied whole (or, for a floor,
    /// taken as what this peer cannot serve). For an unsealed first run,
    /// acknowledged and held (`GET /marks`' chain head is the forged
    /// event's).
    Acknowledged,
    /// The node acknowledged the delta but holds none of it: its
    /// admission cut the stream (`Limit::Unsealed`, a run it cannot
    /// verify under `require_seals`; the stream asked quiet for the
    /// session). Checked for an unsealed first run only.
    Cut,
    /// Neither within the bound (a paused node, a lossy link).
    Unanswered,
    /// No session: the dial, the handshake or the hello failed.
    NoSession {
        /// Why.
        message: String,
    },
    /// Nothing to forge from (no stream the node holds two events of, no
    /// sealed run it lacks).
    NotTried {
        /// Why.
        why: String,
    },
}

/// A node of the mesh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// `n1` to `n5`.
    pub name: String,
    /// `http://10.77.0.11:7070`.
    pub url: String,
    /// Its stream id, decimal.
    pub stream: String,
}

/// What an append request came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum AppendOutcome {
    /// `201`: each payload's event, in order. These must never be lost.
    Ok {
        /// The events named in the answer.
        events: Vec<Ack>,
    },
    /// A definite refusal (an HTTP error, or a connection that was refused):
    /// nothing was appended.
    Failed {
        /// Why.
        message: String,
    },
    /// No answer (a timeout, a reset after sending): the events may or may
    /// not have been appended.
    Unknown {
        /// Why.
        message: String,
    },
}

/// One event of an append's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The writer stream.
    pub stream: String,
    /// Its seq.
    pub seq: u64,
    /// Its stamp.
    pub lamport: u64,
}

/// What a page request came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PageOutcome {
    /// `200`: the events as recorded by the reader, and the page's cursor.
    Ok {
        /// The events, in the page's order.
        events: Vec<Event>,
        /// The token for the next page.
        next: String,
        /// The node's `at_head`.
        at_head: bool,
        /// The node's `behind`.
        behind: bool,
    },
    /// `410 stale_cursor`: the ranges lost and the token to resume from.
    Stale {
        /// Every range reported lost.
        lost: Vec<LostRange>,
        /// The token the reader resumed from.
        resume: String,
    },
    /// No page (a timeout, a refused connection, another status).
    Error {
        /// Why.
        message: String,
    },
}

/// An event as a page returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The writer stream.
    pub stream: String,
    /// Its seq.
    pub seq: u64,
    /// Its stamp.
    pub lamport: u64,
    /// Its payload (the harness writes text only).
    pub payload: String,
}

/// A range a 410 reported lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostRange {
    /// The stream.
    pub stream: String,
    /// The first seq lost.
    pub first: u64,
    /// The last seq lost.
    pub last: u64,
}

/// Appends one record as a line.
pub fn write_record(out: &mut impl Write, record: &Record) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, record)?;
    out.write_all(b"\n")
}

/// Reads a history: one record per non-empty line. A line that does not
/// parse is an error naming its number.
pub fn read_history(input: impl BufRead) -> Result<Vec<Record>, String> {
    let mut records = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line.map_err(|error| format!("line {}: {error}", index + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line)
            .map_err(|error| format!("line {}: {error}: {line}", index + 1))?;
        records.push(record);
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_a_line() {
        let record = Record::Page {
            t_ms: 7,
            reader: 1,
            node: 2,
            after: "AQEB".into(),
            outcome: PageOutcome::Stale {
                lost: vec![LostRange {
                    stream: "3".into(),
                    first: 4,
                    last: 9,
                }],
                resume: "AQEC".into(),
            },
        };
        let mut text = Vec::new();
        write_record(&mut text, &record).unwrap();
        assert_eq!(text.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(read_history(&text[..]).unwrap(), vec![record]);
        assert!(read_history(&b"{\"type\":\"nope\"}\n"[..])
            .unwrap_err()
            .starts_with("line 1:"));
    }
}
