//! `GET /follow`: the server side. One task per connection (the pump)
//! wakes on the replica's change notification (a `tokio::sync::watch`, so
//! no polling), on the heartbeat timer and on the follower's requests,
//! pages each subscription from its cursor and queues frames; a second
//! task writes the queue to the socket, and a third reads the follower's
//! requests from it.
//!
//! The queue is bounded. A subscription catching up (its cursor below the
//! head since it subscribed) is paced by the socket: it pages only while
//! the queue has room. A live subscription (one that reached the head)
//! that finds the queue full is sent `lagged` and dropped; a few slots are
//! kept for such final frames. Nothing on the replica's notification path
//! waits for a socket: the hook only updates the watch.
//!
//! Fan-out encodes each frame once. Live followers of one stream stand at
//! the same cursor, so the first to wake after a change pages and
//! serializes the `events` frame, and the hub keeps it (a few frames,
//! each bounded) keyed by the stream and the cursor it extends; the others
//! find it there and queue the same bytes. A kept frame is used only while
//! the floor is the one it was built under: after a compaction, paging
//! decides again (and a cursor below the new floor gets `stale`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use meshlog_cursor::{token, VersionVector};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::frame::{ClientFrame, FollowStream, ServerFrame};
use super::hub::{Permit, SharedFrame, Step};
use super::status::status;
use crate::http::json::{EventJson, StaleJson};
use crate::http::{ApiError, AppState};
use crate::read::{self, Answer};

/// The largest message a follower may send (a subscribe request).
const CLIENT_MESSAGE_BYTES_MAX: usize = 16 << 10;

/// The socket's read buffer. The connection polls its socket each time it
/// wakes (on every change), and each poll readies the whole read buffer
/// (tungstenite zero-fills it, 128 KiB by default): at 1,000 followers
/// that fill was 39% of the node's CPU. Followers send only small
/// requests; a larger one still arrives whole (the codec reserves a
/// frame's full length).
const READ_BUFFER_BYTES: usize = 4 << 10;

/// Follower requests read from the socket and not yet handled; the reader
/// waits past this (and so does the follower's socket).
const REQUESTS_QUEUED_MAX: usize = 8;

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
    Text(Utf8Bytes),
    Close,
}

/// `GET /follow?stream=S&after=TOKEN&tokens=short`: validates, then
/// upgrades to a WebSocket and follows.
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
    let short_tokens = match query.get("tokens").map(String::as_str) {
        None | Some("v1") => false,
        Some("short") => true,
        Some(other) => {
            let message = format!("tokens must be short or v1; got {other:?}");
            return ApiError::new(StatusCode::BAD_REQUEST, "bad_query", message).into_response();
        }
    };
    let after = query.get("after").map(String::as_str);
    let cursor = match read::cursor_fetching(&state.replica, &state.fetch, after).await {
        Ok(cursor) => cursor,
        Err(error) => return ApiError::from(error).into_response(),
    };
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(error) => {
            return ApiError::upgrade_required(
                "/follow",
                format_args!("is a WebSocket upgrade: {}", error.body_text()),
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
        .read_buffer_size(READ_BUFFER_BYTES)
        .max_message_size(CLIENT_MESSAGE_BYTES_MAX)
        .max_frame_size(CLIENT_MESSAGE_BYTES_MAX)
        .on_upgrade(move |socket| run_connection(state, socket, first, short_tokens))
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
    /// The follower asked for the shortest tokens (`tokens=short`):
    /// version 2 where shorter, which it expands with `GET /checkpoint`.
    short_tokens: bool,
    /// Subscribes whose token names a checkpoint this node does not keep,
    /// fetching it from the peers: each its stream's name, the request's
    /// number and the cursor read after the fetch. The connection goes on
    /// meanwhile (its other subscriptions, its heartbeats).
    fetching: JoinSet<Option<Fetched>>,
    /// Per stream name, the number of the subscribe still fetching: a
    /// later subscribe or an unsubscribe of that stream drops it.
    pending: HashMap<String, u64>,
    /// Subscribes received, numbered.
    requests: u64,
}

/// A subscribe's fetch, done.
struct Fetched {
    name: String,
    stream: FollowStream,
    request: u64,
    cursor: Result<VersionVector, read::ReadError>,
}

async fn run_connection(
    state: Arc<AppState>,
    socket: WebSocket,
    first: Subscription,
    short_tokens: bool,
) {
    let hub = &state.follow;
    let settings = hub.settings.clone();
    let reserve = settings.connection_followers_max + 2;
    let (queue, outgoing) = mpsc::channel::<Out>(settings.queue_frames.max(1) + reserve);
    let room = Arc::new(Notify::new());
    let stop = hub.stop.child_token();
    let (reader, writer, mut requests) =
        spawn_socket(socket, outgoing, &room, &stop, settings.write_timeout);
    let mut connection = Connection {
        state: Arc::clone(&state),
        queue,
        reserve,
        subscriptions: vec![first],
        short_tokens,
        fetching: JoinSet::new(),
        pending: HashMap::new(),
        requests: 0,
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
            // Room in the queue matters only to a subscription catching
            // up; a live one would be woken by every frame written, and
            // page again for nothing.
            _ = room.notified(), if connection.catching_up() => connection.pump(false),
            request = requests.recv() => match request {
                Some(text) => connection.request(text.as_str()),
                None => break,
            },
            Some(done) = connection.fetching.join_next(), if !connection.fetching.is_empty() => {
                if let Ok(Some(fetched)) = done {
                    connection.fetched(fetched);
                }
            }
        }
        if connection.subscriptions.is_empty() && connection.pending.is_empty() {
            // Every subscription ended (lagged, stale, unsubscribed): say
            // goodbye after what is queued.
            let _ = connection.queue.try_send(Out::Close);
            break;
        }
    }
    drop(connection);
    drop(requests);
    // The writer ends once it has written the close (or the queue ends).
    let _ = writer.await;
    stop.cancel();
    let _ = reader.await;
}

/// The socket's reader and writer tasks, and the requests the reader
/// hands on.
fn spawn_socket(
    socket: WebSocket,
    outgoing: mpsc::Receiver<Out>,
    room: &Arc<Notify>,
    stop: &CancellationToken,
    write_timeout: std::time::Duration,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::task::JoinHandle<()>,
    mpsc::Receiver<Utf8Bytes>,
) {
    let (sink, source) = socket.split();
    let (requests_in, requests) = mpsc::channel::<Utf8Bytes>(REQUESTS_QUEUED_MAX);
    let reader = tokio::spawn(read_requests(source, requests_in, stop.clone()));
    let writer = tokio::spawn(write_frames(
        sink,
        outgoing,
        Arc::clone(room),
        stop.clone(),
        write_timeout,
    ));
    (reader, writer, requests)
}

/// The socket's reader: a task of its own. Polled from the pump's loop,
/// the socket was readied (a buffer filled with zeros, the split lock
/// taken) on every change for a request that rarely comes. It ends the
/// channel when the follower closes or the socket fails.
async fn read_requests(
    mut source: SplitStream<WebSocket>,
    requests: mpsc::Sender<Utf8Bytes>,
    stop: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => break,
            message = source.next() => message,
        };
        match message {
            Some(Ok(Message::Text(text))) => {
                if requests.send(text).await.is_err() {
                    break;
                }
            }
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
            Some(Ok(_)) => {}
        }
    }
}

/// The socket's writer: writes the queue, each frame within
/// `write_timeout`, signals `room` after each, and stops the connection
/// when it ends (closed, failed or too slow).
async fn write_frames(
    mut sink: SplitSink<WebSocket, Message>,
    mut outgoing: mpsc::Receiver<Out>,
    room: Arc<Notify>,
    stop: CancellationToken,
    write_timeout: std::time::Duration,
) {
    loop {
        let out = tokio::select! {
            _ = stop.cancelled() => break,
            out = outgoing.recv() => out,
        };
        let (message, last) = match out {
            Some(Out::Text(text)) => (Message::Text(text), false),
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
}

impl Connection {
    /// Whether an ordinary frame (events, heartbeat, status) may be queued:
    /// the reserve stays free for final frames.
    fn has_room(&self) -> bool {
        self.queue.capacity() > self.reserve
    }

    /// Whether a subscription is paging towards the head, paced by the
    /// socket (the status stream never is).
    fn catching_up(&self) -> bool {
        self.subscriptions
            .iter()
            .any(|sub| !sub.live && sub.stream != FollowStream::Status)
    }

    fn send(&self, frame: &ServerFrame) {
        let text = serde_json::to_string(frame).expect("a frame is JSON");
        // Final frames use the reserve; ordinary ones were checked against
        // it. Failing here means the writer is gone: the loop ends soon.
        let _ = self.queue.try_send(Out::Text(text.into()));
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
        let state = Arc::clone(&self.state);
        let hub = &state.follow;
        loop {
            let sub = &self.subscriptions[index];
            if !sub.live && !self.has_room() {
                // Catching up: wait for the socket to take what is queued.
                return true;
            }
            let step = match hub.shared_step(sub.stream, &sub.cursor, self.short_tokens) {
                Some(step) => step,
                None => match self.page_step(index, limit) {
                    Ok(Some(step)) => step,
                    Ok(None) => {
                        self.subscriptions[index].live = true;
                        return true;
                    }
                    Err(()) => return false,
                },
            };
            let sub = &self.subscriptions[index];
            if !self.has_room() {
                // Live and the queue is full: the node does not wait.
                let frame = ServerFrame::Lagged {
                    stream: sub.name.clone(),
                    cursor: self.encode(&sub.cursor),
                };
                self.send(&frame);
                self.state.metrics.follow_lagged.inc();
                return false;
            }
            // Final frames use the reserve; this one was checked against
            // it. Failing here means the writer is gone: the loop ends soon.
            let _ = self.queue.try_send(Out::Text(step.text));
            let sub = &mut self.subscriptions[index];
            sub.cursor = step.next;
            if step.at_head {
                sub.live = true;
                return true;
            }
        }
    }

    /// Pages subscription `index` from its cursor and encodes the `events`
    /// frame, keeping it for other followers at the same cursor. `None`
    /// when there is nothing past the cursor; `Err` when the subscription
    /// ended (`stale` or `error` queued).
    fn page_step(&self, index: usize, limit: usize) -> Result<Option<Step>, ()> {
        let replica = &self.state.replica;
        let hub = &self.state.follow;
        let sub = &self.subscriptions[index];
        let (floor, version) = hub.floor_and_version();
        let writer = match sub.stream {
            FollowStream::Writer(stream) => Some(stream),
            _ => None,
        };
        let page = match read::read(replica, &sub.cursor, limit, writer) {
            Ok(Answer::Page(page)) => page,
            Ok(Answer::Stale(stale)) => {
                let answer = match self.short_tokens {
                    true => replica
                        .try_token(stale.resume())
                        .map(|resume| StaleJson::new(&stale, resume)),
                    false => StaleJson::try_from(&stale),
                };
                let frame = match answer {
                    Ok(answer) => ServerFrame::Stale {
                        stream: sub.name.clone(),
                        error: "stale_cursor".into(),
                        message: answer.message,
                        lost: answer.lost,
                        resume: answer.resume,
                    },
                    Err(error) => internal(sub, error.to_string()),
                };
                self.send(&frame);
                self.state.metrics.follow_stale.inc();
                return Err(());
            }
            Err(error) => {
                self.send(&internal(sub, error.to_string()));
                return Err(());
            }
        };
        if page.events.is_empty() {
            return Ok(None);
        }
        let frame = ServerFrame::Events {
            stream: sub.name.clone(),
            extends: self.encode(&sub.cursor),
            next: match self.short_tokens {
                true => page.token.clone(),
                false => encode(&page.next),
            },
            events: page.events.iter().map(EventJson::from).collect(),
        };
        let text = Utf8Bytes::from(serde_json::to_string(&frame).expect("a frame is JSON"));
        hub.keep_frame(SharedFrame {
            stream: sub.stream,
            extends: sub.cursor.clone(),
            next: page.next.clone(),
            floor,
            version,
            at_head: page.at_head,
            short_tokens: self.short_tokens,
            text: text.clone(),
        });
        Ok(Some(Step {
            text,
            next: page.next,
            at_head: page.at_head,
        }))
    }

    /// A cursor as this connection's frames carry it: the shortest token
    /// (`tokens=short`), else version 1.
    fn encode(&self, vector: &VersionVector) -> String {
        match self.short_tokens {
            true => self.state.replica.token(vector),
            false => encode(vector),
        }
    }

    /// Queues a heartbeat for every subscription (a status frame for the
    /// status stream). Called on the tick right after a pump.
    fn heartbeats(&self) {
        let marks = self.state.replica.marks();
        for sub in &self.subscriptions {
            if !self.has_room() {
                return;
            }
            let frame = match sub.stream {
                FollowStream::Status => ServerFrame::Status(status(&self.state)),
                stream => ServerFrame::Heartbeat {
                    stream: sub.name.clone(),
                    head: self.encode(&heartbeat_head(stream, &sub.cursor, &marks)),
                },
            };
            self.send(&frame);
        }
    }

    /// Queues an `error` frame for a refused request.
    fn refuse(&self, stream: Option<String>, code: &str, message: String) {
        self.send(&ServerFrame::Error {
            stream,
            error: code.into(),
            message,
        });
    }

    /// A follower's request: subscribe or unsubscribe.
    fn request(&mut self, text: &str) {
        match serde_json::from_str(text) {
            Ok(ClientFrame::Unsubscribe { stream }) => {
                self.pending.remove(&stream);
                self.subscriptions.retain(|sub| sub.name != stream);
            }
            Ok(ClientFrame::Subscribe { stream, after }) => self.subscribe(stream, after),
            Err(error) => self.refuse(
                None,
                "bad_request",
                format!("expected a subscribe or unsubscribe frame: {error}"),
            ),
        }
    }

    /// Subscribes to `stream` after `after`, replacing the same stream's
    /// subscription, and pumps it; or refuses with an `error` frame. A
    /// token naming a checkpoint this node does not keep is fetched from
    /// the peers first (at most `checkpoint_fetch_ms`), on a task of its
    /// own: the connection's other subscriptions go on meanwhile, and the
    /// subscription starts when the fetch ends ([`Connection::fetched`]).
    fn subscribe(&mut self, stream: String, after: Option<String>) {
        let Some(parsed) = FollowStream::parse(&stream) else {
            let error = bad_stream(&stream);
            return self.refuse(Some(stream), "bad_stream", error.message());
        };
        let name = parsed.to_string();
        self.requests += 1;
        self.pending.remove(&name);
        match read::cursor(&self.state.replica, after.as_deref()) {
            Err(read::ReadError::UnknownCheckpoint { .. }) => {}
            cursor => return self.start(name, parsed, cursor),
        }
        let most = self.state.follow.settings.connection_followers_max;
        let held = self
            .subscriptions
            .iter()
            .filter(|sub| sub.name != name)
            .count();
        if held + self.pending.len() >= most {
            let message = format!("one connection holds at most {most} subscriptions");
            return self.refuse(Some(name), "too_many_subscriptions", message);
        }
        self.pending.insert(name.clone(), self.requests);
        let (state, request) = (Arc::clone(&self.state), self.requests);
        let stop = self.state.follow.stop.clone();
        self.fetching.spawn(async move {
            let cursor = tokio::select! {
                read = read::cursor_fetching(&state.replica, &state.fetch, after.as_deref()) => read,
                // A node shutting down does not wait for the peers.
                () = stop.cancelled() => return None,
            };
            Some(Fetched {
                name,
                stream: parsed,
                request,
                cursor,
            })
        });
    }

    /// A subscribe's fetch ended: it starts, unless a later subscribe or
    /// an unsubscribe of its stream came meanwhile.
    fn fetched(&mut self, fetched: Fetched) {
        if self.pending.get(&fetched.name) != Some(&fetched.request) {
            return;
        }
        self.pending.remove(&fetched.name);
        self.start(fetched.name, fetched.stream, fetched.cursor);
    }

    /// Starts subscription `name` from `cursor` (replacing the same
    /// stream's) and pumps it; or refuses with an `error` frame.
    fn start(
        &mut self,
        name: String,
        stream: FollowStream,
        cursor: Result<VersionVector, read::ReadError>,
    ) {
        let cursor = match cursor {
            Ok(cursor) => cursor,
            Err(error) => return self.refuse(Some(name), error.code(), error.to_string()),
        };
        // A subscribe replaces the same stream's subscription.
        self.subscriptions.retain(|sub| sub.name != name);
        let most = self.state.follow.settings.connection_followers_max;
        if self.subscriptions.len() + self.pending.len() >= most {
            let message = format!("one connection holds at most {most} subscriptions");
            return self.refuse(Some(name), "too_many_subscriptions", message);
        }
        let Some(permit) = self.state.follow.permit(&self.state.metrics) else {
            let message = too_many_followers().message();
            return self.refuse(Some(name), "too_many_followers", message);
        };
        self.subscriptions.push(Subscription {
            name,
            stream,
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

/// The head a heartbeat names for a subscription: the node's `marks` (for
/// a writer, that writer's entry alone), each entry no further than the
/// subscription's `cursor`, the `next` of the last `events` frame queued for
/// it. The committer runs on its own thread: a commit that lands after the
/// pump paged is in the marks but in no frame yet, and a heartbeat naming
/// it would tell the follower it lost events that are still to come (an
/// independent follower saw exactly that, issue 25). Its frame follows on
/// the change notification, and the next heartbeat names it.
fn heartbeat_head(
    stream: FollowStream,
    cursor: &VersionVector,
    marks: &VersionVector,
) -> VersionVector {
    let queued =
        |(writer, seq): (meshlog_cursor::StreamId, u64)| (writer, seq.min(cursor.get(writer)));
    match stream {
        FollowStream::Writer(writer) => [queued((writer, marks.get(writer)))].into_iter().collect(),
        _ => marks.iter().map(queued).collect(),
    }
}

/// The `error` frame of a read the node failed.
fn internal(sub: &Subscription, message: String) -> ServerFrame {
    ServerFrame::Error {
        stream: Some(sub.name.clone()),
        error: "internal".into(),
        message,
    }
}

fn encode(vector: &VersionVector) -> String {
    // A vector built from the replica's own marks and a decoded token is
    // within the token's bounds.
    token::encode_text(vector).expect("a cursor of this node encodes")
}

#[cfg(test)]
mod tests {
    //! The heartbeat's head against the frames queued before it, without a
    //! node: the pump's cursor stands for the frames queued, the marks for
    //! the replica after a commit that landed since.

    use meshlog_cursor::{StreamId, VersionVector};

    use super::heartbeat_head;
    use crate::follow::FollowStream;

    fn vector(entries: &[(u64, u64)]) -> VersionVector {
        entries
            .iter()
            .map(|&(stream, seq)| (StreamId::new(stream), seq))
            .collect()
    }

    /// Regression (issue 25): an independent WebSocket follower saw
    /// heartbeats 1–2 events past the last `events` frame sent, because the
    /// tick read the marks again after the pump had paged and a commit
    /// landed in between.
    #[test]
    fn heartbeat_head_never_passes_the_frames_queued_before_it() {
        // Queued up to {1:3, 2:5}; since then stream 1 reached 4 and a
        // new stream 3 appeared.
        let cursor = vector(&[(1, 3), (2, 5)]);
        let marks = vector(&[(1, 4), (2, 5), (3, 1)]);
        let all = heartbeat_head(FollowStream::All, &cursor, &marks);
        assert_eq!(all, vector(&[(1, 3), (2, 5)]));
        assert!(cursor.dominates(&all));
        let one = StreamId::new(1);
        let writer = heartbeat_head(FollowStream::Writer(one), &cursor, &marks);
        assert_eq!(writer, vector(&[(1, 3)]));
    }

    /// A cursor past the node (a follower that came from a node further
    /// on) is not a head: the heartbeat names only what the node holds.
    #[test]
    fn heartbeat_head_never_passes_the_nodes_marks() {
        let cursor = vector(&[(1, 9), (2, 5)]);
        let marks = vector(&[(1, 4), (2, 5)]);
        let head = heartbeat_head(FollowStream::All, &cursor, &marks);
        assert_eq!(head, marks);
    }
}
