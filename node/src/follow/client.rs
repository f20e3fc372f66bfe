//! [`Follower`]: a Rust client of `GET /follow`.
//!
//! A `Stream` of [`FollowItem`]s. Every event past the starting cursor is
//! yielded exactly once, each stream in seq order with no hole, and
//! [`Follower::cursor`] is the cursor to persist: it covers exactly the
//! events yielded so far (plus a stale gap the caller chose to accept).
//!
//! The rules (`docs/PROTOCOL.md`, "The follower's states"):
//!
//! - an `events` frame whose `next` the cursor already covers is a
//!   duplicate: ignored;
//! - one whose `extends` the cursor covers is applied (its events not yet
//!   covered are yielded, the cursor joins `next`);
//! - any other is a gap (a frame was lost or reordered): the follower pages
//!   from its own cursor over `GET /events` to the node's head, then goes
//!   on; so does a `heartbeat` head that stays ahead of the cursor for
//!   `gap_timeout` with nothing advancing it (a lost tail);
//! - `lagged`: yielded, then the follower pages from its cursor and
//!   subscribes again;
//! - `stale`: yielded with what was lost; the stream ends there unless
//!   `accept_stale`, which resumes from the node's `resume` token;
//! - a lost connection (or `idle_timeout` with no frame) is retried with
//!   jittered exponential backoff, on the next node of the list, from the
//!   cursor: a cursor is valid on every node of the mesh.
//!
//! Every token the node hands it (a page's `next`, which is version 2
//! where that is shorter, and the frames' tokens, which it asks to be
//! the shortest too: `tokens=short`) is read as either version: a
//! version-2 token is expanded with its checkpoint, asked of the node
//! once (`GET /checkpoint`, checked against its name) and kept.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use meshlog_cursor::token::{self, Token};
use meshlog_cursor::{Checkpoint, StreamId, VersionVector};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use super::frame::{FollowStream, ServerFrame, StatusJson};
use crate::client::{Client, PageOutcome};
use crate::http::json::{EventJson, LostJson};
use crate::url::NodeUrl;

/// How a [`Follower`] follows.
#[derive(Debug, Clone)]
pub struct FollowerConfig {
    /// The nodes to follow, by base URL (`http://127.0.0.1:7070`); the
    /// follower starts on the first and moves to the next on failure.
    pub nodes: Vec<String>,
    /// What to follow.
    pub stream: FollowStream,
    /// The cursor to follow after (empty: the start of the log). A
    /// version-2 token's cursor is `Client::cursor`'s (it asks the node
    /// for the checkpoint).
    pub after: VersionVector,
    /// How long a heartbeat's head may stay ahead of the cursor, with no
    /// frame advancing it, before the follower refetches. Default 3 s.
    pub gap_timeout: Duration,
    /// A connection with no frame at all for this long is dropped and
    /// redialed (the node heartbeats every second). Default 5 s.
    pub idle_timeout: Duration,
    /// The first redial delay; it doubles per failure. Default 100 ms.
    pub backoff_min: Duration,
    /// The longest redial delay. Default 5 s.
    pub backoff_max: Duration,
    /// The page length of refetches over `GET /events`. Default 256.
    pub page_limit: usize,
    /// Connecting and each HTTP request must finish within this. Default 10 s.
    pub request_timeout: Duration,
    /// On a stale cursor, resume from the node's `resume` token (the gap is
    /// reported either way). Default `false`: the stream ends.
    pub accept_stale: bool,
    /// A bearer secret of the `read` role, for a node that needs one
    /// (`docs/SECURITY.md`). Default none.
    pub token: Option<String>,
    /// The TLS client for `https://` nodes: which CA their certificates
    /// chain to (`meshlog_node::tls::client_trusting`). Default none:
    /// `https://` nodes are refused.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl FollowerConfig {
    /// Follows `stream` on `nodes` from the start, with default timings.
    pub fn new(nodes: Vec<String>, stream: FollowStream) -> FollowerConfig {
        FollowerConfig {
            nodes,
            stream,
            after: VersionVector::new(),
            gap_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(5),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            page_limit: 256,
            request_timeout: Duration::from_secs(10),
            accept_stale: false,
            token: None,
            tls: None,
        }
    }
}

/// What a [`Follower`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowItem {
    /// An event past the cursor, never yielded before.
    Event(EventJson),
    /// The node's status (the `status` stream).
    Status(StatusJson),
    /// Connected (or reconnected) to this node; following resumes from
    /// the cursor.
    Connected {
        /// The node's URL.
        node: String,
    },
    /// A gap was detected (a frame lost, reordered or a silent tail) and
    /// refetched over `GET /events` from the cursor.
    Refetched {
        /// How many events the refetch yielded (as `Event`s, just before
        /// this item).
        events: usize,
    },
    /// The node stopped pushing (this follower was slow). The follower
    /// paged from its cursor and subscribed again.
    Lagged {
        /// The cursor the node had pushed up to.
        cursor: VersionVector,
    },
    /// The cursor fell below the node's floor: these events are gone.
    Stale {
        /// Every stream's range lost.
        lost: Vec<LostJson>,
        /// The cursor past the gap.
        resume: VersionVector,
        /// Whether the follower goes on from `resume` (`accept_stale`);
        /// if not, this is the last item.
        accepted: bool,
    },
}

/// Why a [`Follower`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// No node to follow.
    #[error("no node to follow")]
    NoNodes,
    /// A node URL is not `http://host:port` or `https://host:port`.
    #[error("bad node URL {0:?}: expected http://host:port or https://host:port")]
    BadUrl(String),
    /// An `https://` node, but no TLS client configured.
    #[error("{0} is https://, but the follower has no TLS configuration (FollowerConfig::tls)")]
    NoTls(String),
}

/// A live follower of one node (or a list of them, for failover). Drop it
/// to stop.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use futures_util::StreamExt;
/// use meshlog_node::follow::{FollowItem, FollowStream, Follower, FollowerConfig};
///
/// let config = FollowerConfig::new(vec!["http://127.0.0.1:7070".into()], FollowStream::All);
/// let mut follower = Follower::start(config)?;
/// while let Some(item) = follower.next().await {
///     if let FollowItem::Event(event) = item {
///         println!("{} {} {:?}", event.stream, event.seq, event.payload);
///         let _persist = follower.token(); // covers exactly what was yielded
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub struct Follower {
    items: mpsc::Receiver<FollowItem>,
    cursor: VersionVector,
    task: JoinHandle<()>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Follower {
    /// Starts following (on the current tokio runtime).
    pub fn start(config: FollowerConfig) -> Result<Follower, FollowError> {
        if config.nodes.is_empty() {
            return Err(FollowError::NoNodes);
        }
        let nodes: Vec<Node> = config
            .nodes
            .iter()
            .map(|url| {
                let parsed = NodeUrl::parse(url).map_err(|_| FollowError::BadUrl(url.clone()))?;
                if parsed.secure && config.tls.is_none() {
                    return Err(FollowError::NoTls(url.clone()));
                }
                // Refetches go through the node's one HTTP client.
                let client = Client::with_tls(url, config.token.as_deref(), config.tls.clone())
                    .map_err(|_| FollowError::BadUrl(url.clone()))?;
                Ok(Node {
                    url: parsed,
                    client,
                })
            })
            .collect::<Result<_, FollowError>>()?;
        let (sender, items) = mpsc::channel(256);
        let cursor = config.after.clone();
        let task = tokio::spawn(run(
            Task {
                config,
                nodes,
                items: sender,
                cursor: cursor.clone(),
                checkpoints: Vec::new(),
            },
            seed(),
        ));
        Ok(Follower {
            items,
            cursor,
            task,
        })
    }

    /// The cursor covering every event yielded so far: persist it and
    /// start again from it (on any node) to go on where this left off.
    pub fn cursor(&self) -> &VersionVector {
        &self.cursor
    }

    /// [`Follower::cursor`] as a token, version 1 (every node reads it;
    /// the follower keeps no checkpoint to write version 2 against).
    pub fn token(&self) -> String {
        token::encode_text(&self.cursor).expect("a follower's cursor encodes")
    }
}

impl futures_util::Stream for Follower {
    type Item = FollowItem;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<FollowItem>> {
        let this = &mut *self;
        let item = std::task::ready!(this.items.poll_recv(cx));
        match &item {
            Some(FollowItem::Event(event)) => {
                if let Ok(stream) = event.stream.parse::<u64>() {
                    this.cursor.advance(StreamId::new(stream), event.seq);
                }
            }
            Some(FollowItem::Stale {
                resume,
                accepted: true,
                ..
            }) => this.cursor.join(resume),
            _ => {}
        }
        Poll::Ready(item)
    }
}

struct Task {
    config: FollowerConfig,
    /// The nodes, parsed, each with its HTTP client.
    nodes: Vec<Node>,
    items: mpsc::Sender<FollowItem>,
    /// The cursor of what was handed to `items` (the consumer's runs
    /// behind it by what the channel holds).
    cursor: VersionVector,
    /// The checkpoints the nodes' version-2 tokens named, newest last, at
    /// most `CHECKPOINTS_KEPT`.
    checkpoints: Vec<Checkpoint>,
}

/// The checkpoints a follower keeps to expand version-2 tokens: as many
/// as a replica keeps.
const CHECKPOINTS_KEPT: usize = 16;

/// The frames of one follow connection.
type Frames = futures_util::stream::SplitStream<tokio_tungstenite::WebSocketStream<Box<dyn Io>>>;

/// What one session knows as it reads frames: the node, the subscription's
/// name, whether anything was delivered (the backoff resets), and since
/// when a heartbeat's head has been ahead of the cursor.
struct Seen<'a> {
    node: &'a Node,
    name: &'a str,
    delivered: &'a mut bool,
    behind_since: &'a mut Option<Instant>,
}

/// How a session ended.
enum End {
    /// Subscribe again on the same node at once (after lagged, or an
    /// accepted stale).
    Resubscribe,
    /// Stop following (a stale cursor not accepted, or the consumer left).
    Stop,
    /// The node failed us: back off, try the next one.
    Failed(String),
}

async fn run(mut task: Task, mut rng: u64) {
    let mut index = 0;
    let mut backoff = task.config.backoff_min;
    loop {
        let (delivered, end) = task.session(index).await;
        if delivered {
            backoff = task.config.backoff_min;
        }
        match end {
            End::Resubscribe => continue,
            End::Stop => return,
            End::Failed(reason) => {
                tracing::debug!(node = %task.nodes[index].url.base, %reason, "follow: session ended");
                index = (index + 1) % task.nodes.len();
                rng = splitmix(rng);
                let half = backoff.as_millis() as u64 / 2;
                let delay = Duration::from_millis(half + rng % (half + 1));
                tokio::time::sleep(delay).await;
                backoff = (backoff * 2).min(task.config.backoff_max);
            }
        }
    }
}

impl Task {
    async fn yield_item(&self, item: FollowItem) -> Result<(), End> {
        self.items.send(item).await.map_err(|_| End::Stop)
    }

    /// Hands on the events the cursor does not cover, in order, and
    /// advances the cursor past them.
    async fn deliver(&mut self, events: Vec<EventJson>) -> Result<usize, End> {
        let mut count = 0;
        for event in events {
            let stream = event
                .stream
                .parse::<u64>()
                .map_err(|_| End::Failed(format!("bad stream id {:?}", event.stream)))?;
            let stream = StreamId::new(stream);
            if self.cursor.covers(stream, event.seq) {
                continue;
            }
            // Prefix-closed: the next event of a stream is the one after
            // the cursor's entry; anything else is a hole, never shown.
            if event.seq != self.cursor.get(stream) + 1 {
                return Err(End::Failed(format!(
                    "event {}:{} past a hole at {}",
                    event.stream,
                    event.seq,
                    self.cursor.get(stream)
                )));
            }
            self.cursor.advance(stream, event.seq);
            self.yield_item(FollowItem::Event(event)).await?;
            count += 1;
        }
        Ok(count)
    }

    /// One connection to node `index`; `true` if it delivered anything.
    async fn session(&mut self, index: usize) -> (bool, End) {
        let mut delivered = false;
        let end = self.session_inner(index, &mut delivered).await;
        (delivered, end.err().unwrap_or(End::Stop))
    }

    async fn session_inner(&mut self, index: usize, delivered: &mut bool) -> Result<(), End> {
        let node = self.nodes[index].clone();
        let mut source = self.open(&node).await?;
        self.yield_item(FollowItem::Connected {
            node: node.url.base.clone(),
        })
        .await?;
        let name = self.config.stream.to_string();
        let mut behind_since: Option<Instant> = None;
        loop {
            let gap_deadline = behind_since.map(|since| since + self.config.gap_timeout);
            let message = tokio::select! {
                message = tokio::time::timeout(self.config.idle_timeout, source.next()) => message,
                _ = sleep_until(gap_deadline), if gap_deadline.is_some() => {
                    behind_since = None;
                    self.refetch(&node).await?;
                    continue;
                }
            };
            let text = match message {
                Err(_) => return Err(End::Failed("no frame within the idle timeout".into())),
                Ok(None) => return Err(End::Failed("the node closed the connection".into())),
                Ok(Some(Err(error))) => return Err(End::Failed(error.to_string())),
                Ok(Some(Ok(Message::Text(text)))) => text,
                Ok(Some(Ok(Message::Close(_)))) => {
                    return Err(End::Failed("the node closed the connection".into()))
                }
                Ok(Some(Ok(_))) => continue,
            };
            let frame: ServerFrame = serde_json::from_str(text.as_str())
                .map_err(|error| End::Failed(format!("bad frame: {error}")))?;
            let seen = Seen {
                node: &node,
                name: &name,
                delivered: &mut *delivered,
                behind_since: &mut behind_since,
            };
            self.on_frame(frame, seen).await?;
        }
    }

    /// Connects to `node` and upgrades to `GET /follow` from the cursor:
    /// the frames the node sends, their tokens the shortest it writes
    /// (`tokens=short`: version 2 where shorter, expanded by
    /// [`Task::expand`]; a node built before the parameter ignores it and
    /// sends version 1).
    async fn open(&self, node: &Node) -> Result<Frames, End> {
        let after = encode(&self.cursor);
        let url = format!(
            "{}://{}/follow?stream={}&tokens=short&after={after}",
            if node.url.secure { "wss" } else { "ws" },
            node.url.authority(),
            self.config.stream
        );
        let connect = async {
            use tokio_tungstenite::tungstenite::client::IntoClientRequest;
            let mut request = url.into_client_request().map_err(|e| e.to_string())?;
            if let Some(value) = bearer(self.config.token.as_deref()) {
                request
                    .headers_mut()
                    .insert(hyper::header::AUTHORIZATION, value);
            }
            let io = connect(&node.url, self.config.tls.as_ref()).await?;
            tokio_tungstenite::client_async(request, io)
                .await
                .map_err(|e| e.to_string())
        };
        let (socket, _) = match tokio::time::timeout(self.config.request_timeout, connect).await {
            Err(_) => return Err(End::Failed("connect timed out".into())),
            Ok(Err(error)) => return Err(End::Failed(format!("connect: {error}"))),
            Ok(Ok(connected)) => connected,
        };
        let (_sink, source) = socket.split();
        Ok(source)
    }

    /// Applies one frame of the subscription `seen.name` by the rules of
    /// the module's docs; `Err` ends the session.
    async fn on_frame(&mut self, frame: ServerFrame, seen: Seen<'_>) -> Result<(), End> {
        let name = seen.name;
        match frame {
            ServerFrame::Events {
                stream,
                extends,
                next,
                events,
            } if stream == name => {
                let extends = self.expand(seen.node, &extends).await?;
                let next = self.expand(seen.node, &next).await?;
                if self.cursor.dominates(&next) {
                    // A duplicate, or already refetched.
                    return Ok(());
                }
                if self.cursor.dominates(&extends) {
                    if self.deliver(events).await? > 0 {
                        *seen.delivered = true;
                        *seen.behind_since = None;
                    }
                    self.cursor.join(&next);
                } else {
                    // A hole between the cursor and this frame.
                    *seen.behind_since = None;
                    self.refetch(seen.node).await?;
                    *seen.delivered = true;
                }
            }
            ServerFrame::Heartbeat { stream, head } if stream == name => {
                let head = self.expand(seen.node, &head).await?;
                if self.cursor.dominates(&head) {
                    *seen.behind_since = None;
                } else if seen.behind_since.is_none() {
                    *seen.behind_since = Some(Instant::now());
                }
            }
            ServerFrame::Status(status) if status.stream == name => {
                *seen.delivered = true;
                self.yield_item(FollowItem::Status(status)).await?;
            }
            ServerFrame::Lagged { stream, cursor } if stream == name => {
                let cursor = self.expand(seen.node, &cursor).await?;
                self.yield_item(FollowItem::Lagged { cursor }).await?;
                self.refetch(seen.node).await?;
                return Err(End::Resubscribe);
            }
            ServerFrame::Stale {
                stream,
                lost,
                resume,
                ..
            } if stream == name => {
                let resume = self.expand(seen.node, &resume).await?;
                return Err(self.stale(lost, resume).await);
            }
            ServerFrame::Error {
                stream, message, ..
            } if stream.as_deref().is_none_or(|stream| stream == name) => {
                return Err(End::Failed(message));
            }
            _ => {}
        }
        Ok(())
    }

    async fn stale(&mut self, lost: Vec<LostJson>, resume: VersionVector) -> End {
        let accepted = self.config.accept_stale;
        if accepted {
            self.cursor.join(&resume);
        }
        let item = FollowItem::Stale {
            lost,
            resume,
            accepted,
        };
        if self.yield_item(item).await.is_err() || !accepted {
            return End::Stop;
        }
        End::Resubscribe
    }

    /// Pages from the cursor to the node's head over `GET /events`.
    async fn refetch(&mut self, node: &Node) -> Result<(), End> {
        let stream = match self.config.stream {
            FollowStream::Status => return Ok(()),
            FollowStream::All => None,
            FollowStream::Writer(stream) => Some(stream),
        };
        let mut count = 0;
        loop {
            let after = encode(&self.cursor);
            let page = node
                .client
                .page_of(Some(&after), Some(self.config.page_limit), stream);
            let page = match tokio::time::timeout(self.config.request_timeout, page)
                .await
                .map_err(|_| End::Failed("refetch timed out".into()))?
                .map_err(|error| End::Failed(error.to_string()))?
            {
                PageOutcome::Page(page) => page,
                PageOutcome::Stale(stale) => {
                    let resume = self.expand(node, &stale.resume).await?;
                    return Err(self.stale(stale.lost, resume).await);
                }
            };
            count += self.deliver(page.events).await?;
            let next = self.expand(node, &page.next).await?;
            self.cursor.join(&next);
            if page.at_head {
                break;
            }
        }
        self.yield_item(FollowItem::Refetched { events: count })
            .await?;
        Ok(())
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

fn encode(vector: &VersionVector) -> String {
    token::encode_text(vector).expect("a follower's cursor encodes")
}

impl Task {
    /// The cursor a token from `node` stands for: version 1 as it is,
    /// version 2 expanded with its checkpoint, kept or asked of the node
    /// (checked against its name by `Client::checkpoint`).
    async fn expand(&mut self, node: &Node, text: &str) -> Result<VersionVector, End> {
        let bad = |error: &dyn std::fmt::Display| {
            End::Failed(format!("bad token from the node: {error}"))
        };
        let relative = match token::decode_any_text(text).map_err(|e| bad(&e))? {
            Token::Absolute(vector) => return Ok(vector),
            Token::Relative(relative) => relative,
        };
        let name = relative.checkpoint();
        let kept = self.checkpoints.iter().find(|c| c.name() == name).cloned();
        let checkpoint = match kept {
            Some(checkpoint) => checkpoint,
            None => {
                let asked = node.client.checkpoint(name);
                let checkpoint = tokio::time::timeout(self.config.request_timeout, asked)
                    .await
                    .map_err(|_| End::Failed(format!("checkpoint {name}: timed out")))?
                    .map_err(|error| End::Failed(error.to_string()))?;
                if self.checkpoints.len() == CHECKPOINTS_KEPT {
                    self.checkpoints.remove(0);
                }
                self.checkpoints.push(checkpoint.clone());
                checkpoint
            }
        };
        relative.expand(&checkpoint).map_err(|e| bad(&e))
    }
}

/// A node to follow: its URL, parsed, and the HTTP client its refetches
/// go through.
#[derive(Debug, Clone)]
struct Node {
    url: NodeUrl,
    client: Client,
}

/// What a node connection is: TCP, or TLS over it.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

/// A fresh connection to the node, for the WebSocket upgrade.
async fn connect(
    node: &NodeUrl,
    tls: Option<&std::sync::Arc<rustls::ClientConfig>>,
) -> Result<Box<dyn Io>, String> {
    let tcp = TcpStream::connect((node.host.as_str(), node.port))
        .await
        .map_err(|error| format!("connect {}: {error}", node.authority()))?;
    let _ = tcp.set_nodelay(true);
    if !node.secure {
        return Ok(Box::new(tcp));
    }
    let tls = tls.ok_or("no TLS configuration for an https:// node")?;
    let stream = crate::tls::connect(std::sync::Arc::clone(tls), &node.host, tcp).await?;
    Ok(Box::new(stream))
}

/// `Authorization: Bearer TOKEN`, marked sensitive (never logged).
fn bearer(token: Option<&str>) -> Option<hyper::header::HeaderValue> {
    crate::auth::bearer_header(token?)
}

fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    splitmix(nanos ^ u64::from(std::process::id()))
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
