//! The follow protocol's JSON frames (`docs/PROTOCOL.md`, "Follow"), shared
//! by the server and the clients: the node writes them, `Follower`
//! (`super::Follower`) and the browser page read them.
//!
//! Every server frame names the subscription it belongs to in `stream`
//! (`all`, `writer:<decimal id>` or `status`), so one connection can carry
//! several subscriptions.

use serde::{Deserialize, Serialize};

use crate::http::json::{ChainsJson, DigestJson, EventJson, LostJson, PeerJson, VectorJson};
use meshlog_cursor::StreamId;

/// What a follower follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FollowStream {
    /// The whole log, in page order.
    All,
    /// One writer's stream, in seq order.
    Writer(StreamId),
    /// The node's marks, floor, digest, peers and their lag.
    Status,
}

impl FollowStream {
    /// Parses `all`, `status` or `writer:<decimal id>` (id non-zero).
    ///
    /// ```
    /// use meshlog_node::follow::FollowStream;
    /// let stream = FollowStream::parse("writer:42").unwrap();
    /// assert_eq!(stream.to_string(), "writer:42");
    /// assert!(FollowStream::parse("writer:0").is_none());
    /// ```
    pub fn parse(text: &str) -> Option<FollowStream> {
        match text {
            "all" => Some(FollowStream::All),
            "status" => Some(FollowStream::Status),
            _ => {
                let id: u64 = text.strip_prefix("writer:")?.parse().ok()?;
                (id != 0).then(|| FollowStream::Writer(StreamId::new(id)))
            }
        }
    }
}

impl std::fmt::Display for FollowStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FollowStream::All => f.write_str("all"),
            FollowStream::Status => f.write_str("status"),
            FollowStream::Writer(id) => write!(f, "writer:{}", id.get()),
        }
    }
}

/// A frame the node sends a follower (a WebSocket text message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerFrame {
    /// Events past `extends`: applying them to a cursor equal to (or
    /// covering) `extends` gives `next`, with no hole.
    Events {
        /// The subscription.
        stream: String,
        /// The cursor this frame continues from (a token).
        extends: String,
        /// The cursor after it (a token).
        next: String,
        /// In page order (`GET /events`'s event JSON).
        events: Vec<EventJson>,
    },
    /// The node's head for the subscription (its marks; for a writer, that
    /// writer's entry alone). Every frame queued before it has been
    /// queued in order: a follower whose cursor stays below it with nothing
    /// arriving has lost frames.
    Heartbeat {
        /// The subscription.
        stream: String,
        /// The head (a token).
        head: String,
    },
    /// The connection's queue was full when live events were due: the node
    /// stopped pushing this subscription. Page from `cursor` (over `GET
    /// /events`) and subscribe again.
    Lagged {
        /// The subscription.
        stream: String,
        /// The last cursor pushed (the follower's cursor if it missed no
        /// frame).
        cursor: String,
    },
    /// The subscription's cursor is below the floor: the `410` body of
    /// `GET /events`. The subscription ends.
    Stale {
        /// The subscription.
        stream: String,
        /// Always `stale_cursor`.
        error: String,
        /// For humans.
        message: String,
        /// Every stream's range lost.
        lost: Vec<LostJson>,
        /// The token to resume from, accepting the gap.
        resume: String,
    },
    /// The node's state, on every change and every heartbeat.
    Status(StatusJson),
    /// A subscription request was refused (or the node failed one).
    Error {
        /// The subscription, when one is named.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream: Option<String>,
        /// A stable code (`bad_stream`, `bad_token`, `too_many_followers`, ...).
        error: String,
        /// For humans.
        message: String,
    },
}

/// The `status` stream's frame: what `GET /marks` answers, pushed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusJson {
    /// Always `status`.
    pub stream: String,
    /// The node's own stream id, in decimal.
    pub node: String,
    /// Per stream, the last seq held.
    pub marks: VectorJson,
    /// Per stream, the last seq compacted away.
    pub floor: VectorJson,
    /// The marks as a token.
    pub token: String,
    /// The digest of the events held (moves with the floor).
    pub digest: DigestJson,
    /// The chain heads (equal whatever each node compacted; an older
    /// node's frame has none).
    #[serde(default)]
    pub chains: ChainsJson,
    /// The dialed peers, with their lag.
    pub peers: Vec<PeerJson>,
    /// When the node built this frame: its wall clock, ms since the epoch
    /// (the clock the console's rates divide by).
    #[serde(default)]
    pub time_ms: u64,
    /// Events this node appended since it started.
    #[serde(default)]
    pub appended: u64,
    /// Events received from peers that became visible here since it
    /// started.
    #[serde(default)]
    pub received: u64,
    /// Every link, dialed then inbound: its state, lag and freshness.
    #[serde(default)]
    pub links: Vec<LinkJson>,
    /// Every writer's stream held, by id: head, floor, events held and
    /// when its last event was appended.
    #[serde(default)]
    pub writers: Vec<WriterJson>,
}

/// One sync link as the status stream shows it (`docs/PROTOCOL.md`,
/// "Follow").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkJson {
    /// `dialed` (a configured peer) or `inbound` (a peer that dialed
    /// this node).
    pub direction: String,
    /// The peer: its URL when dialed, `host:port` when inbound.
    pub peer: String,
    /// The peer's stream id, once its hello arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// `up` (exchanging), `limit` (up, but a limit keeps some streams
    /// from crossing), `connecting` (no hello yet), `reconnecting` (down,
    /// redialing) or `refused` (the peer answered the dial without
    /// upgrading: a secret or certificate it does not accept).
    pub state: String,
    /// Why, when the state is not `up`: the limits hit, or the last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Events this node holds that the peer has not acknowledged.
    pub lag_events: u64,
    /// How long ago the last frame from the peer arrived, in ms (none
    /// before the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange_age_ms: Option<u64>,
}

/// One writer's stream as the status stream shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterJson {
    /// The stream id, in decimal.
    pub stream: String,
    /// The last seq held (the stream's mark).
    pub head: u64,
    /// The last seq compacted away.
    pub floor: u64,
    /// Events held: `head - floor`.
    pub held: u64,
    /// When its last held event was appended (its writer's clock, ms since
    /// the epoch); none when it holds none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_time_ms: Option<u64>,
}

/// A frame a follower sends the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientFrame {
    /// Adds (or replaces) the subscription to `stream` from `after`.
    Subscribe {
        /// `all`, `writer:<id>` or `status`.
        stream: String,
        /// The token to follow after (absent: the start).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
    },
    /// Ends the subscription to `stream`.
    Unsubscribe {
        /// The subscription.
        stream: String,
    },
}
