//! `GET /follow`: the server side. One task per connection reads the
//! follower's requests, wakes on the replica's change notification (a
//! `tokio::sync::watch`, so no polling) and on the heartbeat timer, pages
//! each subscription from its cursor and queues frames; a second task
//! writes the queue to the socket.
//!
//! The queue is bounded. A subscription catching up (its cursor below the
//! head since it subscribed) is paced by the socket: it pages only while
//! the queue has room. A live subscription (one that reached the head)
//! that finds the queue full is sent `lagged` and dropped; a few slots are
//! kept for such final frames. Nothing on the replica's notification path
//! waits for a socket: the hook only updates the watch.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use meshlog_cursor::{token, VersionVector};
use meshlog_replica::{Change, PageError};
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::frame::{ClientFrame, FollowStream, ServerFrame, StatusJson};
use crate::config::FollowSettings;
use crate::http::json::{decimal, vector_json, DigestJson, EventJson, LostJson};
use crate::http::{ApiError, AppState};
use crate::metrics::Metrics;
use crate::replica::NodeReplica;

/// The largest message a follower may send (a subscribe request).
const CLIENT_MESSAGE_BYTES_MAX: usize = 16 << 10;

/// What every follow connection of a node shares: the limits, the
/// node-wide subscription permits and one watch on the replica's changes.
pub(crate) struct FollowHub {
    settings: FollowSettings,
    permits: Arc<Semaphore>,
    changes: watch::Receiver<Change>,
    _watch: meshlog_sync::ChangeWatch,
    stop: CancellationToken,
}

impl FollowHub {
    /// A hub on `replica`; `stop` ends every follow connection.
    pub(crate) fn new(
        replica: &NodeReplica,
        settings: FollowSettings,
        stop: CancellationToken,
    ) -> FollowHub {
        let mut watch = replica.change_watch();
        let changes = watch.receiver().clone();
        FollowHub {
            permits: Arc::new(Semaphore::new(settings.followers_max)),
            settings,
            changes,
            _watch: watch,
            stop,
        }
    }

    fn permit(&self, metrics: &Arc<Metrics>) -> Option<Permit> {
        let permit = Arc::clone(&self.permits).try_acquire_owned().ok()?;
        metrics.followers.inc();
        Some(Permit {
            _permit: permit,
            metrics: Arc::clone(metrics),
        })
    }
}

/// A subscription's place among the node's `followers_max`, counted in
/// the `followers` gauge while it lives.
struct Permit {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.metrics.followers.dec();
    }
}

/// One subscription of a connection.
struct Subscription {
    name: String,
    stream: FollowStream,
    cursor: VersionVector,
    /// Reached the head since it subscribed: from now on a full queue
    /// means `lagged`.
    live: bool,
    _permit: Permit,
}

enum Out {
    Text(String),
    Close,
}

/// `GET /follow?stream=S&after=TOKEN`: validates, then upgrades to a
/// WebSocket and follows.
pub(crate) async fn follow_upgrade(
    State(state): State<Arc<AppState>>,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(error) => {
            return ApiError::new(StatusCode::BAD_REQUEST, "bad_query", error.body_text())
                .into_response()
        }
    };
    let text = query.get("stream").map(String::as_str).unwrap_or("all");
    let Some(stream) = FollowStream::parse(text) else {
        return bad_stream(text).into_response();
    };
    let cursor = match crate::http::cursor_from_text(&state, query.get("after").map(String::as_str))
    {
        Ok(cursor) => cursor,
        Err(error) => return error.into_response(),
    };
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(error) => {
            return ApiError::new(
                StatusCode::UPGRADE_REQUIRED,
                "upgrade_required",
                format!("GET /follow is a WebSocket upgrade: {}", error.body_text()),
            )
            .into_response()
        }
    };
    let Some(permit) = state.follow.permit(&state.metrics) else {
        return too_many_followers().into_response();
    };
    let first = Subscription {
        name: stream.to_string(),
        stream,
        cursor,
        live: false,
        _permit: permit,
    };
    upgrade
        .max_message_size(CLIENT_MESSAGE_BYTES_MAX)
        .max_frame_size(CLIENT_MESSAGE_BYTES_MAX)
        .on_upgrade(move |socket| run_connection(state, socket, first))
}

fn bad_stream(text: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "bad_stream",
        format!("stream must be all, status or writer:<decimal id>; got {text:?}"),
    )
}

fn too_many_followers() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "too_many_followers",
        "this node serves as many follow subscriptions as it accepts",
    )
}

struct Connection {
    state: Arc<AppState>,
    queue: mpsc::Sender<Out>,
    /// Queue slots kept for final frames (`lagged`, `stale`, `error`) and
    /// the close.
    reserve: usize,
    subscriptions: Vec<Subscription>,
}

async fn run_connection(state: Arc<AppState>, socket: WebSocket, first: Subscription) {
    let hub = &state.follow;
    let settings = hub.settings.clone();
    let reserve = settings.connection_followers_max + 2;
    let (queue, mut outgoing) = mpsc::channel::<Out>(settings.queue_frames.max(1) + reserve);
    let room = Arc::new(Notify::new());
    let stop = hub.stop.child_token();
    let (mut sink, mut source) = socket.split();

    let writer = {
        let room = Arc::clone(&room);
        let stop = stop.clone();
        let write_timeout = settings.write_timeout;
        tokio::spawn(async move {
            loop {
                let out = tokio::select! {
                    _ = stop.cancelled() => break,
                    out = outgoing.recv() => out,
                };
                let (message, last) = match out {
                    Some(Out::Text(text)) => (Message::Text(text.into()), false),
                    Some(Out::Close) => (Message::Close(None), true),
                    None => break,
                };
                match tokio::time::timeout(write_timeout, sink.send(message)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "follow connection: write failed");
                        break;
                    }
                    Err(_) => {
                        tracing::debug!("follow connection: write timed out");
                        break;
                    }
                }
                room.notify_one();
                if last {
                    break;
                }
            }
            stop.cancel();
        })
    };

    let mut connection = Connection {
        state: Arc::clone(&state),
        queue,
        reserve,
        subscriptions: vec![first],
    };
    let mut changes = hub.changes.clone();
    changes.mark_unchanged();
    let mut tick = tokio::time::interval(settings.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    connection.pump(true);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            changed = changes.changed() => {
                if changed.is_err() {
                    break;
                }
                connection.pump(true);
            }
            _ = tick.tick() => {
                connection.pump(false);
                connection.heartbeats();
            }
            _ = room.notified() => connection.pump(false),
            message = source.next() => match message {
                Some(Ok(Message::Text(text))) => connection.request(text.as_str()),
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
        if connection.subscriptions.is_empty() {
            // Every subscription ended (lagged, stale, unsubscribed): say
            // goodbye after what is queued.
            let _ = connection.queue.try_send(Out::Close);
            break;
        }
    }
    drop(connection);
    // The writer ends once it has written the close (or the queue ends).
    let _ = writer.await;
    stop.cancel();
}

impl Connection {
    /// Whether an ordinary frame (events, heartbeat, status) may be queued:
    /// the reserve stays free for final frames.
    fn has_room(&self) -> bool {
        self.queue.capacity() > self.reserve
    }

    fn send(&self, frame: &ServerFrame) {
        let text = serde_json::to_string(frame).expect("a frame is JSON");
        // Final frames use the reserve; ordinary ones were checked against
        // it. Failing here means the writer is gone: the loop ends soon.
        let _ = self.queue.try_send(Out::Text(text));
    }

    /// Queues what lies past each subscription's cursor; with `changed`,
    /// status subscriptions get a fresh status frame too.
    fn pump(&mut self, changed: bool) {
        let mut index = 0;
        while index < self.subscriptions.len() {
            if self.pump_one(index, changed) {
                index += 1;
            } else {
                self.subscriptions.remove(index);
            }
        }
    }

    /// Pumps one subscription; `false` when it has ended.
    fn pump_one(&mut self, index: usize, changed: bool) -> bool {
        let replica = &self.state.replica;
        let limit = self
            .state
            .follow
            .settings
            .frame_events_max
            .min(replica.config().page_len_max);
        let sub = &self.subscriptions[index];
        if sub.stream == FollowStream::Status {
            if changed && self.has_room() {
                let frame = ServerFrame::Status(status(&self.state));
                self.send(&frame);
            }
            return true;
        }
        loop {
            let sub = &self.subscriptions[index];
            if !sub.live && !self.has_room() {
                // Catching up: wait for the socket to take what is queued.
                return true;
            }
            let page = match sub.stream {
                FollowStream::Writer(stream) => replica.page_stream(stream, &sub.cursor, limit),
                _ => replica
                    .page(&sub.cursor, limit)
                    .map(|page| crate::replica::StreamPage {
                        events: page.events,
                        next: page.next,
                        at_head: page.at_head,
                    }),
            };
            let page = match page {
                Ok(page) => page,
                Err(PageError::Stale(stale)) => {
                    let lost = stale
                        .lost()
                        .iter()
                        .map(|range| LostJson {
                            stream: decimal(range.stream),
                            first: range.first_seq,
                            last: range.last_seq,
                        })
                        .collect();
                    let frame = ServerFrame::Stale {
                        stream: sub.name.clone(),
                        error: "stale_cursor".into(),
                        message: stale.to_string(),
                        lost,
                        resume: encode(stale.resume()),
                    };
                    self.send(&frame);
                    self.state.metrics.follow_stale.inc();
                    return false;
                }
                Err(error) => {
                    let frame = ServerFrame::Error {
                        stream: Some(sub.name.clone()),
                        error: "internal".into(),
                        message: error.to_string(),
                    };
                    self.send(&frame);
                    return false;
                }
            };
            if page.events.is_empty() {
                self.subscriptions[index].live = true;
                return true;
            }
            if !self.has_room() {
                // Live and the queue is full: the node does not wait.
                let frame = ServerFrame::Lagged {
                    stream: sub.name.clone(),
                    cursor: encode(&sub.cursor),
                };
                self.send(&frame);
                self.state.metrics.follow_lagged.inc();
                return false;
            }
            let frame = ServerFrame::Events {
                stream: sub.name.clone(),
                extends: encode(&sub.cursor),
                next: encode(&page.next),
                events: page.events.iter().map(EventJson::from).collect(),
            };
            self.send(&frame);
            let sub = &mut self.subscriptions[index];
            sub.cursor = page.next;
            if page.at_head {
                sub.live = true;
                return true;
            }
        }
    }

    fn heartbeats(&self) {
        let marks = self.state.replica.marks();
        for sub in &self.subscriptions {
            if !self.has_room() {
                return;
            }
            let head = match sub.stream {
                FollowStream::All => marks.clone(),
                FollowStream::Writer(stream) => [(stream, marks.get(stream))].into_iter().collect(),
                FollowStream::Status => {
                    self.send(&ServerFrame::Status(status(&self.state)));
                    continue;
                }
            };
            self.send(&ServerFrame::Heartbeat {
                stream: sub.name.clone(),
                head: encode(&head),
            });
        }
    }

    /// A follower's request: subscribe or unsubscribe.
    fn request(&mut self, text: &str) {
        let refuse = |this: &Self, stream: Option<String>, code: &str, message: String| {
            this.send(&ServerFrame::Error {
                stream,
                error: code.into(),
                message,
            });
        };
        let request: ClientFrame = match serde_json::from_str(text) {
            Ok(request) => request,
            Err(error) => {
                return refuse(
                    self,
                    None,
                    "bad_request",
                    format!("expected a subscribe or unsubscribe frame: {error}"),
                )
            }
        };
        match request {
            ClientFrame::Unsubscribe { stream } => {
                self.subscriptions.retain(|sub| sub.name != stream);
            }
            ClientFrame::Subscribe { stream, after } => {
                let Some(parsed) = FollowStream::parse(&stream) else {
                    let error = bad_stream(&stream);
                    return refuse(self, Some(stream), "bad_stream", error.message());
                };
                let cursor = match crate::http::cursor_from_text(&self.state, after.as_deref()) {
                    Ok(cursor) => cursor,
                    Err(error) => return refuse(self, Some(stream), "bad_token", error.message()),
                };
                let name = parsed.to_string();
                // A subscribe replaces the same stream's subscription.
                self.subscriptions.retain(|sub| sub.name != name);
                if self.subscriptions.len() >= self.state.follow.settings.connection_followers_max {
                    return refuse(
                        self,
                        Some(name),
                        "too_many_subscriptions",
                        format!(
                            "one connection holds at most {} subscriptions",
                            self.state.follow.settings.connection_followers_max
                        ),
                    );
                }
                let Some(permit) = self.state.follow.permit(&self.state.metrics) else {
                    return refuse(
                        self,
                        Some(name),
                        "too_many_followers",
                        too_many_followers().message(),
                    );
                };
                self.subscriptions.push(Subscription {
                    name,
                    stream: parsed,
                    cursor,
                    live: false,
                    _permit: permit,
                });
                let index = self.subscriptions.len() - 1;
                if !self.pump_one(index, true) {
                    self.subscriptions.remove(index);
                }
            }
        }
    }
}

fn encode(vector: &VersionVector) -> String {
    // A vector built from the replica's own marks and a decoded token is
    // within the token's bounds.
    token::encode_text(vector).expect("a cursor of this node encodes")
}

/// The status frame: what `GET /marks` answers.
pub(crate) fn status(state: &AppState) -> StatusJson {
    let replica = &state.replica;
    let marks = replica.marks();
    let digest = replica.digest();
    StatusJson {
        stream: "status".into(),
        node: decimal(replica.stream()),
        marks: vector_json(&marks),
        floor: vector_json(&replica.floor()),
        token: encode(&marks),
        digest: DigestJson {
            events: digest.events,
            sum: format!("{:032x}", digest.sum),
        },
        peers: state
            .peers
            .list()
            .iter()
            .map(crate::http::peer_json)
            .collect(),
    }
}
