//! The mesh admin's compaction statements over HTTP (`docs/HTTP.md`,
//! "Compaction statements"; `docs/SIGNING.md`, "Floors with an
//! authority"). `GET /compaction` answers what a statement of a stream at
//! a floor commits to (the stream's chain hash there), so that the admin
//! signs where the key is kept (`meshlog key compact`); `POST /compaction`
//! hands a signed statement to the replica, which judges it as it judges
//! one a peer sends, takes it (the stream erased up to its floor, readers
//! told what they lost) and sends it with that floor to peers behind it
//! (and in a `Statement` frame to peers past it that take the frame).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use meshlog_cursor::StreamId;
use meshlog_replica::{DeltaError, ReplicaError, SignedCompaction};

use super::error::ApiError;
use super::handlers::stream_param;
use super::json::{
    decimal, object_body, CompactionJson, ErrorJson, StatementBody, StatementTakenJson,
};
use super::state::AppState;

type Shared = State<Arc<AppState>>;
type QueryResult = Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>;

/// `GET /compaction?stream=S&floor=F`.
#[utoipa::path(
    get,
    path = "/compaction",
    tag = "node",
    summary = "What a compaction statement of a stream at a floor commits to",
    description = "The stream's chain hash at `floor`, read through the events this node holds: \
        what the mesh admin signs (`meshlog key compact`) to erase the stream up to `floor` on \
        every node that trusts the admin key (`docs/SIGNING.md`, \"Floors with an authority\").",
    params(
        ("stream" = String, Query, pattern = r"^0*[1-9][0-9]{0,19}$",
            description = "The stream (decimal, non-zero)."),
        ("floor" = u64, Query, minimum = 1,
            description = "The last seq the statement drops."),
    ),
    responses(
        (status = 200, description = "The statement's stream, floor and chain hash.",
            body = CompactionJson),
        (status = 400, description = "`bad_stream`, `bad_floor` or `bad_query`.",
            body = ErrorJson),
        (status = 409, description = "`hash_unknown`: this node cannot know the hash there \
            (`floor` is above its head or below its floor of the stream, or it holds the \
            stream unanchored); the message says which, `floor` and `head` are the node's.",
            body = ErrorJson),
        (status = 500, description = "`internal`: the replica's store failed.", body = ErrorJson),
    )
)]
pub async fn get_compaction(
    State(state): Shared,
    query: QueryResult,
) -> Result<Json<CompactionJson>, ApiError> {
    let Query(query) = query
        .map_err(|error| ApiError::new(StatusCode::BAD_REQUEST, "bad_query", error.body_text()))?;
    let stream = stream_param(query.get("stream").map_or("", String::as_str))?;
    let floor = match query.get("floor").map(|text| text.parse::<u64>()) {
        Some(Ok(floor)) if floor > 0 => floor,
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_floor",
                "floor must be a seq, a decimal number from 1",
            ))
        }
    };
    match state.replica.compaction_at(stream, floor).await {
        Ok(Some(statement)) => Ok(Json(CompactionJson {
            stream: decimal(stream),
            floor,
            hash: statement.hash.to_string(),
        })),
        Ok(None) => Err(hash_unknown(&state, stream, floor)),
        Err(error) => Err(ApiError::internal(error.to_string())),
    }
}

/// `409 hash_unknown`: why this node cannot answer the chain hash of
/// `stream` at `floor`.
fn hash_unknown(state: &AppState, stream: StreamId, floor: u64) -> ApiError {
    let replica = &state.replica;
    let (held_floor, head) = (replica.floor().get(stream), replica.marks().get(stream));
    let why = if head == 0 {
        format!("this node holds nothing of stream {}", stream.get())
    } else if floor > head {
        format!(
            "this node holds stream {} up to seq {head} only",
            stream.get()
        )
    } else if floor < held_floor {
        format!(
            "this node compacted stream {} to seq {held_floor}: the hash at seq {floor} went \
             with its events (ask a node that holds it, or state a floor from {held_floor})",
            stream.get()
        )
    } else {
        format!(
            "this node holds stream {} unanchored (it learned its floor without the hash \
             there), so its chain is not the writer's to sign",
            stream.get()
        )
    };
    ApiError::new(
        StatusCode::CONFLICT,
        "hash_unknown",
        format!("no chain hash at seq {floor}: {why}"),
    )
    .with("floor", held_floor.into())
    .with("head", head.into())
}

/// `POST /compaction` with `{"statement": HEX}`.
#[utoipa::path(
    post,
    path = "/compaction",
    tag = "node",
    summary = "Take a compaction statement the mesh admin signed",
    description = "Hands a signed compaction statement (hex of its 144 bytes, `docs/SIGNING.md`) \
        to the replica, which judges it as one a peer sends: signed by the admin key this node \
        trusts (`admin_key`) or the stream's writer, the signature sound, and where this node \
        holds seq `floor`, the chain hash there its own. Taken, it erases the stream up to its \
        floor (a reader below is told what it lost, `410`) and is sent with that floor to peers \
        behind it, and offered to peers past it that take `Statement` frames. A statement the \
        replica refuses counts in `meshlog_deltas_refused_total`.",
    request_body(content = StatementBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Taken: the node's floor of the stream now.",
            body = StatementTakenJson),
        (status = 400, description = "`bad_body`, or `bad_statement`: not hex of a signed \
            compaction statement (the message says why).", body = ErrorJson),
        (status = 422, description = "`statement_refused`: the replica refused it; `reason` \
            says why: `no_authority` (signed by neither the trusted admin key nor the \
            stream's writer), `bad_signature`, `hash_mismatch` (another history than this \
            node's at `floor`), `own_stream` (no statement erases a node's own stream), \
            `unknown_writer` (a stream the closed membership does not admit), \
            `floor_too_large`, or `refused`.", body = ErrorJson),
        (status = 500, description = "`internal`: the replica's store failed.", body = ErrorJson),
    )
)]
pub async fn post_compaction(
    State(state): Shared,
    body: Bytes,
) -> Result<Json<StatementTakenJson>, ApiError> {
    let body: StatementBody = object_body(&body, r#"{"statement": HEX}"#)?;
    let signed = crate::trust::decode_hex(&body.statement)
        .and_then(|bytes| SignedCompaction::from_bytes(&bytes).map_err(|e| e.to_string()))
        .map_err(|reason| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_statement",
                format!("not a signed compaction statement: {reason}"),
            )
        })?;
    let stream = signed.statement.stream;
    if stream == state.replica.stream() {
        return Err(refused(
            "own_stream",
            format!(
                "stream {} is this node's own: no statement erases it (its writer compacts it: \
                 POST /compact)",
                stream.get()
            ),
        ));
    }
    let before = state.replica.floor().get(stream);
    state
        .replica
        .take_statement(signed)
        .await
        .map_err(statement_error)?;
    let floor = state.replica.floor().get(stream);
    tracing::info!(
        stream = stream.get(),
        statement_floor = signed.statement.floor,
        floor,
        signer = %signed.signer,
        "compaction statement taken"
    );
    Ok(Json(StatementTakenJson {
        stream: decimal(stream),
        floor,
        raised: floor > before,
    }))
}

/// `422 statement_refused` with its `reason`.
fn refused(reason: &'static str, message: String) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "statement_refused",
        message,
    )
    .with("reason", reason.into())
}

/// The replica's refusal of a statement, by its reason; a store failure
/// is `500 internal`.
fn statement_error(error: ReplicaError) -> ApiError {
    let ReplicaError::Delta(rule) = error else {
        return ApiError::internal(error.to_string());
    };
    let reason = match rule {
        DeltaError::StatementNoAuthority { .. } => "no_authority",
        DeltaError::BadStatement { .. } => "bad_signature",
        DeltaError::StatementHashMismatch { .. } => "hash_mismatch",
        DeltaError::UnknownWriter { .. } => "unknown_writer",
        DeltaError::FloorTooLarge { .. } => "floor_too_large",
        _ => "refused",
    };
    refused(reason, rule.to_string())
}
