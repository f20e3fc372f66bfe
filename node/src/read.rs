//! The node's one read: from what a reader names (a token's text or a
//! legacy scalar lamport position, a limit, a stream filter) to a page or
//! a stale answer. `GET /events` and `POST /events/query` answer it as
//! JSON, follow pushes it as frames; the CLI, MCP and the follower's
//! refetch reach it over HTTP.
//!
//! It knows neither HTTP nor JSON: its refusals are [`ReadError`]s, which
//! the API answers as `400`s and follow as `error` frames.

use meshlog_cursor::{token, CheckpointName, StaleCursor, StreamId, VersionVector};
use meshlog_replica::{Page, PageError};
use serde_json::Value;

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
    /// (`docs/TOKEN.md`, "Version 2"): nothing is guessed.
    #[error(
        "the token is relative to checkpoint {0}, which this node does not keep; resume from \
         the token's version-1 form, which a node that keeps the checkpoint answers"
    )]
    UnknownCheckpoint(CheckpointName),
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

impl ReadError {
    /// The stable code of the refusal, as HTTP and a follow `error` frame
    /// name it.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            ReadError::BadToken(_) => "bad_token",
            ReadError::UnknownCheckpoint(_) => "unknown_checkpoint",
            ReadError::BadLimit { .. } => "bad_limit",
            ReadError::Failed(_) => "internal",
        }
    }
}

/// A cursor as a reader names it: a token, a legacy scalar lamport position
/// (all digits; read as the cursor covering every event stamped at or
/// below it), or nothing (or empty) for the start.
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
        PageError::UnknownCheckpoint { name } => ReadError::UnknownCheckpoint(name),
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
