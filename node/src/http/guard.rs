//! The API's guard: the middleware that refuses a request whose route
//! needs a role its `Authorization` does not prove, and the `401`/`403`
//! answers. Here, not in `auth`, so that `auth` (who may do what) knows
//! nothing of HTTP's answers, and `http` depends on `auth`, never back.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::state::AppState;
use crate::auth::{need, query_token, Denied};

/// The middleware: refuses a request whose route needs a role its
/// `Authorization` does not prove, before its body is read.
pub(crate) async fn require(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let need = need(request.method(), request.uri().path());
    // A browser cannot set headers on a WebSocket: `GET /follow` also takes
    // the secret as `access_token` in its query (the follow page does).
    let from_query = match request.headers().get(header::AUTHORIZATION) {
        None if request.uri().path() == "/follow" => query_token(request.uri().query()),
        _ => None,
    };
    let authorization = from_query
        .as_ref()
        .or_else(|| request.headers().get(header::AUTHORIZATION));
    match state.auth.authorize(need, authorization) {
        Ok(_) => next.run(request).await,
        Err(denied) => {
            state.metrics.requests_denied.inc();
            tracing::debug!(
                method = %request.method(),
                path = request.uri().path(),
                ?denied,
                "request refused"
            );
            denied_response(denied)
        }
    }
}

/// `401 unauthorized` or `403 forbidden`, in the API's error shape.
fn denied_response(denied: Denied) -> Response {
    match denied {
        Denied::Unauthenticated(reason) => {
            let mut response = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                format!("{reason}: this route needs `Authorization: Bearer SECRET`"),
            )
            .into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"meshlog\""),
            );
            response
        }
        Denied::Forbidden { has, needs } => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "this route needs the {} role; the secret given is {}",
                needs.name(),
                has.name()
            ),
        )
        .with("needs", needs.name().into())
        .into_response(),
    }
}
