//! The node's one read: from what a reader names (a token's text or a
//! legacy scalar lamport position, a limit, a stream filter) to a page or
//! a stale answer. `GET /events` and `POST /events/query` answer it as
//! JSON, follow pushes it as frames; the CLI, MCP and the follower's
//! refetch reach it over HTTP.
//!
//! A version-2 token relative to a checkpoint the node does not keep is
//! fetched ([`cursor_fetching`], [`CheckpointFetch`]): the node asks its
//! peers for the checkpoint by name through its sync sessions, waits at
//! most `checkpoint_fetch_ms` for one to send it, and reads the token
//! again; only then is it refused (`docs/TOKEN.md`, "An unknown
//! checkpoint").
//!
//! It knows neither HTTP nor JSON: its refusals are [`ReadError`]s, which
//! the API answers as `400`s (`409` for an unknown checkpoint) and follow
//! as `error` frames.

use std::sync::Arc;
use std::time::Duration;

use meshlog_cursor::{token, Checkpoint, CheckpointName, StaleCursor, StreamId, VersionVector};
use meshlog_replica::{Page, PageError};
use meshlog_sync::CheckpointWants;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::metrics::Metrics;
use crate::replica::NodeReplica;

/// The page length when a request names none.
pub const LIMIT_DEFAULT: usize = 100;

/// What a read answers: a page, or the expected outcome of a cursor below
/// the floor.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Up to the limit of events the cursor does not cover.
    Page(Page),
    /// The cursor is below the floor: every stream and range lost, and the
    /// cursor to resume from.
    Stale(StaleCursor),
}

/// Why a read was refused (the request) or failed (the node).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    /// The cursor's text is neither a token nor a scalar lamport position.
    #[error("{0}")]
    BadToken(String),
    /// The token is relative to a checkpoint this node does not keep
    /// (`docs/TOKEN.md`, "Version 2"), and no peer it asked sent it within
    /// the wait: nothing is guessed.
    #[error(
        "the token is relative to checkpoint {name}, which this node does not keep, and {}; \
         resume from the token's version-1 form, which a node that keeps the checkpoint \
         answers",
        asked(*peers_asked, *wait_ms)
    )]
    UnknownCheckpoint {
        /// The checkpoint the token names.
        name: CheckpointName,
        /// How many peers were asked for it (0: no session whose peer
        /// takes checkpoint frames, fetching off, or as many fetches in
        /// flight as the node allows).
        peers_asked: usize,
        /// How long the node waited for them, in ms.
        wait_ms: u64,
    },
    /// The limit is not a whole number from 1 to `max`.
    #[error("{message}")]
    BadLimit {
        /// What was wrong.
        message: String,
        /// The largest limit.
        max: usize,
    },
    /// The replica failed (its store).
    #[error("{0}")]
    Failed(String),
}

/// What an unknown checkpoint's answer says of the peers asked.
fn asked(peers_asked: usize, wait_ms: u64) -> String {
    match peers_asked {
        0 => "no peer could be asked for it".to_owned(),
        n => format!("none of the {n} peer(s) it asked sent it within {wait_ms} ms"),
    }
}

impl ReadError {
    /// The stable code of the refusal, as HTTP and a follow `error` frame
    /// name it.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            ReadError::BadToken(_) => "bad_token",
            ReadError::UnknownCheckpoint { .. } => "unknown_checkpoint",
            ReadError::BadLimit { .. } => "bad_limit",
            ReadError::Failed(_) => "internal",
        }
    }
}

/// How the node fetches a checkpoint a reader's token names and it does
/// not keep: through its sync sessions' [`CheckpointWants`], waiting at
/// most `wait`, with at most `fetches_max` fetches at once. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointFetch {
    wants: CheckpointWants,
    wait: Duration,
    permits: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

impl CheckpointFetch {
    /// Fetches through `wants`' sessions, waiting at most `wait` (zero:
    /// never asks), at most `fetches_max` at once, counted in `metrics`.
    pub(crate) fn new(
        wants: CheckpointWants,
        wait: Duration,
        fetches_max: usize,
        metrics: Arc<Metrics>,
    ) -> Self {
        CheckpointFetch {
            wants,
            wait,
            permits: Arc::new(Semaphore::new(fetches_max)),
            metrics,
        }
    }

    /// Asks the peers for checkpoint `name` and waits, at most the wait,
    /// until the replica keeps it (a session keeping a checkpoint wakes
    /// the wait; nothing polls). How many peers were asked. Answers at
    /// once when none could be: no session whose peer takes checkpoint
    /// frames, fetching off, or every fetch permit taken.
    async fn fetch(&self, replica: &NodeReplica, name: CheckpointName) -> usize {
        if self.wait.is_zero() {
            return 0;
        }
        let Ok(_permit) = self.permits.try_acquire() else {
            tracing::debug!(%name, "checkpoint fetch refused: as many in flight as allowed");
            return 0;
        };
        // Subscribed before asking: an answer cannot slip in between.
        let mut kept = self.wants.kept();
        let asked = self.wants.ask(name);
        if asked == 0 {
            return 0;
        }
        tracing::debug!(%name, asked, "fetching a checkpoint from peers");
        self.metrics.checkpoint_fetches.inc();
        let deadline = tokio::time::Instant::now() + self.wait;
        while replica.checkpoint(name).is_none() {
            match tokio::time::timeout_at(deadline, kept.changed()).await {
                Ok(Ok(())) => {}
                // The wait is over, or the node is shutting down.
                Ok(Err(_)) | Err(_) => {
                    tracing::info!(%name, asked, "no peer sent the checkpoint a reader's token names");
                    self.metrics.checkpoint_fetches_missed.inc();
                    break;
                }
            }
        }
        asked
    }

    fn wait_ms(&self) -> u64 {
        u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX)
    }
}

/// [`cursor`], and for a version-2 token relative to a checkpoint the
/// node does not keep, the checkpoint fetched from the peers
/// ([`CheckpointFetch`]) and the token read again: the one read of a
/// reader's cursor. `ReadError::UnknownCheckpoint` only when no peer sent
/// it within the wait.
pub(crate) async fn cursor_fetching(
    replica: &NodeReplica,
    fetch: &CheckpointFetch,
    after: Option<&str>,
) -> Result<VersionVector, ReadError> {
    let name = match cursor(replica, after) {
        Err(ReadError::UnknownCheckpoint { name, .. }) => name,
        read => return read,
    };
    let peers_asked = fetch.fetch(replica, name).await;
    match cursor(replica, after) {
        Err(ReadError::UnknownCheckpoint { name, .. }) => Err(ReadError::UnknownCheckpoint {
            name,
            peers_asked,
            wait_ms: fetch.wait_ms(),
        }),
        read => read,
    }
}

/// The checkpoint `name`, fetched from the peers ([`CheckpointFetch`]) if
/// the node does not keep it: what a client expands a version-2 token
/// with (`GET /checkpoint`). `ReadError::UnknownCheckpoint` only when no
/// peer sent it within the wait.
pub(crate) async fn checkpoint(
    replica: &NodeReplica,
    fetch: &CheckpointFetch,
    name: CheckpointName,
) -> Result<Checkpoint, ReadError> {
    if let Some(checkpoint) = replica.checkpoint(name) {
        return Ok(checkpoint);
    }
    let peers_asked = fetch.fetch(replica, name).await;
    replica
        .checkpoint(name)
        .ok_or(ReadError::UnknownCheckpoint {
            name,
            peers_asked,
            wait_ms: fetch.wait_ms(),
        })
}

/// A cursor as a reader names it: a token, a legacy scalar lamport position
/// (all digits; read as the cursor covering every event stamped at or
/// below it), or nothing (or empty) for the start. A version-2 token
/// naming a checkpoint the node does not keep is refused at once; a
/// reader's request goes through [`cursor_fetching`].
pub(crate) fn cursor(
    replica: &NodeReplica,
    after: Option<&str>,
) -> Result<VersionVector, ReadError> {
    let text = match after {
        None | Some("") => return Ok(VersionVector::new()),
        Some(text) => text,
    };
    // A token's text starts with `A` (its version byte is 0x01), so an
    // all-digit value can only be a scalar. One longer than a token can be
    // goes to the codec, which refuses it with its reason: every `after`
    // is bounded as a token is, or any run of leading zeros would be a
    // scalar (found by schemathesis).
    if text.len() <= token::TOKEN_TEXT_MAX && text.bytes().all(|b| b.is_ascii_digit()) {
        let lamport = text.parse::<u64>().map_err(|_| {
            ReadError::BadToken(format!(
                "a scalar lamport position must fit 64 bits: {text:?} does not"
            ))
        })?;
        return Ok(replica.covering_lamport(lamport));
    }
    // A token of either version: a version-2 token is expanded against
    // the checkpoint it names, if the replica keeps it.
    replica.cursor(text).map_err(|error| match error {
        PageError::UnknownCheckpoint { name } => ReadError::UnknownCheckpoint {
            name,
            peers_asked: 0,
            wait_ms: 0,
        },
        PageError::BadToken(error) => ReadError::BadToken(error.to_string()),
        error => ReadError::Failed(error.to_string()),
    })
}

/// A page length as a reader names it: absent or `null` for the default, a
/// number (a whole float too: JSON does not tell 711 from 711.0), or the
/// same in decimal text (a query string's values are text); from 1 to the
/// replica's page bound.
pub(crate) fn limit(replica: &NodeReplica, limit: Option<&Value>) -> Result<usize, ReadError> {
    let max = replica.config().page_len_max;
    let number = match limit {
        None | Some(Value::Null) => return Ok(LIMIT_DEFAULT.min(max)),
        Some(Value::Number(number)) => number.as_u64().or_else(|| {
            number
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < u64::MAX as f64)
                .map(|f| f as u64)
        }),
        Some(Value::String(text)) => text.parse::<u64>().ok(),
        Some(_) => None,
    };
    let message = match number {
        Some(n) if n >= 1 && n <= max as u64 => return Ok(n as usize),
        Some(n) => format!("limit must be between 1 and {max}; got {n}"),
        None => format!(
            "limit must be a whole number between 1 and {max}; got {}",
            limit.expect("an absent limit is the default")
        ),
    };
    Err(ReadError::BadLimit { message, max })
}

/// Up to `limit` events `after` does not cover: of the whole log, or with
/// `stream`, of that writer alone (`next` advances its entry only; a
/// replica operation, `page_stream`).
pub(crate) fn read(
    replica: &NodeReplica,
    after: &VersionVector,
    limit: usize,
    stream: Option<StreamId>,
) -> Result<Answer, ReadError> {
    let page = match stream {
        Some(stream) => replica.page_stream(stream, after, limit),
        None => replica.page(after, limit),
    };
    match page {
        Ok(page) => Ok(Answer::Page(page)),
        Err(PageError::Stale(stale)) => Ok(Answer::Stale(stale)),
        Err(PageError::LimitTooLarge { limit, max }) => Err(ReadError::BadLimit {
            message: format!("limit {limit} exceeds the maximum of {max}"),
            max,
        }),
        Err(error) => Err(ReadError::Failed(error.to_string())),
    }
}
