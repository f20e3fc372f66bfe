//! The node's Prometheus metrics, served as text by `GET /metrics`.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Every metric the node keeps; cheap to share (the metrics are atomics).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Serializes scrapes, so two never copy the replica's counters in twice.
    render_lock: std::sync::Mutex<()>,
    /// Events appended through the API.
    pub appends: Counter,
    /// Append requests refused (bad body, too large, store failure).
    pub appends_refused: Counter,
    /// Pages served (`GET /events`, `POST /events/query`).
    pub pages: Counter,
    /// Page requests answered `410 stale_cursor`.
    pub pages_stale: Counter,
    /// Pages served to a cursor ahead of this node (`behind: true`).
    pub pages_behind: Counter,
    /// Checkpoints a reader's version-2 token named, which this node did
    /// not keep, asked of its peers.
    pub checkpoint_fetches: Counter,
    /// Of those, the ones no peer sent within `checkpoint_fetch_ms`.
    pub checkpoint_fetches_missed: Counter,
    /// Connections refused for the connection limit.
    pub connections_refused: Counter,
    /// Connections open now.
    pub connections_open: Gauge,
    /// Sync sessions running now, dialed and accepted.
    pub sessions_running: Gauge,
    /// Dialed peers whose session is established now.
    pub peers_connected: Gauge,
    /// Seconds one durable append commit took, from the API's view.
    pub commit_seconds: Histogram,
    /// Follow subscriptions served now (`GET /follow`).
    pub followers: Gauge,
    /// Follow subscriptions told `lagged` (their connection's queue was full).
    pub follow_lagged: Counter,
    /// Follow subscriptions told `stale`.
    pub follow_stale: Counter,
    /// Requests refused `401` or `403`.
    pub requests_denied: Counter,
    /// Inbound sync links refused by the peer handshake or for a missing
    /// client certificate.
    pub peer_auth_refused: Counter,
    /// TLS handshakes that failed (a plaintext client on the TLS port, an
    /// untrusted client certificate, a timeout).
    pub tls_handshakes_failed: Counter,
    /// Per dialed peer (label `peer`, its URL): 1 while its session is
    /// established, else 0.
    peer_connected: Family<Vec<(String, String)>, Gauge>,
    /// Per dialed peer: events held here that it has not acknowledged.
    peer_lag_events: Family<Vec<(String, String)>, Gauge>,
    /// Events applied from peers (the replica's counter, read at scrape).
    applied: Counter,
    /// Deltas refused (the replica's counter, read at scrape).
    deltas_refused: Counter,
    /// Duplicate events received (the replica's counter, read at scrape).
    duplicates: Counter,
    /// Streams found behind a peer's floor (the replica's counter, read
    /// at scrape).
    streams_behind_floor: Counter,
    /// The replica's warnings from `open` (`Replica::open_warnings`).
    open_warnings: Gauge,
    /// Compaction statements offered to peers (every sync session's
    /// counter, summed at scrape: [`SessionTotals`]).
    statements_sent: Counter,
    /// Statements peers offered that were refused (summed likewise).
    statements_refused: Counter,
    /// Frames of a kind this node does not know, skipped (summed likewise).
    frames_skipped: Counter,
    /// Sessions whose first hello went against a checkpoint (summed
    /// likewise).
    first_hellos_against: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric under the `meshlog_` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("meshlog");
        let metrics = Metrics {
            appends: Counter::default(),
            appends_refused: Counter::default(),
            pages: Counter::default(),
            pages_stale: Counter::default(),
            pages_behind: Counter::default(),
            checkpoint_fetches: Counter::default(),
            checkpoint_fetches_missed: Counter::default(),
            connections_refused: Counter::default(),
            connections_open: Gauge::default(),
            sessions_running: Gauge::default(),
            peers_connected: Gauge::default(),
            commit_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            followers: Gauge::default(),
            follow_lagged: Counter::default(),
            follow_stale: Counter::default(),
            requests_denied: Counter::default(),
            peer_auth_refused: Counter::default(),
            tls_handshakes_failed: Counter::default(),
            peer_connected: Family::default(),
            peer_lag_events: Family::default(),
            applied: Counter::default(),
            deltas_refused: Counter::default(),
            duplicates: Counter::default(),
            streams_behind_floor: Counter::default(),
            open_warnings: Gauge::default(),
            statements_sent: Counter::default(),
            statements_refused: Counter::default(),
            frames_skipped: Counter::default(),
            first_hellos_against: Counter::default(),
            registry: Registry::default(),
            render_lock: std::sync::Mutex::new(()),
        };
        metrics.register_requests(&mut registry);
        metrics.register_checkpoints(&mut registry);
        metrics.register_links(&mut registry);
        metrics.register_sessions(&mut registry);
        Metrics {
            registry,
            ..metrics
        }
    }

    /// The API's and the replica's counters, in the order they render.
    fn register_requests(&self, r: &mut Registry) {
        r.register(
            "appends",
            "Events appended through the API",
            self.appends.clone(),
        );
        r.register(
            "appends_refused",
            "Append requests refused",
            self.appends_refused.clone(),
        );
        r.register(
            "applies",
            "Events applied from peers' deltas",
            self.applied.clone(),
        );
        r.register(
            "deltas_refused",
            "Deltas from peers refused by the replica",
            self.deltas_refused.clone(),
        );
        r.register(
            "duplicates",
            "Events received from peers already held",
            self.duplicates.clone(),
        );
        r.register(
            "streams_behind_floor",
            "Streams found behind a peer's floor: held here below it, so that peer cannot serve the gap (nothing is erased; another peer is asked); each is logged at warn",
            self.streams_behind_floor.clone(),
        );
        r.register(
            "open_warnings",
            "Warnings the replica's store gave when the node opened it (e.g. more streams held than streams_max); each is logged at warn",
            self.open_warnings.clone(),
        );
        r.register("pages", "Pages served", self.pages.clone());
        r.register(
            "pages_stale",
            "Page requests answered 410 stale_cursor",
            self.pages_stale.clone(),
        );
        r.register(
            "pages_behind",
            "Pages served to a cursor ahead of this node",
            self.pages_behind.clone(),
        );
        r.register(
            "connections_refused",
            "Connections refused for the connection limit",
            self.connections_refused.clone(),
        );
        r.register(
            "requests_denied",
            "Requests refused 401 or 403",
            self.requests_denied.clone(),
        );
        r.register(
            "peer_auth_refused",
            "Inbound sync links refused by the peer handshake or for a missing certificate",
            self.peer_auth_refused.clone(),
        );
        r.register(
            "tls_handshakes_failed",
            "TLS handshakes that failed",
            self.tls_handshakes_failed.clone(),
        );
    }

    /// The reads' checkpoint fetches (`crate::read::CheckpointFetch`).
    fn register_checkpoints(&self, r: &mut Registry) {
        r.register(
            "checkpoint_fetches",
            "Checkpoints a reader's version-2 token named and this node did not keep, asked of its peers",
            self.checkpoint_fetches.clone(),
        );
        r.register(
            "checkpoint_fetches_missed",
            "Checkpoints asked of the peers that none sent within checkpoint_fetch_ms",
            self.checkpoint_fetches_missed.clone(),
        );
    }

    /// Connections, sessions, followers and peers, then the commit
    /// latency, in the order they render.
    fn register_links(&self, r: &mut Registry) {
        r.register(
            "connections_open",
            "HTTP connections open",
            self.connections_open.clone(),
        );
        r.register(
            "sync_sessions",
            "Sync sessions running, dialed and accepted",
            self.sessions_running.clone(),
        );
        r.register(
            "followers",
            "Follow subscriptions served (GET /follow)",
            self.followers.clone(),
        );
        r.register(
            "follow_lagged",
            "Follow subscriptions told lagged: their connection's queue was full",
            self.follow_lagged.clone(),
        );
        r.register(
            "follow_stale",
            "Follow subscriptions told stale: their cursor was below the floor",
            self.follow_stale.clone(),
        );
        r.register(
            "peers_connected",
            "Dialed peers with an established session",
            self.peers_connected.clone(),
        );
        r.register(
            "peer_connected",
            "Per dialed peer (label `peer`, its URL): 1 while its session is established",
            self.peer_connected.clone(),
        );
        r.register(
            "peer_lag_events",
            "Per dialed peer (label `peer`): events this node holds that the peer has not acknowledged",
            self.peer_lag_events.clone(),
        );
        r.register(
            "commit_seconds",
            "Durable append commit latency",
            self.commit_seconds.clone(),
        );
    }

    /// The sync sessions' counters (`meshlog_sync::SessionState`), summed
    /// over every session of the node, dialed and inbound.
    fn register_sessions(&self, r: &mut Registry) {
        r.register(
            "sync_statements_sent",
            "Compaction statements offered to peers past their floor in Statement frames, each once a session (docs/PROTOCOL.md, Statements offered)",
            self.statements_sent.clone(),
        );
        r.register(
            "sync_statements_refused",
            "Compaction statements peers offered that this node refused (no authority: an admin key it does not trust, a writer not admitted; or another history at the floor); nothing erased, the session goes on. A repeat within a session is counted without being judged again",
            self.statements_refused.clone(),
        );
        r.register(
            "sync_frames_skipped",
            "Sync frames of a kind this node does not know (sent by a newer peer), skipped whole; the session goes on",
            self.frames_skipped.clone(),
        );
        r.register(
            "sync_first_hellos_against",
            "Sync sessions whose first hello went against a checkpoint (kind 9) rather than whole: a dialed link's does unless the node remembers (in its data directory's peer-memory file, across restarts) that the peer does not read one; an inbound session's, when the dialer's hello says it reads one (docs/PROTOCOL.md, The dialer's hello)",
            self.first_hellos_against.clone(),
        );
    }

    /// The metrics in Prometheus text format, after copying in the
    /// replica's own counters and the sync sessions' (`sessions`).
    pub fn render(
        &self,
        stats: meshlog_replica::Stats,
        peers: &[PeerGauge<'_>],
        sessions: SessionTotals,
    ) -> String {
        let _one_at_a_time = self
            .render_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        catch_up(&self.applied, stats.applied);
        catch_up(&self.deltas_refused, stats.deltas_refused);
        catch_up(&self.duplicates, stats.duplicates);
        catch_up(&self.streams_behind_floor, stats.behind_floor);
        catch_up(&self.statements_sent, sessions.statements_sent);
        catch_up(&self.statements_refused, sessions.statements_refused);
        catch_up(&self.frames_skipped, sessions.frames_skipped);
        catch_up(&self.first_hellos_against, sessions.first_hellos_against);
        self.open_warnings
            .set(i64::try_from(stats.open_warnings).unwrap_or(i64::MAX));
        self.peers_connected
            .set(peers.iter().filter(|peer| peer.connected).count() as i64);
        // Rebuilt at every scrape, so a removed peer's series disappear.
        self.peer_connected.clear();
        self.peer_lag_events.clear();
        for peer in peers {
            let labels = vec![("peer".to_owned(), peer.url.to_owned())];
            self.peer_connected
                .get_or_create(&labels)
                .set(i64::from(peer.connected));
            self.peer_lag_events
                .get_or_create(&labels)
                .set(i64::try_from(peer.lag_events).unwrap_or(i64::MAX));
        }
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// What the metrics show of one dialed peer: its gauges, labelled by URL.
/// The caller reads them off the peer links, so this file does not know
/// them.
pub struct PeerGauge<'a> {
    /// The peer's URL (the label).
    pub url: &'a str,
    /// A session is running.
    pub connected: bool,
    /// Events this node holds that the peer has not acknowledged.
    pub lag_events: u64,
}

/// The sync sessions' counters the metrics show, summed over every session
/// of the node since it started: those that ended and those running. The
/// caller sums them off the peer links (`crate::peers::Peers`). A session
/// moving from running to ended is for a moment counted in neither, never
/// in both: the total dips, which the counters do not show (they never go
/// down).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionTotals {
    /// `SessionState::statements_sent`.
    pub statements_sent: u64,
    /// `SessionState::statements_refused`.
    pub statements_refused: u64,
    /// `SessionState::frames_skipped`.
    pub frames_skipped: u64,
    /// Sessions whose `SessionState::first_hello_against` is set.
    pub first_hellos_against: u64,
}

impl SessionTotals {
    /// Adds one session's counters.
    pub fn add(&mut self, session: &meshlog_sync::SessionState) {
        self.statements_sent += session.statements_sent;
        self.statements_refused += session.statements_refused;
        self.frames_skipped += session.frames_skipped;
        self.first_hellos_against += u64::from(session.first_hello_against);
    }
}

/// Moves a counter up to a total counted elsewhere (never down).
fn catch_up(counter: &Counter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}
