//! `GET /events/append`: appends streamed over a WebSocket, for clients
//! that pipeline (as NATS clients publish) instead of waiting a round trip
//! per request (`docs/HTTP.md`, "`GET /events/append`").
//!
//! Each message the client sends is one append request: a binary message
//! is one event (its bytes the payload, as a raw `POST /events` body), a
//! text message a JSON batch (a `POST /events` `application/json` body,
//! one commit, all or nothing). The node's first message names the stream
//! the socket appends to, once (`{"stream":"<id>"}`); then each message is
//! answered, in order, by one text message: the acknowledgement (first and
//! last seq, the lamport range: [`AppendAckJson`]) once the commit is
//! durable, or the API's error body, after which the node closes the
//! socket with a reason. A socket on which the client sends nothing for
//! `append_idle_timeout`, with none of its appends unanswered, is closed
//! (1001, `idle_timeout`).
//!
//! Two tasks per connection. The reader checks a message as `POST
//! /events` checks a body (the same functions), queues its append on the
//! replica's committer (the group commit HTTP appends share) and hands
//! the pending commit to the writer; the writer awaits the commits in the
//! order they were queued and writes their answers. The reader takes a
//! permit per message, which the writer gives back once the answer is
//! written: with [`APPENDS_IN_FLIGHT_MAX`] unanswered it stops reading,
//! and the client's socket fills (backpressure).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use meshlog_replica::{Event, ReplicaError};
use serde::Serialize;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::handlers::{check_payloads, committed};
use super::json::{json_batch, AppendCompactJson};
use super::state::AppState;

/// Appends one connection may have read and not yet answered; the node
/// reads no further message until one is answered.
pub const APPENDS_IN_FLIGHT_MAX: usize = 64;

/// After an error frame, how long the node waits for the client's close
/// (reading and dropping what it still sends) before it drops the socket.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

type Commit = Pin<Box<dyn Future<Output = Result<Vec<Event>, ReplicaError>> + Send>>;

/// The acknowledgement of one message: the compact append answer
/// ([`AppendCompactJson`]) without the stream, which the socket's first
/// message named once. `{}` for an empty batch.
#[derive(Debug, Serialize)]
struct AppendAckJson {
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<[u64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lamport: Option<[u64; 2]>,
}

impl From<AppendCompactJson> for AppendAckJson {
    fn from(answer: AppendCompactJson) -> AppendAckJson {
        AppendAckJson {
            seq: answer.seq,
            lamport: answer.lamport,
        }
    }
}

/// What the reader hands the writer, in the order of the client's
/// messages.
enum Reply {
    /// An append queued on the committer.
    Commit {
        commit: Commit,
        started: Instant,
        permit: OwnedSemaphorePermit,
    },
    /// A message refused before it was queued; the last reply.
    Refused(ApiError, u16),
    /// The socket was idle for `append_idle_timeout`: a close, the last
    /// reply.
    Idle,
}

/// `GET /events/append`: upgrades to a WebSocket of appends. Its messages
/// are bounded by `body_bytes_max`, as a request body is.
pub(crate) async fn append_upgrade(
    State(state): State<Arc<AppState>>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(error) => {
            return ApiError::upgrade_required(
                "/events/append",
                format_args!("is a WebSocket upgrade: {}", error.body_text()),
            )
            .into_response()
        }
    };
    let message_max = state.limits.body_bytes_max;
    upgrade
        .max_message_size(message_max)
        .max_frame_size(message_max)
        .on_upgrade(move |socket| run_connection(state, socket))
}

async fn run_connection(state: Arc<AppState>, socket: WebSocket) {
    let stop = state.follow.stop.child_token();
    let (sink, source) = socket.split();
    // The permits bound the replies; one more slot for a refusal.
    let (replies_in, replies) = mpsc::channel::<Reply>(APPENDS_IN_FLIGHT_MAX + 1);
    let done = CancellationToken::new();
    let writer = tokio::spawn(write_replies(
        Arc::clone(&state),
        sink,
        replies,
        done.clone(),
    ));
    read_appends(&state, source, replies_in, &stop, &done).await;
    let _ = writer.await;
}

/// The socket's reader: checks and queues each message's append, in
/// order, until the client closes, a message is refused, the node stops
/// or the writer ends. After a refusal it reads on (dropping what comes)
/// until the client's close, for at most [`CLOSE_WAIT`], so that the
/// error frame is not lost to a reset.
async fn read_appends(
    state: &AppState,
    mut source: SplitStream<WebSocket>,
    replies: mpsc::Sender<Reply>,
    stop: &CancellationToken,
    done: &CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(APPENDS_IN_FLIGHT_MAX));
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => return,
            _ = done.cancelled() => return,
            permit = Arc::clone(&permits).acquire_owned() => permit.expect("never closed"),
        };
        let Some(message) = next_message(state, &mut source, &permits, stop, done).await else {
            return;
        };
        let Ok(message) = message else {
            let _ = replies.send(Reply::Idle).await;
            drop(replies);
            drain(source).await;
            return;
        };
        let payloads = match message {
            Some(Ok(Message::Binary(payload))) => Ok(vec![payload]),
            Some(Ok(Message::Text(text))) => {
                json_batch(text.as_str().as_bytes()).inspect_err(|_| {
                    state.metrics.appends_refused.inc();
                })
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Close(_))) | None => return,
            Some(Err(error)) => {
                // A message over the bound is refused from its header;
                // the rest of it is never read, so nothing more is.
                if let Some(refusal) = too_large(state, &error) {
                    let _ = replies.send(refusal).await;
                }
                return;
            }
        };
        let checked = payloads.and_then(|payloads| {
            check_payloads(state, &payloads)?;
            Ok(payloads)
        });
        let checked = match checked {
            Ok(payloads) => super::handlers::recovered(state).await.map(|()| payloads),
            Err(error) => Err(error),
        };
        let reply = match checked {
            Ok(payloads) => Reply::Commit {
                commit: Box::pin(state.replica.append_batch(payloads)),
                started: Instant::now(),
                permit,
            },
            // Relearning the own stream: the client may retry shortly.
            Err(error) if error.code() == "recovering" => Reply::Refused(error, close_code::AGAIN),
            Err(error) => Reply::Refused(error, close_code::POLICY),
        };
        let refused = matches!(reply, Reply::Refused(..));
        if replies.send(reply).await.is_err() {
            return;
        }
        if refused {
            drop(replies);
            drain(source).await;
            return;
        }
    }
}

/// An idle socket: no message for this long, and no append unanswered.
struct IdleTimeout;

/// The client's next message (`None` when the node stops or the writer
/// ended), or [`IdleTimeout`] once it sent none for `append_idle_timeout`
/// while none of its appends was unanswered (`permits`: one is taken for
/// the message awaited).
async fn next_message(
    state: &AppState,
    source: &mut SplitStream<WebSocket>,
    permits: &Semaphore,
    stop: &CancellationToken,
    done: &CancellationToken,
) -> Option<Result<Option<Result<Message, axum::Error>>, IdleTimeout>> {
    let idle = state.limits.append_idle_timeout;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = done.cancelled() => return None,
            message = source.next() => return Some(Ok(message)),
            _ = tokio::time::sleep(idle) => {
                // An append still unanswered: the client awaits the node.
                if permits.available_permits() + 1 >= APPENDS_IN_FLIGHT_MAX {
                    return Some(Err(IdleTimeout));
                }
            }
        }
    }
}

/// The refusal of a message over `body_bytes_max`, if `error` says so.
fn too_large(state: &AppState, error: &axum::Error) -> Option<Reply> {
    use std::error::Error as _;
    let capacity = error
        .source()
        .and_then(|source| source.downcast_ref::<tokio_tungstenite::tungstenite::Error>())
        .is_some_and(|error| matches!(error, tokio_tungstenite::tungstenite::Error::Capacity(_)));
    if !capacity {
        tracing::debug!(%error, "append socket: read failed");
        return None;
    }
    state.metrics.appends_refused.inc();
    let limit = state.limits.body_bytes_max;
    let refusal = ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "message_too_large",
        format!("a message exceeds the limit of {limit} bytes (body_bytes_max)"),
    )
    .with("limit", limit.into());
    Some(Reply::Refused(refusal, close_code::SIZE))
}

/// Reads and drops messages until the client's close, an error, or
/// [`CLOSE_WAIT`].
async fn drain(mut source: SplitStream<WebSocket>) {
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Some(Ok(message)) = source.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// The socket's writer: awaits each queued commit in order and writes its
/// answer, each within the follow `write_timeout`; after a refusal (or a
/// failed commit), the error frame and a close with its code. It cancels
/// `done` when it ends, so that the reader stops too.
async fn write_replies(
    state: Arc<AppState>,
    mut sink: SplitSink<WebSocket, Message>,
    mut replies: mpsc::Receiver<Reply>,
    done: CancellationToken,
) {
    let _done = done.drop_guard();
    let write_timeout = state.follow.settings.write_timeout;
    let mut close = CloseFrame {
        code: close_code::NORMAL,
        reason: "".into(),
    };
    // The stream, named once: every acknowledgement is of an append to it.
    let hello = AppendCompactJson::new(state.replica.stream(), &[]);
    let hello = serde_json::to_string(&hello).expect("an answer is JSON");
    if !send(&mut sink, Message::Text(hello.into()), write_timeout).await {
        return;
    }
    while let Some(reply) = replies.recv().await {
        // The permit goes back once the answer is written, not before:
        // an answer the client does not read counts as unanswered.
        let (text, refusal, _permit) = match reply {
            Reply::Commit {
                commit,
                started,
                permit,
            } => match committed(&state, started, commit.await) {
                Ok(events) => {
                    let answer = AppendCompactJson::new(state.replica.stream(), &events);
                    let ack = AppendAckJson::from(answer);
                    let text = serde_json::to_string(&ack).expect("an answer is JSON");
                    (text, None, Some(permit))
                }
                Err(error) => (error_text(&error), Some((error, close_code::ERROR)), None),
            },
            Reply::Refused(error, code) => (error_text(&error), Some((error, code)), None),
            Reply::Idle => {
                close = CloseFrame {
                    code: close_code::AWAY,
                    reason: "idle_timeout".into(),
                };
                break;
            }
        };
        if !send(&mut sink, Message::Text(text.into()), write_timeout).await {
            return;
        }
        if let Some((error, code)) = refusal {
            close = CloseFrame {
                code,
                reason: error.code().into(),
            };
            break;
        }
    }
    if state.follow.stop.is_cancelled() && close.code == close_code::NORMAL {
        close = CloseFrame {
            code: close_code::AWAY,
            reason: "shutdown".into(),
        };
    }
    send(&mut sink, Message::Close(Some(close)), write_timeout).await;
}

fn error_text(error: &ApiError) -> String {
    error.body().to_string()
}

async fn send(
    sink: &mut SplitSink<WebSocket, Message>,
    message: Message,
    timeout: Duration,
) -> bool {
    match tokio::time::timeout(timeout, sink.send(message)).await {
        Ok(Ok(())) => true,
        Ok(Err(error)) => {
            tracing::debug!(%error, "append socket: write failed");
            false
        }
        Err(_) => {
            tracing::debug!("append socket: write timed out");
            false
        }
    }
}
