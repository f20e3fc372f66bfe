//! The invariants a run is checked against, and [`Reader`], a walk that
//! fails over between replicas.
//!
//! Each check returns a [`Violation`] naming what broke, when (simulated
//! time) and at which step, so a failing scenario prints it with its seed.

use std::time::Duration;

use meshlog_cursor::{token, StaleCursor, VersionVector};
use meshlog_replica::{MemStore, PageError, SharedReplica};

use crate::mesh::Mesh;

/// A broken invariant: what, when, at which step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at {at:?} (step {step}): {what}")]
pub struct Violation {
    /// Simulated time.
    pub at: Duration,
    /// Events handled by then.
    pub step: u64,
    /// What broke.
    pub what: String,
}

fn violation(mesh: &Mesh, what: String) -> Violation {
    Violation {
        at: mesh.now(),
        step: mesh.steps(),
        what,
    }
}

/// Every replica up holds a gap-free prefix per stream: the events it
/// holds are exactly `Σ (head - floor)`, and no floor is above its head.
/// (The log is indexed by seq, so one event too few is a hole.)
pub fn prefix_closed(mesh: &Mesh) -> Result<(), Violation> {
    for node in mesh.up() {
        let replica = mesh.replica(node).expect("up");
        let change = replica.latest_change();
        let mut expected = 0u64;
        for (stream, head) in change.marks.iter() {
            let floor = change.floor.get(stream);
            if floor > head {
                return Err(violation(
                    mesh,
                    format!("replica {node}: stream {stream} has floor {floor} above head {head}"),
                ));
            }
            expected += head - floor;
        }
        let held = replica.digest().events;
        if held != expected {
            return Err(violation(
                mesh,
                format!(
                    "replica {node} holds {held} events where its marks and floor say {expected}: a hole"
                ),
            ));
        }
    }
    Ok(())
}

/// Whether every replica up holds what the writers wrote, all with the same
/// marks, floor and digest.
pub fn converged(mesh: &Mesh, written: &VersionVector) -> bool {
    let up = mesh.up();
    let Some(first) = up.first().and_then(|&n| mesh.replica(n)) else {
        return true;
    };
    let digest = first.digest();
    let change = first.latest_change();
    up.iter()
        .all(|&n| mesh.replica(n).expect("up").digest() == digest)
        && written_marks_equal(&change.marks, written)
        && up.iter().all(|&n| {
            let other = mesh.replica(n).expect("up").latest_change();
            other.marks == change.marks && other.floor == change.floor
        })
}

/// Marks equal to what was written, ignoring streams of no event.
fn written_marks_equal(marks: &VersionVector, written: &VersionVector) -> bool {
    marks.dominates(written) && written.dominates(marks)
}

/// A reader walking the mesh: it pages one replica with a small limit
/// and, now and then, fails over to another with its token (as text, as a
/// client carries it). Every event must be the next seq of its stream
/// (none twice, none skipped), and a stale answer must name exactly the
/// ranges the replica's floor took below the cursor.
#[derive(Debug, Clone)]
pub struct Reader {
    /// The cursor: what was returned (and what a stale answer gave up).
    pub cursor: VersionVector,
    /// The cursor as its replica wrote it last (a page's `Page::token`,
    /// or `Replica::token` of a stale answer's resume): what a client
    /// carries, version 2 where that was shorter.
    pub token: String,
    /// The replica it pages.
    pub replica: usize,
    /// Events returned.
    pub returned: u64,
    /// Events a stale answer reported lost.
    pub lost: u128,
    /// Failovers made.
    pub failovers: u64,
    /// Stale answers met.
    pub stale: u64,
    /// The largest token text seen, in bytes.
    pub token_text_max: usize,
    /// Failovers that carried a version-2 token the target expanded
    /// (`Replica::cursor`).
    pub failovers_relative: u64,
    /// Failovers whose version-2 token named a checkpoint the target did
    /// not keep (`PageError::UnknownCheckpoint`: a node would ask its
    /// peers; here the reader resumes from the version-1 form).
    pub unknown_checkpoint: u64,
    /// Failovers that carried version 1 because the cursor was beyond the
    /// bound of every checkpoint its replica kept when it wrote the token.
    pub fell_back: u64,
    /// The token is version 1 for that reason.
    beyond_bound: bool,
}

impl Reader {
    /// A reader at the start of the log, paging `replica`.
    pub fn new(replica: usize) -> Self {
        let cursor = VersionVector::new();
        Reader {
            token: token::encode_text(&cursor).expect("the empty cursor encodes"),
            cursor,
            replica,
            returned: 0,
            lost: 0,
            failovers: 0,
            stale: 0,
            token_text_max: 0,
            failovers_relative: 0,
            unknown_checkpoint: 0,
            fell_back: 0,
            beyond_bound: false,
        }
    }

    /// Moves to `replica`, carrying the token as text: the one its
    /// replica answered last (version 2 where it was shorter), which the
    /// target reads (`Replica::cursor`: version 2 expanded against the
    /// checkpoint it names, which must give exactly the reader's cursor);
    /// a checkpoint the target does not keep is counted, and the reader
    /// resumes from the version-1 form. A target that is down is paged
    /// once it is up; the token is read then as version 1.
    pub fn fail_over(&mut self, mesh: &Mesh, replica: usize) -> Result<(), Violation> {
        let relative = matches!(
            token::decode_any_text(&self.token),
            Ok(token::Token::Relative(_))
        );
        if let (true, Some(target)) = (relative, mesh.replica(replica)) {
            match target.cursor(&self.token) {
                Ok(expanded) if expanded == self.cursor => {
                    self.failovers_relative += 1;
                    self.replica = replica;
                    self.failovers += 1;
                    return Ok(());
                }
                Ok(expanded) => {
                    return Err(violation(
                        mesh,
                        format!("replica {replica} read a version-2 token as {expanded:?}"),
                    ))
                }
                Err(PageError::UnknownCheckpoint { .. }) => self.unknown_checkpoint += 1,
                Err(error) => {
                    return Err(violation(
                        mesh,
                        format!("replica {replica} refused a version-2 token: {error}"),
                    ))
                }
            }
        }
        self.fell_back += u64::from(self.beyond_bound);
        let text = token::encode_text(&self.cursor)
            .map_err(|e| violation(mesh, format!("the reader's token does not encode: {e}")))?;
        self.beyond_bound = false;
        self.token_text_max = self.token_text_max.max(text.len());
        let decoded = token::decode_text(&text)
            .map_err(|e| violation(mesh, format!("the reader's token does not decode: {e}")))?;
        if decoded != self.cursor {
            return Err(violation(mesh, "the token did not round trip".to_owned()));
        }
        self.cursor = decoded;
        self.token = text;
        self.replica = replica;
        self.failovers += 1;
        Ok(())
    }

    /// Takes `text` as the reader's token: its replica must read it back
    /// as the cursor it stands for.
    fn take_token(
        &mut self,
        mesh: &Mesh,
        replica: &SharedReplica<MemStore>,
        text: String,
    ) -> Result<(), Violation> {
        match replica.cursor(&text) {
            Ok(read) if read == self.cursor => {}
            other => {
                return Err(violation(
                    mesh,
                    format!(
                        "replica {}: its token for the cursor reads back as {other:?}",
                        self.replica
                    ),
                ))
            }
        }
        self.beyond_bound = crate::mesh::token_kind(replica, &self.cursor, &text).1;
        self.token_text_max = self.token_text_max.max(text.len());
        self.token = text;
        Ok(())
    }

    /// One page of up to `limit` from its replica (if it is up), checked.
    /// Whether the page reached the replica's head.
    pub fn step(&mut self, mesh: &Mesh, limit: usize) -> Result<bool, Violation> {
        let Some(replica) = mesh.replica(self.replica) else {
            return Ok(false);
        };
        match replica.page(&self.cursor, limit) {
            Ok(page) => {
                let mut next = self.cursor.clone();
                for event in &page.events {
                    let last = next.get(event.stream);
                    if event.seq != last + 1 {
                        return Err(violation(
                            mesh,
                            format!(
                                "replica {}: the walk returned {}:{} after {}:{} ({})",
                                self.replica,
                                event.stream,
                                event.seq,
                                event.stream,
                                last,
                                if event.seq <= last {
                                    "twice"
                                } else {
                                    "past a hole"
                                }
                            ),
                        ));
                    }
                    next.advance(event.stream, event.seq);
                }
                if page.next != next {
                    return Err(violation(
                        mesh,
                        format!(
                            "replica {}: the page's next token is not the cursor joined with the page",
                            self.replica
                        ),
                    ));
                }
                self.returned += page.events.len() as u64;
                self.cursor = next;
                self.take_token(mesh, replica, page.token)?;
                Ok(page.at_head)
            }
            Err(PageError::Stale(stale)) => {
                self.check_stale(mesh, replica, &stale)?;
                self.stale += 1;
                self.lost += stale.lost_count();
                self.cursor = stale.resume().clone();
                let text = replica.token(&self.cursor).map_err(|e| {
                    violation(mesh, format!("replica {}: no token: {e}", self.replica))
                })?;
                self.take_token(mesh, replica, text)?;
                Ok(false)
            }
            Err(error) => Err(violation(
                mesh,
                format!("replica {}: page failed: {error}", self.replica),
            )),
        }
    }

    /// A stale answer names every stream whose floor is above the cursor,
    /// the range lost exactly, and resumes from the cursor joined with the
    /// floor.
    fn check_stale(
        &self,
        mesh: &Mesh,
        replica: &SharedReplica<MemStore>,
        stale: &StaleCursor,
    ) -> Result<(), Violation> {
        let floor = replica.floor();
        let expected: Vec<(u64, u64, u64)> = floor
            .iter()
            .filter(|&(stream, seq)| self.cursor.get(stream) < seq)
            .map(|(stream, seq)| (stream.get(), self.cursor.get(stream) + 1, seq))
            .collect();
        let mut reported: Vec<(u64, u64, u64)> = stale
            .lost()
            .iter()
            .map(|r| (r.stream.get(), r.first_seq, r.last_seq))
            .collect();
        let mut expected_sorted = expected.clone();
        expected_sorted.sort_unstable();
        reported.sort_unstable();
        if reported != expected_sorted {
            return Err(violation(
                mesh,
                format!(
                    "replica {}: the stale answer reported {reported:?}, the floor says {expected_sorted:?}",
                    self.replica
                ),
            ));
        }
        if *stale.resume() != self.cursor.joined(&floor) {
            return Err(violation(
                mesh,
                format!(
                    "replica {}: the stale answer's resume token is not the cursor joined with the floor",
                    self.replica
                ),
            ));
        }
        Ok(())
    }

    /// Walks its replica to the head, then checks the walk whole: its
    /// token equals the replica's marks, and every event up to them was
    /// returned once or reported lost.
    pub fn finish(&mut self, mesh: &Mesh, limit: usize) -> Result<(), Violation> {
        let mut pages = 0u64;
        while !self.step(mesh, limit)? {
            pages += 1;
            if pages > 10_000_000 {
                return Err(violation(
                    mesh,
                    "the walk never reached the head".to_owned(),
                ));
            }
        }
        let marks = mesh.replica(self.replica).expect("up").marks();
        if !(self.cursor.dominates(&marks) && marks.dominates(&self.cursor)) {
            return Err(violation(
                mesh,
                format!(
                    "replica {}: the walk ended at the head with a token other than its marks",
                    self.replica
                ),
            ));
        }
        let total = marks.total();
        if u128::from(self.returned) + self.lost != total {
            return Err(violation(
                mesh,
                format!(
                    "the walk returned {} and reported {} lost, of {total} events",
                    self.returned, self.lost
                ),
            ));
        }
        Ok(())
    }
}
