//! `meshlog serve`'s settings: the command line (and its environment
//! variables) for where the node lives, an optional TOML file for the rest.
//!
//! Every setting has a default that needs no setup: data in
//! `./meshlog-data`, listening on `127.0.0.1:7070`, no peers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// `meshlog serve`'s command line. Each flag can also come from the
/// environment variable it names.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The data directory: the durable log and the node's `stream-id` file.
    /// Created if missing.
    #[arg(long, env = "MESHLOG_DATA", default_value = "meshlog-data")]
    pub data: PathBuf,
    /// The address to serve HTTP and sync on (`HOST:PORT`; port 0 picks a
    /// free port, printed on stdout as `listening on ADDR`).
    #[arg(long, env = "MESHLOG_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// A peer to sync with, by its URL (`http://127.0.0.1:7071`).
    /// Repeatable; `MESHLOG_PEERS` takes a comma-separated list.
    #[arg(long = "peer", env = "MESHLOG_PEERS", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// The stream id this node writes, as a check: a new data directory
    /// writes the stream its `writer.key` derives (and refuses another
    /// id); an existing one keeps the id its `stream-id` file records
    /// (and refuses another).
    #[arg(long)]
    pub stream_id: Option<u64>,
    /// A writer public key (64 hex digits) this node accepts events of;
    /// `KEY@STREAM` also binds the legacy stream `STREAM` (decimal) to
    /// it. Repeatable, joined to the `--config` file's `writers`; any
    /// writer or admission closes membership (`docs/OPERATIONS.md`).
    #[arg(long = "writer", env = "MESHLOG_WRITERS", value_delimiter = ',')]
    pub writers: Vec<String>,
    /// The mesh admin's public key (64 hex digits), which signs
    /// admissions and bindings (not a bearer secret).
    #[arg(long, env = "MESHLOG_ADMIN_KEY")]
    pub admin_key: Option<String>,
    /// A writer admission the admin signed (hex). Repeatable.
    #[arg(long = "admission", env = "MESHLOG_ADMISSIONS", value_delimiter = ',')]
    pub admissions: Vec<String>,
    /// A legacy-stream binding the admin signed (hex). Repeatable.
    #[arg(long = "binding", env = "MESHLOG_BINDINGS", value_delimiter = ',')]
    pub bindings: Vec<String>,
    /// Refuse events of every stream that comes unsealed (a legacy
    /// stream, from before signed streams): a peer relaying one keeps its
    /// link, that stream is cut from its deltas (`docs/OPERATIONS.md`,
    /// "Writer keys and trust"). Or `require_seals = true` in the
    /// `--config` file. On by default when the membership is closed
    /// (writers or admissions named); `require_seals = false` in the file
    /// turns it off.
    #[arg(long, env = "MESHLOG_REQUIRE_SEALS")]
    pub require_seals: bool,
    /// Relearn this node's own stream from its peers before appending
    /// again, waiting for every peer however long it takes: after
    /// restoring the data directory from a backup (`docs/OPERATIONS.md`,
    /// "Back up and restore"). Without it the node still checks its
    /// configured peers at start, for at most `recovery_wait_ms`.
    #[arg(long, env = "MESHLOG_RECOVER_OWN_STREAM")]
    pub recover_own_stream: bool,
    /// A TOML file with limits and timings (`docs/HTTP.md`, "Limits").
    #[arg(long, env = "MESHLOG_CONFIG")]
    pub config: Option<PathBuf>,
    /// A TOML file of bearer and peer secrets (`docs/SECURITY.md`); reread
    /// on SIGHUP.
    #[arg(long, env = "MESHLOG_SECRETS")]
    pub secrets: Option<PathBuf>,
    /// `read` secrets, comma-separated (joined to the file's).
    #[arg(
        long = "read-secret",
        env = "MESHLOG_READ_SECRETS",
        value_delimiter = ',',
        hide_env_values = true,
        hide = true
    )]
    pub read_secrets: Vec<String>,
    /// `write` secrets, comma-separated (joined to the file's).
    #[arg(
        long = "write-secret",
        env = "MESHLOG_WRITE_SECRETS",
        value_delimiter = ',',
        hide_env_values = true,
        hide = true
    )]
    pub write_secrets: Vec<String>,
    /// `admin` secrets, comma-separated (joined to the file's).
    #[arg(
        long = "admin-secret",
        env = "MESHLOG_ADMIN_SECRETS",
        value_delimiter = ',',
        hide_env_values = true,
        hide = true
    )]
    pub admin_secrets: Vec<String>,
    /// Peer secrets, comma-separated; the first is the one dialed with.
    #[arg(
        long = "peer-secret",
        env = "MESHLOG_PEER_SECRETS",
        value_delimiter = ',',
        hide_env_values = true,
        hide = true
    )]
    pub peer_secrets: Vec<String>,
    /// Serve pages, follow and marks without a secret.
    #[arg(long, env = "MESHLOG_OPEN_READS")]
    pub open_reads: bool,
    /// Serve with no secret configured on a non-loopback address (by
    /// default the node refuses: anyone who reaches it could write).
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// This node's TLS certificate chain (PEM): the port then serves HTTPS
    /// only.
    #[arg(long, env = "MESHLOG_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// This node's TLS private key (PEM).
    #[arg(long, env = "MESHLOG_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The CA (PEM) that peers' certificates must chain to, for links
    /// dialed to `https://` peers and for inbound sync sessions.
    #[arg(long, env = "MESHLOG_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
}

/// The settings a `--config` TOML file may hold; each is optional.
///
/// ```toml
/// body_bytes_max = 4194304        # largest request body (bytes)
/// request_read_timeout_ms = 10000 # a request's head and body must arrive within this
/// connections_max = 256           # more open connections are answered 503 and closed
/// heartbeat_ms = 1000             # sync heartbeat; sync read/write timeouts are 10x
/// append_idle_timeout_ms = 60000  # an append socket idle this long is closed
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSettings {
    /// See [`Limits::body_bytes_max`].
    pub body_bytes_max: Option<usize>,
    /// See [`Limits::request_read_timeout`], in milliseconds.
    pub request_read_timeout_ms: Option<u64>,
    /// See [`Limits::connections_max`].
    pub connections_max: Option<usize>,
    /// See [`SyncSettings::heartbeat`], in milliseconds.
    pub heartbeat_ms: Option<u64>,
    /// See [`SyncSettings::backoff_min`], in milliseconds.
    pub backoff_min_ms: Option<u64>,
    /// See [`SyncSettings::backoff_max`], in milliseconds.
    pub backoff_max_ms: Option<u64>,
    /// See [`SyncSettings::connect_timeout`], in milliseconds.
    pub connect_timeout_ms: Option<u64>,
    /// See [`SyncSettings::frame_bytes_max`].
    pub frame_bytes_max: Option<usize>,
    /// See [`SyncSettings::recovery_wait`], in milliseconds.
    pub recovery_wait_ms: Option<u64>,
    /// See [`SyncSettings::checkpoints`].
    pub sync_checkpoints: Option<bool>,
    /// See [`SyncSettings::checkpoint_fetch`], in milliseconds.
    pub checkpoint_fetch_ms: Option<u64>,
    /// See [`SyncSettings::checkpoint_fetches_max`].
    pub checkpoint_fetches_max: Option<usize>,
    /// See [`Limits::payload_bytes_max`].
    pub payload_bytes_max: Option<usize>,
    /// See [`Limits::shutdown_timeout`], in milliseconds.
    pub shutdown_timeout_ms: Option<u64>,
    /// See [`FollowSettings::followers_max`].
    pub followers_max: Option<usize>,
    /// See [`FollowSettings::connection_followers_max`].
    pub connection_followers_max: Option<usize>,
    /// See [`FollowSettings::queue_frames`].
    pub follow_queue_frames: Option<usize>,
    /// See [`FollowSettings::frame_events_max`].
    pub follow_frame_events_max: Option<usize>,
    /// See [`FollowSettings::heartbeat`], in milliseconds.
    pub follow_heartbeat_ms: Option<u64>,
    /// See [`Limits::connections_per_ip_max`].
    pub connections_per_ip_max: Option<usize>,
    /// See [`Limits::header_bytes_max`].
    pub header_bytes_max: Option<usize>,
    /// See [`Limits::headers_max`].
    pub headers_max: Option<usize>,
    /// See [`Limits::inbound_sessions_max`].
    pub inbound_sessions_max: Option<usize>,
    /// See [`Limits::append_idle_timeout`], in milliseconds.
    pub append_idle_timeout_ms: Option<u64>,
    /// Trusted writer keys (`KEY` or `KEY@STREAM`), see [`crate::trust`].
    pub writers: Option<Vec<String>>,
    /// The mesh admin's public key, see [`crate::trust`].
    pub admin_key: Option<String>,
    /// Admissions the admin signed (hex), see [`crate::trust`].
    pub admissions: Option<Vec<String>>,
    /// Bindings the admin signed (hex), see [`crate::trust`].
    pub bindings: Option<Vec<String>>,
    /// Refuse unsealed streams, see [`NodeConfig::require_seals`].
    pub require_seals: Option<bool>,
    /// See [`SyncSettings::recover_own_stream`].
    pub recover_own_stream: Option<bool>,
}

/// The HTTP server's bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The largest request body accepted; larger ones get `413
    /// body_too_large`. Default 4 MiB.
    pub body_bytes_max: usize,
    /// A request's head must arrive within this, and then its body within
    /// this again; a slower client is cut off (`408 request_timeout` once
    /// the head has arrived, a closed connection before). Default 10 s.
    pub request_read_timeout: Duration,
    /// The most connections served at once (sync upgrades included); one
    /// more is answered `503 too_many_connections` and closed, so the
    /// connections already open are not harmed. Default 256.
    pub connections_max: usize,
    /// The largest payload one event may carry (the replica's limit);
    /// larger ones get `413 payload_too_large`. Default 1 MiB.
    pub payload_bytes_max: usize,
    /// On SIGINT/SIGTERM, how long in-flight requests and sessions get to
    /// finish before the node exits anyway. Default 10 s.
    pub shutdown_timeout: Duration,
    /// The most connections one client address may hold at once; one more
    /// is answered `503 too_many_connections` and closed, so one client
    /// cannot take every connection. Default 64.
    pub connections_per_ip_max: usize,
    /// The largest request head (request line and headers), in bytes; a
    /// larger one is answered `431`. Default 16 KiB (at least 8 KiB).
    pub header_bytes_max: usize,
    /// The most headers one request may carry; more is answered `431`.
    /// Default 64.
    pub headers_max: usize,
    /// The most inbound sync sessions at once; more upgrades are answered
    /// `503 too_many_sessions`. Default 64.
    pub inbound_sessions_max: usize,
    /// An append socket (`GET /events/append`) on which the client sent
    /// no message for this long, with no append of it unanswered, is
    /// closed (1001, reason `idle_timeout`). Default 60 s.
    pub append_idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_bytes_max: 4 << 20,
            request_read_timeout: Duration::from_secs(10),
            connections_max: 256,
            payload_bytes_max: 1 << 20,
            shutdown_timeout: Duration::from_secs(10),
            connections_per_ip_max: 64,
            header_bytes_max: 16 << 10,
            headers_max: 64,
            inbound_sessions_max: 64,
            append_idle_timeout: Duration::from_secs(60),
        }
    }
}

/// The longest `checkpoint_fetch_ms`: 30 s, so that a read never holds its
/// request longer than a client would wait.
pub const CHECKPOINT_FETCH_MS_MAX: u64 = 30_000;

/// How the node syncs with its peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncSettings {
    /// The sessions' heartbeat; their read and write timeouts are ten of it.
    /// Default 1 s.
    pub heartbeat: Duration,
    /// The first redial delay after a session ends or a dial fails; it
    /// doubles per failure up to `backoff_max`. Default 100 ms.
    pub backoff_min: Duration,
    /// The longest redial delay. Default 10 s.
    pub backoff_max: Duration,
    /// How long a dial (TCP connect and the upgrade) may take. Default 5 s.
    pub connect_timeout: Duration,
    /// The largest sync frame this node takes (announced to each peer; a
    /// link carries frames up to the smaller of both sides' settings).
    /// Default and at least 4 MiB, at most 1 GiB: raise it on both ends of
    /// a link whose `payload_bytes_max` is above 3,866,401 bytes.
    pub frame_bytes_max: usize,
    /// At start, how long a node with configured peers holds its appends
    /// at most while it checks that no peer holds more of its own stream
    /// than it does (a data directory restored from an old backup): it
    /// ends the hold as soon as every configured peer's hello has arrived
    /// and nothing of its stream is missing. A peer that holds more keeps
    /// the hold until the node has relearned it, whatever this says.
    /// Default 2 s; 0 turns the check off (`crate::recovery`).
    pub recovery_wait: Duration,
    /// Hold appends until every configured peer (or, with none, one
    /// inbound peer) has been heard and nothing of the own stream is
    /// missing, with no time limit (`--recover-own-stream`).
    pub recover_own_stream: bool,
    /// Whether the sessions gossip checkpoints, and mint them
    /// (`docs/PROTOCOL.md`, "Checkpoints"), so that pages answer version-2
    /// tokens every node reads. Default on, and then only with peers whose
    /// hello says they skip frame kinds they do not know: a node of
    /// protocol 4 built before that, which would end a session on them,
    /// is sent none.
    pub checkpoints: bool,
    /// How long a read waits for its peers to send a checkpoint a
    /// reader's version-2 token names and this node does not keep
    /// (`docs/TOKEN.md`, "An unknown checkpoint"): it asks every session
    /// whose peer takes checkpoint frames (gossip on or off), and answers
    /// `409 unknown_checkpoint` if none sent it within this. Default 2 s,
    /// at most 30 s; 0 never asks.
    pub checkpoint_fetch: Duration,
    /// The most checkpoint fetches in flight at once; a read meeting
    /// another unknown checkpoint then is answered `409` at once, asking
    /// nobody. Default 16.
    pub checkpoint_fetches_max: usize,
}

impl Default for SyncSettings {
    fn default() -> Self {
        SyncSettings {
            heartbeat: Duration::from_secs(1),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            frame_bytes_max: meshlog_sync::FRAME_BYTES_MAX,
            recovery_wait: Duration::from_secs(2),
            recover_own_stream: false,
            checkpoints: true,
            checkpoint_fetch: Duration::from_secs(2),
            checkpoint_fetches_max: 16,
        }
    }
}

/// How the node serves followers over `GET /follow` (`docs/PROTOCOL.md`,
/// "Follow").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowSettings {
    /// The most follow subscriptions the node serves at once, over all
    /// connections; one more is refused (`503 too_many_followers` before
    /// the upgrade, an `error` frame after it). Default 1024.
    pub followers_max: usize,
    /// The most subscriptions one follow connection may hold. Default 8.
    pub connection_followers_max: usize,
    /// The frames one follow connection may have queued for its socket.
    /// A live subscription that finds the queue full is told `lagged` and
    /// dropped: the node never waits on a slow follower. Default 64.
    pub queue_frames: usize,
    /// The most events one `events` frame carries. Default 256.
    pub frame_events_max: usize,
    /// How often each subscription gets a `heartbeat` (and the status
    /// stream a `status`) frame. Default 1 s.
    pub heartbeat: Duration,
    /// A frame that cannot be written to the socket within this ends the
    /// connection. Default 10 s.
    pub write_timeout: Duration,
}

impl Default for FollowSettings {
    fn default() -> Self {
        FollowSettings {
            followers_max: 1024,
            connection_followers_max: 8,
            queue_frames: 64,
            frame_events_max: 256,
            heartbeat: Duration::from_secs(1),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// Everything a node needs to start, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// The data directory.
    pub data: PathBuf,
    /// The address to listen on.
    pub listen: String,
    /// The peers to dial, by URL.
    pub peers: Vec<String>,
    /// The stream id expected (a check: see [`ServeArgs::stream_id`]).
    pub stream_id: Option<u64>,
    /// Which writers the node accepts, and the legacy streams bound to
    /// their keys (open by default; [`crate::trust`]).
    pub trust: meshlog_replica::Membership,
    /// Refuse every stream that comes unsealed
    /// ([`meshlog_replica::Config::require_seals`]): its events are cut
    /// from a peer's deltas, the link kept. `None` (the default): on
    /// when the membership is closed (`trust` admits writers), off while
    /// it is open (a mesh with legacy streams keeps taking them);
    /// resolved where the replica opens
    /// (`crate::replica::OpenSettings::require_seals`). `Some(false)`
    /// turns it off under a closed membership.
    pub require_seals: Option<bool>,
    /// The HTTP server's bounds.
    pub limits: Limits,
    /// Sync timings.
    pub sync: SyncSettings,
    /// Follow limits and timings.
    pub follow: FollowSettings,
    /// Secrets, TLS files and the unauthenticated-listen override.
    pub security: Security,
}

/// Who may talk to the node and how (`docs/SECURITY.md`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Security {
    /// Where the bearer and peer secrets come from.
    pub secrets: crate::auth::SecretSources,
    /// Serve without secrets on a non-loopback address.
    pub allow_unauthenticated: bool,
    /// The node's certificate and key (PEM), if it serves TLS.
    pub tls_cert: Option<PathBuf>,
    /// See [`Security::tls_cert`].
    pub tls_key: Option<PathBuf>,
    /// The CA peers' certificates must chain to.
    pub tls_ca: Option<PathBuf>,
}

impl NodeConfig {
    /// A node in `data` listening on `listen`, with default settings.
    pub fn new(data: impl Into<PathBuf>, listen: impl Into<String>) -> Self {
        NodeConfig {
            data: data.into(),
            listen: listen.into(),
            peers: Vec::new(),
            stream_id: None,
            trust: meshlog_replica::Membership::open(),
            require_seals: None,
            limits: Limits::default(),
            sync: SyncSettings::default(),
            follow: FollowSettings::default(),
            security: Security::default(),
        }
    }

    /// Resolves the command line, reading the `--config` file if given.
    pub fn from_args(args: ServeArgs) -> Result<NodeConfig, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileSettings::default(),
        };
        let mut config = NodeConfig::new(args.data, args.listen);
        config.peers = args
            .peers
            .into_iter()
            .map(|peer| peer.trim().to_owned())
            .filter(|peer| !peer.is_empty())
            .collect();
        config.stream_id = args.stream_id;
        let trust = crate::trust::TrustSettings {
            writers: joined(file.writers.as_deref(), args.writers),
            admin_key: args.admin_key.or_else(|| file.admin_key.clone()),
            admissions: joined(file.admissions.as_deref(), args.admissions),
            bindings: joined(file.bindings.as_deref(), args.bindings),
        };
        config.trust = trust.membership()?;
        // The flag turns seals on; else the file, else the rule where the
        // replica opens (closed membership implies seals).
        config.require_seals = args.require_seals.then_some(true).or(file.require_seals);
        config.sync.recover_own_stream = args.recover_own_stream;
        config.security = Security {
            secrets: crate::auth::SecretSources {
                file: args.secrets,
                read: args.read_secrets,
                write: args.write_secrets,
                admin: args.admin_secrets,
                peer: args.peer_secrets,
                open_reads: args.open_reads,
            },
            allow_unauthenticated: args.allow_unauthenticated,
            tls_cert: args.tls_cert,
            tls_key: args.tls_key,
            tls_ca: args.tls_ca,
        };
        config.apply(&file);
        // Only the file sets what has a range; the defaults are within.
        if let Some(path) = &args.config {
            config.check().map_err(|error| ConfigError::OutOfRange {
                path: path.clone(),
                error,
            })?;
        }
        Ok(config)
    }

    /// Each bounded setting within the range it takes, or the first that is
    /// not, named as the `--config` file names it. [`crate::Node::start`]
    /// checks it too, so a node built in code is held to the same ranges
    /// as one configured by file: it refuses to start rather than run on
    /// another value than it was given.
    pub fn check(&self) -> Result<(), OutOfRange> {
        match self
            .bounds()
            .into_iter()
            .find(|&(_, value, range)| value < range.min || value > range.max)
        {
            Some((setting, value, range)) => Err(OutOfRange {
                setting,
                value,
                range,
            }),
            None => Ok(()),
        }
    }

    /// Each bounded setting as the `--config` file names it, its value
    /// (durations in milliseconds) and the range it takes, in the order
    /// [`NodeConfig::check`] looks for the first out of range.
    fn bounds(&self) -> impl IntoIterator<Item = (&'static str, u64, SettingRange)> {
        let at_least = |min: u64| SettingRange { min, max: u64::MAX };
        let up_to = |max: u64| SettingRange { min: 0, max };
        let ms = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        // A duration is refused at zero (less than a millisecond but more
        // than nothing is taken).
        let nonzero = |duration: Duration| u64::from(!duration.is_zero()).max(ms(duration));
        let (limits, sync, follow) = (&self.limits, &self.sync, &self.follow);
        [
            (
                "connections_per_ip_max",
                as_u64(limits.connections_per_ip_max),
                at_least(1),
            ),
            // hyper's smallest read buffer.
            (
                "header_bytes_max",
                as_u64(limits.header_bytes_max),
                at_least(8192),
            ),
            ("headers_max", as_u64(limits.headers_max), at_least(1)),
            (
                "append_idle_timeout_ms",
                nonzero(limits.append_idle_timeout),
                at_least(1),
            ),
            ("heartbeat_ms", nonzero(sync.heartbeat), at_least(1)),
            (
                "checkpoint_fetch_ms",
                ms(sync.checkpoint_fetch),
                up_to(CHECKPOINT_FETCH_MS_MAX),
            ),
            (
                "checkpoint_fetches_max",
                as_u64(sync.checkpoint_fetches_max),
                at_least(1),
            ),
            (
                "frame_bytes_max",
                as_u64(sync.frame_bytes_max),
                SettingRange {
                    min: as_u64(meshlog_sync::FRAME_BYTES_MAX),
                    max: as_u64(meshlog_sync::FRAME_BYTES_CEILING),
                },
            ),
            (
                "connection_followers_max",
                as_u64(follow.connection_followers_max),
                at_least(1),
            ),
            (
                "follow_frame_events_max",
                as_u64(follow.frame_events_max),
                at_least(1),
            ),
            (
                "follow_heartbeat_ms",
                nonzero(follow.heartbeat),
                at_least(1),
            ),
            // The redial delay doubles from the least to the most.
            (
                "backoff_min_ms",
                ms(sync.backoff_min),
                up_to(ms(sync.backoff_max)),
            ),
        ]
    }

    /// Takes the file's settings (then checked by [`NodeConfig::check`]).
    fn apply(&mut self, file: &FileSettings) {
        let ms = Duration::from_millis;
        let limits = &mut self.limits;
        limits.body_bytes_max = file.body_bytes_max.unwrap_or(limits.body_bytes_max);
        if let Some(v) = file.request_read_timeout_ms {
            limits.request_read_timeout = ms(v);
        }
        limits.connections_max = file.connections_max.unwrap_or(limits.connections_max);
        limits.payload_bytes_max = file.payload_bytes_max.unwrap_or(limits.payload_bytes_max);
        if let Some(v) = file.shutdown_timeout_ms {
            limits.shutdown_timeout = ms(v);
        }
        limits.connections_per_ip_max = file
            .connections_per_ip_max
            .unwrap_or(limits.connections_per_ip_max);
        limits.header_bytes_max = file.header_bytes_max.unwrap_or(limits.header_bytes_max);
        limits.headers_max = file.headers_max.unwrap_or(limits.headers_max);
        limits.inbound_sessions_max = file
            .inbound_sessions_max
            .unwrap_or(limits.inbound_sessions_max);
        if let Some(v) = file.append_idle_timeout_ms {
            limits.append_idle_timeout = ms(v);
        }
        let sync = &mut self.sync;
        if let Some(v) = file.heartbeat_ms {
            sync.heartbeat = ms(v);
        }
        if let Some(v) = file.backoff_min_ms {
            sync.backoff_min = ms(v);
        }
        if let Some(v) = file.backoff_max_ms {
            sync.backoff_max = ms(v);
        }
        if let Some(v) = file.connect_timeout_ms {
            sync.connect_timeout = ms(v);
        }
        sync.frame_bytes_max = file.frame_bytes_max.unwrap_or(sync.frame_bytes_max);
        if let Some(v) = file.recovery_wait_ms {
            sync.recovery_wait = ms(v);
        }
        sync.recover_own_stream |= file.recover_own_stream.unwrap_or(false);
        sync.checkpoints = file.sync_checkpoints.unwrap_or(sync.checkpoints);
        if let Some(v) = file.checkpoint_fetch_ms {
            sync.checkpoint_fetch = ms(v);
        }
        sync.checkpoint_fetches_max = file
            .checkpoint_fetches_max
            .unwrap_or(sync.checkpoint_fetches_max);
        let follow = &mut self.follow;
        follow.followers_max = file.followers_max.unwrap_or(follow.followers_max);
        follow.connection_followers_max = file
            .connection_followers_max
            .unwrap_or(follow.connection_followers_max);
        follow.queue_frames = file.follow_queue_frames.unwrap_or(follow.queue_frames);
        follow.frame_events_max = file
            .follow_frame_events_max
            .unwrap_or(follow.frame_events_max);
        if let Some(v) = file.follow_heartbeat_ms {
            follow.heartbeat = ms(v);
        }
    }
}

/// A list setting: the file's entries, then the command line's (empty
/// entries dropped).
fn joined(file: Option<&[String]>, args: Vec<String>) -> Vec<String> {
    file.unwrap_or_default()
        .iter()
        .cloned()
        .chain(args)
        .map(|entry| entry.trim().to_owned())
        .filter(|entry| !entry.is_empty())
        .collect()
}

fn as_u64(value: usize) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// A setting out of the range it takes (see [`NodeConfig::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{setting} = {value} is out of range: it takes {range}")]
pub struct OutOfRange {
    /// The setting, as the `--config` file names it.
    pub setting: &'static str,
    /// Its value (durations in milliseconds).
    pub value: u64,
    /// The values it takes.
    pub range: SettingRange,
}

/// The values a setting takes, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingRange {
    /// The least.
    pub min: u64,
    /// The most (`u64::MAX`: no upper bound).
    pub max: u64,
}

impl std::fmt::Display for SettingRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.max == u64::MAX {
            write!(f, "at least {}", self.min)
        } else {
            write!(f, "from {} to {}", self.min, self.max)
        }
    }
}

fn read_file(path: &Path) -> Result<FileSettings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        message: source.to_string(),
    })
}

/// Why the settings could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The `--config` file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The `--config` file is not valid TOML or holds an unknown setting.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's reason.
        message: String,
    },
    /// A trust entry (file or flag) could not be decoded or verified.
    #[error("trust configuration: {0}")]
    Trust(#[from] crate::trust::TrustError),
    /// A setting of the `--config` file is out of the range it takes.
    #[error("{path}: {error}")]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// Which setting, its value in the file, and its range.
        error: OutOfRange,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: ServeArgs,
    }

    #[test]
    fn defaults_need_no_setup() {
        let args = Wrapper::try_parse_from(["serve"]).unwrap().args;
        let config = NodeConfig::from_args(args).unwrap();
        assert_eq!(config.data, PathBuf::from("meshlog-data"));
        assert_eq!(config.listen, "127.0.0.1:7070");
        assert!(config.peers.is_empty());
        assert_eq!(config.limits, Limits::default());
        assert_eq!(config.sync, SyncSettings::default());
    }

    #[test]
    fn peers_repeat_and_a_toml_file_sets_the_rest() {
        let dir = std::env::temp_dir().join(format!("meshlog-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("node.toml");
        std::fs::write(
            &file,
            "body_bytes_max = 1024\nheartbeat_ms = 250\nconnections_max = 8\n\
             sync_checkpoints = false\ncheckpoint_fetch_ms = 500\ncheckpoint_fetches_max = 2\n",
        )
        .unwrap();
        let args = Wrapper::try_parse_from([
            "serve",
            "--peer",
            "http://a:1",
            "--peer",
            "http://b:2",
            "--config",
            file.to_str().unwrap(),
        ])
        .unwrap()
        .args;
        let config = NodeConfig::from_args(args).unwrap();
        assert_eq!(config.peers, vec!["http://a:1", "http://b:2"]);
        assert_eq!(config.limits.body_bytes_max, 1024);
        assert_eq!(config.limits.connections_max, 8);
        assert_eq!(config.sync.heartbeat, Duration::from_millis(250));
        // On by default: the key turns it off.
        assert!(!config.sync.checkpoints);
        assert_eq!(config.sync.checkpoint_fetch, Duration::from_millis(500));
        assert_eq!(config.sync.checkpoint_fetches_max, 2);

        std::fs::write(&file, "body_bytes = 1\n").unwrap();
        let args = Wrapper::try_parse_from(["serve", "--config", file.to_str().unwrap()])
            .unwrap()
            .args;
        let error = NodeConfig::from_args(args).unwrap_err();
        assert!(error.to_string().contains("body_bytes"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The trust configuration comes from the file and the flags, joined;
    /// an entry that does not decode stops the start, named.
    #[test]
    fn trust_comes_from_the_file_and_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.toml");
        let hex = |key: meshlog_replica::WriterPublicKey| key.to_string();
        let (a, b) = (
            meshlog_replica::WriterKey::from_bytes([1; 32]).public(),
            meshlog_replica::WriterKey::from_bytes([2; 32]).public(),
        );
        std::fs::write(&file, format!("writers = [\"{}@4242\"]\n", hex(a))).unwrap();
        let parse = |extra: &[&str]| {
            let mut argv = vec!["serve", "--config", file.to_str().unwrap()];
            argv.extend_from_slice(extra);
            NodeConfig::from_args(Wrapper::try_parse_from(argv).unwrap().args)
        };
        let config = parse(&["--writer", &hex(b)]).unwrap();
        assert!(!config.trust.is_open());
        assert!(config.trust.admits(a.stream(), &a));
        assert!(config.trust.admits(b.stream(), &b));
        assert_eq!(
            config
                .trust
                .binding(meshlog_cursor::StreamId::new(4242))
                .map(|x| x.key),
            Some(a)
        );
        let error = parse(&["--writer", "nothex"]).unwrap_err();
        assert!(matches!(error, ConfigError::Trust(_)), "{error}");
        assert!(
            error.to_string().contains("writers entry \"nothex\""),
            "{error}"
        );
        // No trust settings: open, seals not required.
        std::fs::write(&file, "").unwrap();
        assert!(parse(&[]).unwrap().trust.is_open());
        assert_eq!(parse(&[]).unwrap().require_seals, None);
        // require_seals: from the flag or the file.
        assert_eq!(
            parse(&["--require-seals"]).unwrap().require_seals,
            Some(true)
        );
        std::fs::write(&file, "require_seals = true\n").unwrap();
        assert_eq!(parse(&[]).unwrap().require_seals, Some(true));
        // A closed membership leaves it to the rule where the replica
        // opens (`OpenSettings::require_seals`: on), unless the file says
        // not.
        std::fs::write(&file, format!("writers = [\"{}@4242\"]\n", hex(a))).unwrap();
        assert!(!parse(&[]).unwrap().trust.is_open());
        assert_eq!(parse(&[]).unwrap().require_seals, None);
        std::fs::write(
            &file,
            format!("writers = [\"{}@4242\"]\nrequire_seals = false\n", hex(a)),
        )
        .unwrap();
        assert_eq!(parse(&[]).unwrap().require_seals, Some(false));
    }

    /// A bounded setting is taken as given at either edge of its range
    /// (the sync frame limit: at least the 4 MiB every peer takes, at most
    /// 1 GiB) and refused one past it, with an error that names the
    /// setting, the value and the range: never quietly raised or lowered.
    #[test]
    fn settings_out_of_their_range_are_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("meshlog-range-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("node.toml");
        let resolve = |text: &str| {
            std::fs::write(&file, text).unwrap();
            let args = Wrapper::try_parse_from(["serve", "--config", file.to_str().unwrap()])
                .unwrap()
                .args;
            NodeConfig::from_args(args)
        };
        let (frame_min, frame_max) = (
            meshlog_sync::FRAME_BYTES_MAX,
            meshlog_sync::FRAME_BYTES_CEILING,
        );
        // At the edges of each range: taken as given.
        for text in [
            format!("frame_bytes_max = {frame_min}\n"),
            format!("frame_bytes_max = {frame_max}\n"),
            "header_bytes_max = 8192\nheaders_max = 1\nheartbeat_ms = 1\n".into(),
            "connections_per_ip_max = 1\nconnection_followers_max = 1\n".into(),
            "follow_frame_events_max = 1\nfollow_heartbeat_ms = 1\n".into(),
            "backoff_min_ms = 5\nbackoff_max_ms = 5\n".into(),
            "checkpoint_fetch_ms = 0\ncheckpoint_fetches_max = 1\n".into(),
            "checkpoint_fetch_ms = 30000\n".into(),
        ] {
            let config = resolve(&text).unwrap_or_else(|error| panic!("{text}: {error}"));
            if text.starts_with("frame") {
                assert!([frame_min, frame_max].contains(&config.sync.frame_bytes_max));
            }
        }
        let config = resolve("frame_bytes_max = 16777216\nheader_bytes_max = 9000\n").unwrap();
        assert_eq!(config.sync.frame_bytes_max, 16 << 20);
        assert_eq!(config.limits.header_bytes_max, 9000);
        // One past an edge: refused, the setting named with its range.
        for (text, setting, value, range) in [
            (
                format!("frame_bytes_max = {}\n", frame_min - 1),
                "frame_bytes_max",
                frame_min - 1,
                format!("from {frame_min} to {frame_max}"),
            ),
            (
                format!("frame_bytes_max = {}\n", frame_max + 1),
                "frame_bytes_max",
                frame_max + 1,
                format!("from {frame_min} to {frame_max}"),
            ),
            (
                "header_bytes_max = 8191\n".into(),
                "header_bytes_max",
                8191,
                "at least 8192".into(),
            ),
            (
                "headers_max = 0\n".into(),
                "headers_max",
                0,
                "at least 1".into(),
            ),
            (
                "heartbeat_ms = 0\n".into(),
                "heartbeat_ms",
                0,
                "at least 1".into(),
            ),
            (
                "connections_per_ip_max = 0\n".into(),
                "connections_per_ip_max",
                0,
                "at least 1".into(),
            ),
            (
                "connection_followers_max = 0\n".into(),
                "connection_followers_max",
                0,
                "at least 1".into(),
            ),
            (
                "follow_frame_events_max = 0\n".into(),
                "follow_frame_events_max",
                0,
                "at least 1".into(),
            ),
            (
                "follow_heartbeat_ms = 0\n".into(),
                "follow_heartbeat_ms",
                0,
                "at least 1".into(),
            ),
            (
                "backoff_min_ms = 6\nbackoff_max_ms = 5\n".into(),
                "backoff_min_ms",
                6,
                "from 0 to 5".into(),
            ),
            // Against the other's default (100 ms and 10 s): the least
            // is named, above the most.
            (
                "backoff_max_ms = 99\n".into(),
                "backoff_min_ms",
                100,
                "from 0 to 99".into(),
            ),
            (
                "backoff_min_ms = 10001\n".into(),
                "backoff_min_ms",
                10_001,
                "from 0 to 10000".into(),
            ),
            (
                "checkpoint_fetch_ms = 30001\n".into(),
                "checkpoint_fetch_ms",
                30_001,
                "from 0 to 30000".into(),
            ),
            (
                "checkpoint_fetches_max = 0\n".into(),
                "checkpoint_fetches_max",
                0,
                "at least 1".into(),
            ),
        ] {
            let error = resolve(&text).expect_err(&text);
            let message = error.to_string();
            match error {
                ConfigError::OutOfRange { error, .. } => {
                    assert_eq!(
                        (error.setting, error.value),
                        (setting, value as u64),
                        "{text}"
                    );
                }
                other => panic!("{text}: {other}"),
            }
            assert!(
                message.contains(&format!(
                    "{setting} = {value} is out of range: it takes {range}"
                )),
                "{text}: {message}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A node built in code is held to the same ranges: `Node::start`
    /// refuses a setting out of its range, named, before it opens or binds
    /// anything.
    #[tokio::test]
    async fn a_node_built_in_code_with_a_setting_out_of_range_does_not_start() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        type Set = fn(&mut NodeConfig);
        let cases: [(&str, Set); 3] = [
            ("frame_bytes_max = 1024", |c| c.sync.frame_bytes_max = 1024),
            ("heartbeat_ms = 0", |c| c.sync.heartbeat = Duration::ZERO),
            ("backoff_min_ms = 2000", |c| {
                c.sync.backoff_min = Duration::from_secs(2);
                c.sync.backoff_max = Duration::from_secs(1);
            }),
        ];
        for (says, set) in cases {
            let mut config = NodeConfig::new(&data, "127.0.0.1:0");
            set(&mut config);
            let error = match crate::Node::start(config).await {
                Err(error) => error.to_string(),
                Ok(_) => panic!("{says}: the node started"),
            };
            assert!(error.starts_with(says), "{says}: {error}");
            assert!(!data.exists(), "{says}: the data directory was made");
        }
        // Less than a millisecond, but more than nothing, is taken.
        let mut config = NodeConfig::new(&data, "127.0.0.1:0");
        config.sync.heartbeat = Duration::from_micros(500);
        assert_eq!(config.check(), Ok(()));
    }
}
