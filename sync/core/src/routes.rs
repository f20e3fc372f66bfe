//! `Routes`: what the sessions of one replica share, so that in a mesh with
//! cycles an event reaches the replica once.
//!
//! Each session sees one peer; only the replica's sessions together know
//! that a stream already arrives through one of them. The table here is
//! that knowledge: per stream, the session that brings it (its *source*,
//! the first to deliver it), and per peer, the one session kept when two
//! replicas hold two sessions (each dialed the other). A session that
//! receives a stream whose source is another session asks its peer, in a
//! `Routes` frame, not to push that stream (*quiet*); it asks for it again
//! (*loud*) when the source session ends, or when its peer's marks show the
//! stream ahead of ours for longer than a round trip and a tick (the source
//! lags or is cut off), taking the stream over. The rules are the protocol
//! core's (`proto`); this is only the shared table, behind one mutex
//! taken briefly per received delta and per tick.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use meshlog_cursor::StreamId;

/// Whether this side dialed the peer or the peer dialed it: the one thing
/// both sides of two sessions between the same replicas agree on, so both
/// keep the same one (see [`Routes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerDirection {
    /// A configured peer we dial (and redial).
    Outbound,
    /// A peer that connected to our listener.
    Inbound,
}

/// The routing table shared by every session of one replica (cheap to
/// clone: a handle). Give the same `Routes` to all of a replica's sessions
/// (`meshlog_sync::Session::with_routes`,
/// [`Protocol::with_routes`](crate::proto::Protocol::with_routes)); a
/// session without one pushes every stream to its peer, as protocol 2
/// always did.
///
/// ```
/// use meshlog_sync_core::Routes;
///
/// let routes = Routes::new();
/// assert_eq!(routes.sessions(), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Routes {
    table: Arc<Mutex<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    sessions: HashMap<u64, Entry>,
    sources: HashMap<StreamId, Source>,
    /// Rises whenever a source is dropped, so sessions re-check what they
    /// asked quiet.
    generation: u64,
    /// Every stream that got a source, in order (a stream again when its
    /// source changes): each session reads it from where it last stopped,
    /// and asks its peer quiet for what another session now brings, before
    /// the peer sends it a second copy.
    claims: Vec<StreamId>,
}

#[derive(Debug)]
struct Entry {
    peer: Option<StreamId>,
    direction: PeerDirection,
    /// Another session with the same peer is kept instead: this one ends.
    duplicate: bool,
}

#[derive(Debug, Clone, Copy)]
struct Source {
    session: u64,
    since: Instant,
}

impl Routes {
    /// An empty table.
    pub fn new() -> Self {
        Routes::default()
    }

    /// Sessions registered now (running, with or without a peer yet).
    pub fn sessions(&self) -> usize {
        self.lock().sessions.len()
    }

    /// Registers a session; it leaves the table when the handle drops.
    pub(crate) fn join(&self, direction: PeerDirection) -> RouteLink {
        let mut table = self.lock();
        let id = table.next_id;
        table.next_id += 1;
        table.sessions.insert(
            id,
            Entry {
                peer: None,
                direction,
                duplicate: false,
            },
        );
        RouteLink {
            routes: self.clone(),
            id,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic elsewhere leaves the table consistent (each update is
        // one statement), so a poisoned lock is still usable.
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One session's place in a [`Routes`] table.
#[derive(Debug)]
pub(crate) struct RouteLink {
    routes: Routes,
    id: u64,
}

impl RouteLink {
    /// The peer's hello arrived: whether this session is the one kept with
    /// `peer` (`false`: another session with it is, and this one ends).
    ///
    /// Both replicas must keep the same session of two, each knowing only
    /// its own side: the one dialed by the lower stream id is kept; of two
    /// dialed by the same side, the one established first.
    pub(crate) fn establish(&self, local: StreamId, peer: StreamId) -> bool {
        let mut table = self.routes.lock();
        let preferred = |direction: PeerDirection| {
            let dialer = match direction {
                PeerDirection::Outbound => local,
                PeerDirection::Inbound => peer,
            };
            dialer == local.min(peer)
        };
        let Some(direction) = table.sessions.get(&self.id).map(|entry| entry.direction) else {
            return true;
        };
        let mut keep = true;
        let mut superseded = Vec::new();
        for (&id, entry) in &table.sessions {
            if id == self.id || entry.duplicate || entry.peer != Some(peer) {
                continue;
            }
            if preferred(direction) && !preferred(entry.direction) {
                superseded.push(id);
            } else {
                keep = false;
            }
        }
        if keep {
            for id in superseded {
                if let Some(entry) = table.sessions.get_mut(&id) {
                    entry.duplicate = true;
                }
                table.drop_sources_of(id);
            }
        }
        if let Some(entry) = table.sessions.get_mut(&self.id) {
            entry.peer = Some(peer);
            entry.duplicate = !keep;
        }
        keep
    }

    /// Whether another session with the same peer is kept instead of this
    /// one.
    pub(crate) fn is_duplicate(&self) -> bool {
        let table = self.routes.lock();
        table
            .sessions
            .get(&self.id)
            .is_some_and(|entry| entry.duplicate)
    }

    /// Events of `stream` arrived through this session: whether it is the
    /// stream's source (it becomes one if no live session is).
    pub(crate) fn claim(&self, stream: StreamId, now: Instant) -> bool {
        let mut table = self.routes.lock();
        if let Some(source) = table.sources.get(&stream) {
            if source.session == self.id {
                return true;
            }
            if table.is_live(source.session) {
                return false;
            }
        }
        table.set_source(stream, self.id, now);
        true
    }

    /// This session cannot bring `stream` (its peer's floor is above what
    /// the replica holds): if it is the stream's source, it is no longer,
    /// and the sessions that asked it quiet re-check (loud again, the
    /// first to deliver it becoming its source).
    pub(crate) fn release(&self, stream: StreamId) {
        let mut table = self.routes.lock();
        if table
            .sources
            .get(&stream)
            .is_some_and(|source| source.session == self.id)
        {
            table.sources.remove(&stream);
            table.generation += 1;
        }
    }

    /// Streams that got a source since `seen` claims were read (see
    /// `Table::claims`), and the new count.
    pub(crate) fn claims_since(&self, seen: usize) -> (Vec<StreamId>, usize) {
        let table = self.routes.lock();
        let claims = table.claims.get(seen..).unwrap_or_default().to_vec();
        (claims, table.claims.len())
    }

    /// Makes this session the source of `stream` (the source lagged).
    pub(crate) fn take_over(&self, stream: StreamId, now: Instant) {
        let mut table = self.routes.lock();
        table.set_source(stream, self.id, now);
        table.generation += 1;
    }

    /// Another live session is the source of `stream`: since when.
    pub(crate) fn other_source_since(&self, stream: StreamId) -> Option<Instant> {
        self.routes.lock().other_source_since(stream, self.id)
    }

    /// [`RouteLink::other_source_since`] of each of `streams`, in their
    /// order, under one lock (a session re-checks every stream it asked
    /// quiet after each receipt).
    pub(crate) fn other_sources_since(
        &self,
        streams: impl Iterator<Item = StreamId>,
    ) -> Vec<Option<Instant>> {
        let table = self.routes.lock();
        streams
            .map(|stream| table.other_source_since(stream, self.id))
            .collect()
    }

    /// A number that rises whenever a source is dropped or taken over.
    pub(crate) fn generation(&self) -> u64 {
        self.routes.lock().generation
    }
}

impl Table {
    /// Makes `session` the source of `stream`, and records the claim for
    /// the other sessions to read.
    fn set_source(&mut self, stream: StreamId, session: u64, now: Instant) {
        self.sources.insert(
            stream,
            Source {
                session,
                since: now,
            },
        );
        self.claims.push(stream);
    }

    /// Since when a live session other than `session` is the source of
    /// `stream`, if one is.
    fn other_source_since(&self, stream: StreamId, session: u64) -> Option<Instant> {
        let source = self.sources.get(&stream)?;
        (source.session != session && self.is_live(source.session)).then_some(source.since)
    }

    fn is_live(&self, session: u64) -> bool {
        self.sessions
            .get(&session)
            .is_some_and(|entry| !entry.duplicate)
    }

    fn drop_sources_of(&mut self, session: u64) {
        let before = self.sources.len();
        self.sources.retain(|_, source| source.session != session);
        if self.sources.len() != before {
            self.generation += 1;
        }
    }
}

impl Drop for RouteLink {
    fn drop(&mut self) {
        let mut table = self.routes.lock();
        table.sessions.remove(&self.id);
        table.drop_sources_of(self.id);
        // Sessions that asked a stream quiet re-check even if this one
        // sourced nothing: cheap, and a peer may have been waiting on it.
        table.generation += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_two_sessions_between_two_replicas_both_keep_the_one_the_lower_id_dialed() {
        let (low, high) = (StreamId::new(1), StreamId::new(2));
        // On the low side: its own dial (kept), the high side's dial.
        let low_routes = Routes::new();
        let low_dialed = low_routes.join(PeerDirection::Outbound);
        let low_accepted = low_routes.join(PeerDirection::Inbound);
        assert!(low_accepted.establish(low, high));
        assert!(low_dialed.establish(low, high));
        assert!(low_accepted.is_duplicate());
        assert!(!low_dialed.is_duplicate());
        // On the high side, the same pair, established in the other order.
        let high_routes = Routes::new();
        let high_dialed = high_routes.join(PeerDirection::Outbound);
        let high_accepted = high_routes.join(PeerDirection::Inbound);
        assert!(high_accepted.establish(high, low));
        assert!(!high_dialed.establish(high, low));
        assert!(high_dialed.is_duplicate());
        assert!(!high_accepted.is_duplicate());
    }

    #[test]
    fn the_first_session_to_deliver_a_stream_is_its_source_until_it_ends() {
        let routes = Routes::new();
        let now = Instant::now();
        let (a, b) = (
            routes.join(PeerDirection::Outbound),
            routes.join(PeerDirection::Outbound),
        );
        let stream = StreamId::new(9);
        assert!(a.claim(stream, now));
        assert!(!b.claim(stream, now));
        assert_eq!(b.other_source_since(stream), Some(now));
        let generation = b.generation();
        drop(a);
        assert!(b.generation() > generation);
        assert_eq!(b.other_source_since(stream), None);
        assert!(b.claim(stream, now));
        assert_eq!(routes.sessions(), 1);
    }
}
