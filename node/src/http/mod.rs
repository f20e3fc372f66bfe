//! The HTTP API (`docs/HTTP.md`): the router, the request-reading
//! middleware that bounds every body in size and time, the handlers, the
//! errors; `GET /sync`, which upgrades to the sync protocol; and `GET
//! /events/append` (`append_socket`), appends streamed over a WebSocket
//! and answered in order by seq range; `/compaction` (`statements`), the
//! mesh admin's compaction statements. Public:
//! [`json`], the API's JSON types, shared with clients, and [`openapi`],
//! the OpenAPI document generated from the handlers and those types.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, LengthLimitError, Limited};

mod append_socket;
mod checkpoints;
mod error;
mod guard;
mod handlers;
pub mod json;
pub mod openapi;
mod state;
mod statements;

pub use append_socket::APPENDS_IN_FLIGHT_MAX;
pub(crate) use error::ApiError;
pub(crate) use handlers::peer_json;
pub(crate) use state::{AppState, ConnInfo};

/// The whole API.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            "/events",
            get(handlers::get_events).post(handlers::post_events),
        )
        .route("/events/query", post(handlers::query_events))
        .route("/events/append", get(append_socket::append_upgrade))
        .route("/marks", get(handlers::marks))
        .route("/forks", get(handlers::forks))
        .route("/checkpoint", get(checkpoints::get_checkpoint))
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .route("/compact", post(handlers::compact))
        .route(
            "/compaction",
            get(statements::get_compaction).post(statements::post_compaction),
        )
        .route("/verify", post(handlers::verify))
        .route(
            "/peers",
            get(handlers::list_peers)
                .post(handlers::add_peer)
                .delete(handlers::remove_peer),
        )
        .route("/sync", get(handlers::sync_upgrade))
        .route("/follow", get(crate::follow::follow_upgrade))
        .route("/", get(crate::follow::page))
        .route("/openapi.json", get(openapi::serve_document))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // `read_request` bounds every body by `body_bytes_max`; axum's own
        // default limit (2 MB) on the `Bytes` extractor would refuse bodies
        // under it with a `413` in plain text (found by schemathesis).
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            read_request,
        ))
        // Outermost: a request without the role its route needs is refused
        // before its body is read.
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            guard::require,
        ))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}

/// Reads the whole request body before any handler runs, bounded by
/// `body_bytes_max` (`413 body_too_large`) and `request_read_timeout`
/// (`408 request_timeout`), so a handler never waits on a slow client and
/// a commit never starts for a request that could still fail to arrive.
async fn read_request(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let limits = &state.limits;
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limits.body_bytes_max as u64) {
        return ApiError::body_too_large(limits.body_bytes_max).into_response();
    }
    let read = Limited::new(body, limits.body_bytes_max).collect();
    let bytes = match tokio::time::timeout(limits.request_read_timeout, read).await {
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {} ms",
                    limits.request_read_timeout.as_millis()
                ),
            )
            .into_response()
        }
        Ok(Err(error)) if error.is::<LengthLimitError>() => {
            return ApiError::body_too_large(limits.body_bytes_max).into_response()
        }
        Ok(Err(error)) => {
            return ApiError::bad_body(format!("cannot read the request body: {error}"))
                .into_response()
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
