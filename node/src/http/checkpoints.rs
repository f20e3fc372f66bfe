//! `GET /checkpoint?name=HEX`: a checkpoint's vector, as a version-1
//! token, fetched from the peers if this node does not keep it
//! (`crate::read::checkpoint`). A client holding a version-2 token
//! expands it with this, checking the vector against the name (the name
//! is a hash of the token answered: no node can hand back another vector
//! under it); the follower and `meshlog events --follow --after` do
//! (`crate::client::Client::cursor`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use meshlog_cursor::{token, CheckpointName, CHECKPOINT_NAME_BYTES};

use super::error::ApiError;
use super::json::{CheckpointJson, ErrorJson};
use super::state::AppState;
use crate::read;

type QueryResult = Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>;

/// `GET /checkpoint?name=HEX`.
#[utoipa::path(
    get,
    path = "/checkpoint",
    tag = "events",
    summary = "A checkpoint's vector, to expand a version-2 token",
    description = "The checkpoint a version-2 token names (`docs/TOKEN.md`, \"Version 2\"), as \
        a version-1 token: the token's cursor is this vector with the token's differences \
        applied. Check the name (the first 16 bytes of the BLAKE3 of the token's bytes) before \
        using it. A node that does not keep the checkpoint asks its peers for it first, waiting \
        at most `checkpoint_fetch_ms`.",
    params(
        ("name" = String, Query, pattern = r"^[0-9a-fA-F]{32}$",
            description = "The checkpoint's name: 32 hex digits."),
    ),
    responses(
        (status = 200, description = "The checkpoint.", body = CheckpointJson),
        (status = 400, description = "`bad_checkpoint` or `bad_query`.", body = ErrorJson),
        (status = 409, description = "`unknown_checkpoint`: this node does not keep it and no \
            peer it asked (`peers_asked`) sent it within the wait.", body = ErrorJson),
        (status = 500, description = "`internal`: the checkpoint has no token.", body = ErrorJson),
    )
)]
pub async fn get_checkpoint(
    State(state): State<Arc<AppState>>,
    query: QueryResult,
) -> Result<Json<CheckpointJson>, ApiError> {
    let Query(query) = query
        .map_err(|error| ApiError::new(StatusCode::BAD_REQUEST, "bad_query", error.body_text()))?;
    let name = name_param(query.get("name").map_or("", String::as_str))?;
    let checkpoint = read::checkpoint(&state.replica, &state.fetch, name).await?;
    let token = token::encode_text(checkpoint.vector())
        .map_err(|error| ApiError::internal(error.to_string()))?;
    Ok(Json(CheckpointJson {
        checkpoint: name.to_string(),
        token,
    }))
}

/// A checkpoint's name as 32 hex digits, else `400 bad_checkpoint`.
fn name_param(text: &str) -> Result<CheckpointName, ApiError> {
    let bad = || {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_checkpoint",
            format!("name must be a checkpoint's name, 32 hex digits; got {text:?}"),
        )
    };
    if text.len() != 2 * CHECKPOINT_NAME_BYTES {
        return Err(bad());
    }
    let bytes = crate::trust::decode_hex(text).map_err(|_| bad())?;
    let bytes: [u8; CHECKPOINT_NAME_BYTES] = bytes.try_into().map_err(|_| bad())?;
    Ok(CheckpointName::from_bytes(bytes))
}
