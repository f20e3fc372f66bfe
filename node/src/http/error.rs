//! The API's one error shape: `{"error": "<stable code>", "message":
//! "<human>"}`, with extra fields where the caller needs them to act
//! (a stale cursor's lost ranges and resume token).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use meshlog_cursor::CheckpointName;
use serde_json::{Map, Value};

/// An error answered to an HTTP client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    extra: Map<String, Value>,
    /// Seconds for a `retry-after` header, where retrying later helps.
    retry_after_s: Option<u32>,
}

impl ApiError {
    /// An error with `status`, a stable `code` and a human `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            extra: Map::new(),
            retry_after_s: None,
        }
    }

    /// `503 recovering`, `retry-after: 1`: the node is relearning its own
    /// stream from its peers before it appends again (`crate::recovery`).
    pub fn recovering(stream: u64, head: u64) -> ApiError {
        let mut error = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "recovering",
            format!(
                "this node is relearning its own stream {stream} from its peers (head {head} so \
                 far) before it appends again; retry shortly (GET /marks: writer.recovering)"
            ),
        );
        error.retry_after_s = Some(1);
        error
    }

    /// 426 `upgrade_required`: a WebSocket or sync route asked without
    /// its upgrade; `why` says what `route` takes.
    pub fn upgrade_required(route: &str, why: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "upgrade_required",
            format!("GET {route} {why}"),
        )
    }

    /// Adds a field beside `error` and `message`.
    pub fn with(mut self, key: &str, value: Value) -> ApiError {
        self.extra.insert(key.to_owned(), value);
        self
    }

    /// The human message.
    pub fn message(&self) -> String {
        self.message.clone()
    }

    /// The stable code (`bad_body`, `payload_too_large`, ...).
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The body every answer of this error carries: `{"error", "message",
    /// ...}`; a WebSocket error frame carries the same.
    pub fn body(&self) -> Value {
        let mut body = Map::new();
        body.insert("error".into(), self.code.into());
        body.insert("message".into(), self.message.clone().into());
        body.extend(self.extra.clone());
        Value::Object(body)
    }

    /// `400 bad_body`.
    pub fn bad_body(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_body", message)
    }

    /// `400 bad_limit`.
    pub fn bad_limit(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_limit", message)
    }

    /// `400 bad_token`.
    pub fn bad_token(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_token", message)
    }

    /// `409 unknown_checkpoint`: the token is relative to a checkpoint
    /// this node does not keep (`docs/TOKEN.md`, "Version 2"), and none
    /// of the `peers_asked` peers it asked sent it within the wait;
    /// `checkpoint` names it, in hex. The request is right, the node lacks
    /// what it refers to: resume from the token's version-1 form.
    pub fn unknown_checkpoint(
        message: impl Into<String>,
        name: CheckpointName,
        peers_asked: usize,
    ) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "unknown_checkpoint", message)
            .with("checkpoint", name.to_string().into())
            .with("peers_asked", peers_asked.into())
    }

    /// `413 body_too_large`.
    pub fn body_too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
        .with("limit", limit.into())
    }

    /// `500 internal`: the replica failed (its store); the node needs a
    /// restart to recover its durable state.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl From<crate::read::ReadError> for ApiError {
    fn from(error: crate::read::ReadError) -> ApiError {
        use crate::read::ReadError;
        let message = error.to_string();
        match error {
            ReadError::BadToken(message) => ApiError::bad_token(message),
            ReadError::UnknownCheckpoint {
                name, peers_asked, ..
            } => ApiError::unknown_checkpoint(message, name, peers_asked),
            ReadError::BadLimit { message, max } => {
                ApiError::bad_limit(message).with("max", max.into())
            }
            ReadError::Failed(message) => ApiError::internal(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}
