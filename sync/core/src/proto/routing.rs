//! Routing: the routes table shared with the replica's other sessions, the
//! streams asked quiet both ways, and taking over a stream whose source
//! lags.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use meshlog_cursor::StreamId;
use meshlog_replica::ApplyReport;

use crate::frame::{Frame, Routes as RoutesFrame};

use super::state::{Behind, LocalReplica, Protocol, QuietAsk};
use super::timeouts::tick_interval;
use super::view::streams_ahead;

impl Protocol {
    /// Reads the routes table: streams another session now brings are
    /// asked quiet here before the peer sends a second copy, and the
    /// streams asked quiet are re-checked when the table changed or a
    /// check is due.
    pub(super) fn read_routes<L: LocalReplica>(&mut self, now: Instant, local: &L) {
        let Some(link) = &self.routing.link else {
            return;
        };
        let (claims, seen) = link.claims_since(self.routing.claims_seen);
        self.routing.claims_seen = seen;
        let asks: Vec<StreamId> = claims
            .into_iter()
            .filter(|&stream| {
                stream != self.local
                    && !self.routing.refused.contains(&stream)
                    && !self.routing.behind.contains_key(&stream)
                    && link.other_source_since(stream).is_some()
                    && !self.routing.quiet_asked.contains_key(&stream)
            })
            .collect();
        for stream in asks {
            self.ask_quiet(stream, now);
        }
        let link = self.routing.link.as_ref().expect("checked above");
        if self.routing.lag_check_due || link.generation() != self.routing.routes_generation {
            self.routing.lag_check_due = false;
            self.check_routes(now, local);
        }
    }

    /// How long a peer may show a stream ahead of ours, on a session that
    /// asked it quiet, before this session takes the stream over: a tick
    /// and two round trips, the time the source session has to bring it.
    pub(super) fn lag_allowed(&self) -> Duration {
        3 * tick_interval(&self.config) + 2 * self.timing.rtt.unwrap_or(tick_interval(&self.config))
    }

    /// Re-checks the streams asked quiet: loud again if their source
    /// session ended, or taken over if the peer has shown them ahead of us
    /// for longer than [`Protocol::lag_allowed`].
    pub(super) fn check_routes<L: LocalReplica>(&mut self, now: Instant, local: &L) {
        if self.routing.link.is_none() {
            return;
        }
        let ahead = streams_ahead(&self.marks.peer_marks, &local.marks());
        self.ask_loud_again(now, &ahead);
        let Some(link) = &self.routing.link else {
            return;
        };
        self.routing.routes_generation = link.generation();
        if self.routing.quiet_asked.is_empty() {
            return;
        }
        let lag_allowed = self.lag_allowed();
        let mut loud = Vec::new();
        let sources = link.other_sources_since(self.routing.quiet_asked.keys().copied());
        for ((&stream, ask), source_since) in self.routing.quiet_asked.iter_mut().zip(sources) {
            let Some(source_since) = source_since else {
                loud.push(stream);
                continue;
            };
            // Not ahead: both 0, which is `theirs <= ours`.
            let (theirs, ours) = ahead.get(&stream).copied().unwrap_or_default();
            ask.ahead = match ask.ahead {
                _ if theirs <= ours => None,
                None => Some((theirs, now)),
                Some((target, _)) if ours >= target => Some((theirs, now)),
                Some((target, since)) => {
                    if now.saturating_duration_since(since) > lag_allowed
                        && now.saturating_duration_since(source_since) > lag_allowed
                    {
                        tracing::debug!(%stream, theirs, ours, "the stream's source lags: taken over");
                        link.take_over(stream, now);
                        loud.push(stream);
                    }
                    Some((target, since))
                }
            };
        }
        for stream in loud {
            self.routing.quiet_asked.remove(&stream);
            self.routing.routes_due.insert(stream, false);
        }
    }

    /// Asks loud again each stream we did not ask quiet (nor refused,
    /// nor hold behind the peer's floor) that the peer's marks have shown
    /// ahead of ours for longer than [`Protocol::lag_allowed`]: the
    /// routes frame that asked it loud may have been lost (a frame is
    /// sent once), and the peer then keeps it quiet for the session, a
    /// stream only it holds never reaching us. A loud for a stream the
    /// peer already pushes changes nothing.
    fn ask_loud_again(&mut self, now: Instant, ahead: &BTreeMap<StreamId, (u64, u64)>) {
        let lag_allowed = self.lag_allowed();
        let local = self.local;
        let routing = &mut self.routing;
        let (quiet_asked, refused, behind) =
            (&routing.quiet_asked, &routing.refused, &routing.behind);
        let counts = |stream: &StreamId| {
            *stream != local
                && !quiet_asked.contains_key(stream)
                && !refused.contains(stream)
                && !behind.contains_key(stream)
        };
        // A stream no longer ahead, or no longer one to ask loud, starts
        // over (every stream it holds is one of the peer's marks).
        routing
            .loud_ahead
            .retain(|stream, _| ahead.contains_key(stream) && counts(stream));
        let mut again = Vec::new();
        for stream in ahead.keys().filter(|stream| counts(stream)) {
            let since = *routing.loud_ahead.entry(*stream).or_insert(now);
            if now.saturating_duration_since(since) > lag_allowed {
                routing.loud_ahead.insert(*stream, now);
                again.push(*stream);
            }
        }
        for stream in again {
            tracing::debug!(%stream, "a stream the peer holds further is asked loud again");
            self.routing.routes_due.entry(stream).or_insert(false);
        }
    }

    /// Asks the peer not to push `stream` (another session brings it).
    pub(super) fn ask_quiet(&mut self, stream: StreamId, now: Instant) {
        self.routing.quiet_asked.insert(
            stream,
            QuietAsk {
                asked_at: now,
                ahead: None,
            },
        );
        self.routing.routes_due.insert(stream, true);
    }

    /// Events of `streams` arrived in a delta: a stream another session
    /// brings is asked quiet here (again, if asked a while ago and still
    /// pushed: the routes frame may have been lost).
    pub(super) fn route_received(&mut self, now: Instant, streams: &BTreeSet<StreamId>) {
        let Some(link) = &self.routing.link else {
            return;
        };
        let resend_after = self.lag_allowed();
        let mut asks = Vec::new();
        for &stream in streams {
            if stream == self.local
                || self.routing.refused.contains(&stream)
                || self.routing.behind.contains_key(&stream)
            {
                continue;
            }
            if link.claim(stream, now) {
                if self.routing.quiet_asked.remove(&stream).is_some() {
                    self.routing.routes_due.insert(stream, false);
                }
                continue;
            }
            match self.routing.quiet_asked.get_mut(&stream) {
                Some(ask) if now.saturating_duration_since(ask.asked_at) <= resend_after => {}
                Some(ask) => {
                    ask.asked_at = now;
                    self.routing.routes_due.insert(stream, true);
                }
                None => asks.push(stream),
            }
        }
        for stream in asks {
            self.ask_quiet(stream, now);
        }
    }

    /// The replica reported streams behind the peer's floor (`report`):
    /// each newly behind (or behind a higher floor) is logged, reported in
    /// the state, and asked quiet; this session stops being its source, so
    /// that another session (whose peer may hold the gap) brings it.
    pub(super) fn note_behind(&mut self, report: &ApplyReport) {
        let peer = self.hello.peer.unwrap_or(self.local);
        self.state.events_behind_floor += report.behind_events;
        for &(stream, floor) in &report.behind_floor {
            let known = self.routing.behind.get(&stream).map(|behind| behind.floor);
            if known.is_some_and(|known| known >= floor) {
                continue;
            }
            let peer_head = self.marks.peer_marks.get(stream);
            let behind = Behind {
                floor,
                held: None,
                peer_head,
            };
            self.routing.behind.insert(stream, behind);
            tracing::warn!(
                local = %self.local,
                %peer,
                %stream,
                floor,
                "stream behind the peer's floor: this replica cannot take the peer's floor \
                 of it (it holds events below it, or the stream is keyed and the floor \
                 comes without the writer's authority); the stream is asked quiet on this \
                 peer until another peer fills the gap (or this replica compacts what it \
                 holds of it, taking the gap as lost)"
            );
            if known.is_some() {
                // Asked quiet already.
                continue;
            }
            self.routing.quiet_asked.remove(&stream);
            self.routing.routes_due.insert(stream, true);
            if let Some(link) = &self.routing.link {
                link.release(stream);
            }
        }
        self.publish_behind();
    }

    /// Streams behind the peer's floor that no longer are, each asked
    /// loud again: our marks reached the floor (another peer filled the
    /// gap), or we held events of the stream above our floor when it was
    /// found behind and hold none now (we compacted them: the peer's
    /// floor can then be taken). A stream we held nothing of then (a
    /// keyed stream whose unsigned floor our replica refused) is asked
    /// loud again only once the peer's marks of it rise (it holds a run
    /// it did not, which may vouch for the floor): asked loud at once,
    /// the peer would send the same floor, refused again, and a hostile
    /// peer repeating it made the session loop. One that claims higher
    /// marks each receipt gets a round per receipt, no more.
    pub(super) fn check_behind<L: LocalReplica>(&mut self, local: &L) {
        if self.routing.behind.is_empty() {
            return;
        }
        let (marks, floor) = local.marks_and_floor();
        let before = self.routing.behind.len();
        let routes_due = &mut self.routing.routes_due;
        let peer_marks = &self.marks.peer_marks;
        self.routing.behind.retain(|&stream, behind| {
            let head = marks.get(stream);
            let holds = head > floor.get(stream);
            let held = *behind.held.get_or_insert(holds);
            let released = if held {
                !holds
            } else {
                peer_marks.get(stream) > behind.peer_head
            };
            let still = head < behind.floor && !released;
            if !still {
                tracing::info!(%stream, head, peer_floor = behind.floor, "stream no longer behind the peer's floor: asked loud again");
                routes_due.insert(stream, false);
            }
            still
        });
        if self.routing.behind.len() != before {
            self.publish_behind();
        }
    }

    fn publish_behind(&mut self) {
        self.state.behind_floor = self
            .routing
            .behind
            .iter()
            .map(|(&stream, behind)| (stream, behind.floor))
            .collect();
        self.state_changed = true;
    }

    /// The routes frame for what changed, if anything did (at most
    /// `STREAMS_MAX` streams of each kind; the rest in the next).
    pub(super) fn routes_frame(&mut self) -> Option<Frame> {
        if self.routing.routes_due.is_empty() {
            return None;
        }
        let (mut quiet, mut loud) = (Vec::new(), Vec::new());
        while let Some((stream, is_quiet)) = self.routing.routes_due.pop_first() {
            if is_quiet {
                quiet.push(stream);
            } else {
                loud.push(stream);
            }
            if quiet.len() == meshlog_cursor::STREAMS_MAX
                || loud.len() == meshlog_cursor::STREAMS_MAX
            {
                break;
            }
        }
        let number = self.routing.next_routes_number;
        self.routing.next_routes_number += 1;
        self.state.routes_sent += 1;
        Some(Frame::Routes(RoutesFrame {
            number,
            quiet,
            loud,
        }))
    }

    /// The peer's routes: each stream named follows the latest-numbered
    /// frame naming it.
    pub(super) fn on_routes(&mut self, routes: RoutesFrame) {
        let number = routes.number;
        for (streams, quiet) in [(routes.quiet, true), (routes.loud, false)] {
            for stream in streams {
                let latest = self.routing.peer_route_numbers.entry(stream).or_insert(0);
                if number <= *latest {
                    continue;
                }
                *latest = number;
                if quiet {
                    self.routing.peer_quiet.insert(stream);
                } else {
                    self.routing.peer_quiet.remove(&stream);
                }
            }
        }
        self.state.peer_quiet_streams = self.routing.peer_quiet.len();
    }
}
