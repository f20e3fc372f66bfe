//! The API's handlers. Each parses and validates its input first (a typed
//! `ApiError` on failure, nothing changed), then makes one replica call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::header::{ACCEPT, CONNECTION, CONTENT_TYPE, UPGRADE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hyper_util::rt::TokioIo;
use meshlog_cursor::{token, StreamId};
use meshlog_replica::{ReplicaError, RetentionPolicy};
use serde_json::Value;

use super::error::ApiError;
use super::json::{
    chains_json, decimal, digest_json, json_batch, link_counters_json, link_limits_json,
    ndjson_batch, object_body, vector_json, AppendBatchJson, AppendCompactJson, AppendJson,
    AppendedJson, CompactBody, CompactedJson, ErrorJson, EventJson, ForksJson, HealthJson,
    InboundJson, MarksJson, PageCompactJson, PageJson, PeerAddedJson, PeerBody, PeerJson,
    PeerRemovedJson, PeersJson, QueryBody, RawPayload, Representation, UnsealedReason,
    VerifiedJson, WriterJson, COMPACT_MEDIA_TYPE,
};
use super::state::AppState;
use crate::metrics::PeerGauge;
use crate::peers::{PeerStatus, SYNC_PROTOCOL};
use crate::read::{self, Answer};

type Shared = State<Arc<AppState>>;

/// `GET /events?after=TOKEN&limit=N`.
#[utoipa::path(
    get,
    path = "/events",
    tag = "events",
    summary = "Page the log from a token",
    description = "Up to `limit` events the cursor `after` does not cover, in `(lamport, stream)` \
        order, and `next`, the token to pass as `after` for the following page. The token is valid \
        on every node of the mesh; a token from a node that is ahead is served what this node \
        has (`behind`), never an error.",
    params(
        ("after" = Option<String>, Query, pattern = r"^(?:[0-9]*|A[A-Za-z0-9_-]*)$",
            description = "The token to page after (a page's `next`, a marks `token`, a stale \
                answer's `resume`), or a legacy scalar lamport position (decimal); absent or \
                empty: the start of the log.",
            example = "AQEBAiOCL28"),
        // Its maximum and the description that names it are set from
        // the replica's bound by the document's `Contract` (openapi.rs).
        ("limit" = Option<u64>, Query, minimum = 1,
            description = "Events per page; default 100."),
        ("stream" = Option<String>, Query, pattern = r"^0*[1-9][0-9]{0,19}$",
            description = "A writer's stream id (decimal, non-zero, 64-bit): that writer's \
                events alone; `next` advances its entry only."),
    ),
    responses(
        (status = 200, description = "A page: `PageJson` by default, `PageCompactJson` \
            (runs) when `Accept` lists `application/vnd.meshlog.compact+json`.",
            content(
                (PageJson = "application/json"),
                (PageCompactJson = "application/vnd.meshlog.compact+json"),
            ),
            links(("next_page" = (operation_id = "get_events",
                parameters(("after" = "$response.body#/next")),
                description = "The following page: `next` as `after`.")))),
        (status = 400, description = "`bad_token`, `bad_limit`, `bad_stream` or `bad_query`.",
            body = ErrorJson),
        (status = 410, description = "`stale_cursor`: the cursor is below the compaction floor; \
            `lost` names every stream and range lost, `resume` the token to continue from.",
            body = ErrorJson,
            links(("resume" = (operation_id = "get_events",
                parameters(("after" = "$response.body#/resume")),
                description = "Accept the gap and page on from `resume`.")))),
        (status = 409, description = "`unknown_checkpoint`: the token is relative to a \
            checkpoint this node does not keep (`checkpoint` names it), and none of the peers it \
            asked for it (`peers_asked`) sent it within `checkpoint_fetch_ms`; resume from the \
            token's version-1 form (`GET /checkpoint` at a node that keeps it).",
            body = ErrorJson),
        (status = 500, description = "`internal`: the replica's store failed.", body = ErrorJson),
    )
)]
pub async fn get_events(
    State(state): Shared,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query
        .map_err(|error| ApiError::new(StatusCode::BAD_REQUEST, "bad_query", error.body_text()))?;
    let limit = query.get("limit").map(|text| Value::String(text.clone()));
    let stream = query
        .get("stream")
        .map(|text| stream_param(text))
        .transpose()?;
    page(
        &state,
        query.get("after").map(String::as_str),
        limit.as_ref(),
        stream,
        representation(&headers),
    )
    .await
}

/// A `stream` query parameter: a non-zero decimal stream id, else
/// `400 bad_stream`.
pub(super) fn stream_param(text: &str) -> Result<StreamId, ApiError> {
    match text.parse::<u64>() {
        Ok(id) if id != 0 => Ok(StreamId::new(id)),
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_stream",
            format!("stream must be a non-zero decimal stream id; got {text:?}"),
        )),
    }
}

/// The representation a request's `Accept` asks for.
fn representation(headers: &HeaderMap) -> Representation {
    Representation::from_accept(
        headers
            .get_all(ACCEPT)
            .iter()
            .filter_map(|value| value.to_str().ok()),
    )
}

/// A body in the compact media type.
fn compact_response(status: StatusCode, body: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (
            status,
            [(CONTENT_TYPE, HeaderValue::from_static(COMPACT_MEDIA_TYPE))],
            bytes,
        )
            .into_response(),
        Err(error) => {
            ApiError::internal(format!("cannot write the answer: {error}")).into_response()
        }
    }
}

/// `POST /events/query` with `{"after": TOKEN or null, "limit": N}`.
#[utoipa::path(
    post,
    path = "/events/query",
    tag = "events",
    summary = "Page the log, the token in the body",
    description = "The same as `GET /events`, for tokens too long for a URL.",
    request_body(content = QueryBody, content_type = "application/json"),
    responses(
        (status = 200, description = "A page, in the representation `Accept` chooses, as on \
            `GET /events`.",
            content(
                (PageJson = "application/json"),
                (PageCompactJson = "application/vnd.meshlog.compact+json"),
            ),
            links(("next_page" = (operation_id = "get_events",
                parameters(("after" = "$response.body#/next")),
                description = "The following page: `next` as `after`, on either route.")))),
        (status = 400, description = "`bad_body`, `bad_token` or `bad_limit`.", body = ErrorJson),
        (status = 409, description = "`unknown_checkpoint`, as on `GET /events`.",
            body = ErrorJson),
        (status = 410, description = "`stale_cursor`, as on `GET /events`.", body = ErrorJson),
        (status = 500, description = "`internal`: the replica's store failed.", body = ErrorJson),
    )
)]
pub async fn query_events(
    State(state): Shared,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let query: QueryBody = object_body(&body, r#"{"after": TOKEN or null, "limit": N}"#)?;
    page(
        &state,
        query.after.as_deref(),
        query.limit.as_ref(),
        None,
        representation(&headers),
    )
    .await
}

async fn page(
    state: &AppState,
    after: Option<&str>,
    limit: Option<&Value>,
    stream: Option<StreamId>,
    representation: Representation,
) -> Result<Response, ApiError> {
    let limit = read::limit(&state.replica, limit)?;
    let after = read::cursor_fetching(&state.replica, &state.fetch, after).await?;
    let page = match read::read(&state.replica, &after, limit, stream)? {
        Answer::Page(page) => page,
        Answer::Stale(stale) => {
            state.metrics.pages_stale.inc();
            return Err(super::json::stale_error(&state.replica, &stale));
        }
    };
    let marks = state.replica.marks();
    let behind = after.iter().any(|(stream, seq)| seq > marks.get(stream));
    if behind {
        state.metrics.pages_behind.inc();
    }
    state.metrics.pages.inc();
    // The shortest token the replica writes: version 2 against a
    // checkpoint it keeps (gossiped to its peers), or version 1.
    let next = page.token.clone();
    Ok(match representation {
        Representation::Json => Json(PageJson {
            events: page.events.iter().map(EventJson::from).collect(),
            next,
            at_head: page.at_head,
            behind,
        })
        .into_response(),
        Representation::Compact => compact_response(
            StatusCode::OK,
            &PageCompactJson::new(&page.events, next, page.at_head, behind),
        ),
    })
}

/// `POST /events`: one raw payload, or a JSON / NDJSON batch, committed
/// durably as one commit before it is answered.
#[utoipa::path(
    post,
    path = "/events",
    tag = "events",
    summary = "Append events to this node's stream",
    description = "The body is one raw payload, whatever its bytes and content type, unless the \
        content type is `application/json` (a batch: an array of strings, `{\"payload\"}` or \
        `{\"payload_base64\"}` objects) or `application/x-ndjson` (a batch, one such element \
        per line, blank lines skipped). A batch is one durable commit: all or nothing. The \
        answer comes once the commit is durable.",
    request_body(
        description = "A raw payload, or a batch.",
        content(
            (AppendBatchJson = "application/json"),
            (String = "application/x-ndjson"),
            (String = "text/plain"),
            (RawPayload = "application/octet-stream"),
        )
    ),
    responses(
        (status = 201, description = "The events appended, once durable: each named, in \
            order (`AppendJson`, the default), or the batch's stream and ranges \
            (`AppendCompactJson`) when `Accept` lists `application/vnd.meshlog.compact+json`.",
            content(
                (AppendJson = "application/json"),
                (AppendCompactJson = "application/vnd.meshlog.compact+json"),
            ),
            links(("read_stream" = (operation_id = "get_events",
                parameters(("stream" = "$response.body#/events/0/stream")),
                description = "Page the writer's stream the events were appended to (in the \
                    compact answer, `stream` itself).")))),
        (status = 400, description = "`bad_body`: a batch that is not the JSON documented.",
            body = ErrorJson),
        (status = 413, description = "`payload_too_large` (one payload over the replica's \
            limit, default 1 MiB; nothing appended) or `body_too_large`.", body = ErrorJson),
        (status = 500, description = "`internal`: the replica's store failed.", body = ErrorJson),
        (status = 503, description = "`recovering`: the node is relearning its own stream \
            from its peers (at start, or a data directory restored from a backup); or \
            `too_many_connections`. Both with `retry-after: 1`.", body = ErrorJson),
    )
)]
pub async fn post_events(
    State(state): Shared,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let refused = |error: ApiError| {
        state.metrics.appends_refused.inc();
        error
    };
    let media = headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    let payloads = match media.as_str() {
        "application/json" => json_batch(&body).map_err(refused)?,
        "application/x-ndjson" => ndjson_batch(&body).map_err(refused)?,
        _ => vec![body],
    };
    check_payloads(&state, &payloads)?;
    recovered(&state).await?;
    let started = Instant::now();
    let events = committed(&state, started, state.replica.append_batch(payloads).await)?;
    if representation(&headers) == Representation::Compact {
        let answer = AppendCompactJson::new(state.replica.stream(), &events);
        return Ok(compact_response(StatusCode::CREATED, &answer));
    }
    let appended: Vec<AppendedJson> = events
        .iter()
        .map(|event| AppendedJson {
            stream: decimal(event.stream),
            seq: event.seq,
            lamport: event.lamport,
        })
        .collect();
    Ok((StatusCode::CREATED, Json(AppendJson { events: appended })).into_response())
}

/// Refuses `payloads` (counting the refusal) when one is over the
/// replica's payload limit: `payload_too_large`, naming it. Every append
/// route checks here before it commits.
pub(super) fn check_payloads(state: &AppState, payloads: &[Bytes]) -> Result<(), ApiError> {
    let payload_max = state.replica.config().payload_bytes_max;
    match payloads
        .iter()
        .enumerate()
        .find(|(_, payload)| payload.len() > payload_max)
    {
        Some((index, payload)) => {
            state.metrics.appends_refused.inc();
            Err(payload_too_large(index, payload.len(), payload_max))
        }
        None => Ok(()),
    }
}

/// Every append route waits here, briefly, while the node relearns its
/// own stream from its peers (`crate::recovery`), and is refused `503
/// recovering` if it still does: appending then would fork the stream.
pub(super) async fn recovered(state: &AppState) -> Result<(), ApiError> {
    if state.replica.wait_recovered().await {
        return Ok(());
    }
    state.metrics.appends_refused.inc();
    let stream = state.replica.stream();
    Err(ApiError::recovering(
        stream.get(),
        state.replica.marks().get(stream),
    ))
}

/// What every append route does with a commit's outcome: counts it (the
/// events, the commit's latency from `started`, or the refusal) and turns
/// a refusal into the API's error.
pub(super) fn committed(
    state: &AppState,
    started: Instant,
    outcome: Result<Vec<meshlog_replica::Event>, ReplicaError>,
) -> Result<Vec<meshlog_replica::Event>, ApiError> {
    let events = outcome.map_err(|error| {
        state.metrics.appends_refused.inc();
        match error {
            ReplicaError::PayloadTooLarge { len, limit, .. } => payload_too_large(0, len, limit),
            ReplicaError::Recovering { stream, head } => ApiError::recovering(stream.get(), head),
            error => ApiError::internal(error.to_string()),
        }
    })?;
    state
        .metrics
        .commit_seconds
        .observe(started.elapsed().as_secs_f64());
    state.metrics.appends.inc_by(events.len() as u64);
    Ok(events)
}

fn payload_too_large(index: usize, len: usize, limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("payload {index} is {len} bytes; the limit is {limit}"),
    )
    .with("limit", limit.into())
}

pub(crate) fn peer_json(peer: &PeerStatus) -> PeerJson {
    let (limits, limits_total) = link_limits_json(&peer.session.limits);
    PeerJson {
        url: peer.addr.clone(),
        connected: peer.connected,
        stream: peer.stream.map(decimal),
        marks: vector_json(&peer.marks),
        lag_events: peer.lag_events,
        last_error: peer.last_error.clone(),
        limits,
        limits_total,
        counters: link_counters_json(&peer.session),
    }
}

/// `GET /marks`.
#[utoipa::path(
    get,
    path = "/marks",
    tag = "node",
    summary = "This node's marks, floor, token, digests and peers",
    responses(
        (status = 200, description = "The node's state.", body = MarksJson,
            links(("from_marks" = (operation_id = "get_events",
                parameters(("after" = "$response.body#/token")),
                description = "Page only what arrives after now.")))),
        (status = 500, description = "`internal`: the marks could not be encoded.",
            body = ErrorJson),
    )
)]
pub async fn marks(State(state): Shared) -> Result<Json<MarksJson>, ApiError> {
    let replica = &state.replica;
    let marks = replica.marks();
    let digest = replica.digest();
    let token = token::encode_text(&marks)
        .map_err(|error| ApiError::internal(format!("cannot encode the marks: {error}")))?;
    let peers: Vec<PeerJson> = state.peers.list().iter().map(peer_json).collect();
    Ok(Json(MarksJson {
        stream: decimal(replica.stream()),
        marks: vector_json(&marks),
        floor: vector_json(&replica.floor()),
        token,
        digest: digest_json(digest),
        chains: chains_json(&replica.chain_digest()),
        writer: Some(WriterJson {
            public_key: replica.writer_key().to_string(),
            sealed: replica.sealed(),
            // The one way a node writes unsealed (`crate::replica`).
            unsealed_reason: (!replica.sealed()).then_some(UnsealedReason::UnboundLegacyStream),
            recovering: replica.is_recovering(),
        }),
        peers,
    }))
}

/// `GET /forks`.
#[utoipa::path(
    get,
    path = "/forks",
    tag = "node",
    summary = "The streams this node holds proven forked, with their proofs",
    description = "A stream whose writer signed two histories (equivocation with valid \
        signatures, `docs/SIGNING.md`): the node keeps the first proof and freezes the \
        stream (it takes nothing of it above what it held). Read-only; a peer learns each \
        proof over sync.",
    responses((status = 200, description = "The proofs kept (none: an empty list).",
        body = ForksJson)),
)]
pub async fn forks(State(state): Shared) -> Json<ForksJson> {
    let forks = state.replica.forks();
    Json(ForksJson {
        forks: forks.iter().map(super::json::fork_json).collect(),
    })
}

/// `GET /health`.
#[utoipa::path(
    get,
    path = "/health",
    tag = "node",
    summary = "Whether the node answers",
    responses((status = 200, description = "It does.", body = HealthJson)),
)]
pub async fn health() -> Json<HealthJson> {
    Json(HealthJson {
        status: "ok".into(),
    })
}

/// `GET /metrics`: Prometheus (OpenMetrics) text.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "node",
    summary = "Prometheus metrics (OpenMetrics text)",
    responses((status = 200, description = "OpenMetrics text, version 1.0.0.",
        content_type = "application/openmetrics-text", body = String)),
)]
pub async fn metrics(State(state): Shared) -> Response {
    let peers = state.peers.list();
    let gauges: Vec<PeerGauge<'_>> = peers
        .iter()
        .map(|peer| PeerGauge {
            url: &peer.addr,
            connected: peer.connected,
            lag_events: peer.lag_events,
        })
        .collect();
    let sessions = state.peers.session_totals();
    let text = state
        .metrics
        .render(state.replica.stats(), &gauges, sessions);
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `POST /compact` with `{"keep_last": N?, "keep_ms": N?, "ignore_peers": bool?}`.
#[utoipa::path(
    post,
    path = "/compact",
    tag = "node",
    summary = "Drop old events, raising the floor",
    description = "An event is kept while it is among its stream's last `keep_last` or younger \
        than `keep_ms`; with neither, nothing is dropped. The floor never passes what a peer has \
        acknowledged unless `ignore_peers`. An empty body is `{}`.",
    request_body(content = CompactBody, content_type = "application/json"),
    responses(
        (status = 200, description = "What was dropped, and the floor now.",
            body = CompactedJson),
        (status = 400, description = "`bad_body`.", body = ErrorJson),
        (status = 500, description = "`internal`: the replica's store failed.", body = ErrorJson),
    )
)]
pub async fn compact(State(state): Shared, body: Bytes) -> Result<Json<CompactedJson>, ApiError> {
    // No body: the defaults. Anything else is a JSON object, or refused
    // (whitespace alone is not JSON).
    let body: CompactBody = if body.is_empty() {
        CompactBody::default()
    } else {
        object_body(
            &body,
            r#"{"keep_last": N?, "keep_ms": N?, "ignore_peers": bool?}"#,
        )?
    };
    let policy = RetentionPolicy {
        keep_last: body.keep_last,
        keep_ms: body.keep_ms,
        ignore_peers: body.ignore_peers,
    };
    let (report, floor) = state
        .replica
        .compact(policy, state.peers.acknowledged())
        .await
        .map_err(|error| ApiError::internal(error.to_string()))?;
    Ok(Json(CompactedJson {
        dropped: report.dropped,
        streams: report.streams,
        floor: vector_json(&floor),
    }))
}

/// `POST /verify`: reads and checks every held event.
#[utoipa::path(
    post,
    path = "/verify",
    tag = "node",
    summary = "Read and check every held event",
    description = "Reads every event the node holds and checks it against the store's recorded \
        digest, per-stream bounds and lamport order: the full check a restart does not do \
        (`docs/STORAGE.md`). Writes wait while it runs; reads do not. It takes time in \
        proportion to the log.",
    responses(
        (status = 200, description = "Every held event read and found sound.",
            body = VerifiedJson),
        (status = 500, description = "`corrupt`: the check failed; the message names the \
            file, stream and seq, or the digests that differ.", body = ErrorJson),
    )
)]
pub async fn verify(State(state): Shared) -> Result<Json<VerifiedJson>, ApiError> {
    let started = Instant::now();
    match state.replica.verify().await {
        Ok(verified) => {
            tracing::info!(
                streams = verified.streams,
                events = verified.events,
                ms = started.elapsed().as_millis() as u64,
                "verify: every held event is sound"
            );
            Ok(Json(VerifiedJson {
                streams: verified.streams as u64,
                events: verified.events,
            }))
        }
        Err(error) => {
            tracing::error!(%error, "verify failed");
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "corrupt",
                error.to_string(),
            ))
        }
    }
}

/// `GET /peers`.
#[utoipa::path(
    get,
    path = "/peers",
    tag = "peers",
    summary = "The peers this node dials, with their state",
    responses((status = 200, description = "The dialed peers in the order they were added, \
        and the inbound sessions running now.", body = PeersJson)),
)]
pub async fn list_peers(State(state): Shared) -> Json<PeersJson> {
    let peers: Vec<PeerJson> = state.peers.list().iter().map(peer_json).collect();
    let inbound = state
        .peers
        .inbound()
        .into_iter()
        .map(|session| {
            let (limits, limits_total) = link_limits_json(&session.session.limits);
            InboundJson {
                remote: session.addr.to_string(),
                connected: session.connected,
                stream: session.stream.map(decimal),
                marks: vector_json(&session.marks),
                lag_events: session.lag_events,
                limits,
                limits_total,
                counters: link_counters_json(&session.session),
            }
        })
        .collect();
    Json(PeersJson { peers, inbound })
}

fn peer_body(body: &[u8]) -> Result<PeerBody, ApiError> {
    object_body(body, r#"{"url": "http://host:port"}"#)
}

/// `POST /peers` with `{"url": "..."}`: 201 when added, 200 when already
/// there.
#[utoipa::path(
    post,
    path = "/peers",
    tag = "peers",
    summary = "Start syncing with a peer",
    request_body(content = PeerBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Added; the node dials it.", body = PeerAddedJson,
            links(("remove_peer" = (operation_id = "remove_peer",
                request_body = json!({"url": "$response.body#/url"}),
                description = "Stop syncing with it.")))),
        (status = 200, description = "It was already a peer.", body = PeerAddedJson),
        (status = 400, description = "`bad_body` or `bad_peer_url` (not `http://host[:port]`).",
            body = ErrorJson),
    )
)]
pub async fn add_peer(
    State(state): Shared,
    body: Bytes,
) -> Result<(StatusCode, Json<PeerAddedJson>), ApiError> {
    let body = peer_body(&body)?;
    let (url, added) = state.peers.add(&body.url).map_err(|error| {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_peer_url", error.to_string())
    })?;
    let status = if added {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(PeerAddedJson { url, added })))
}

/// `DELETE /peers` with `{"url": "..."}`.
#[utoipa::path(
    delete,
    path = "/peers",
    tag = "peers",
    summary = "Stop syncing with a peer",
    request_body(content = PeerBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Removed: its session ended.", body = PeerRemovedJson),
        (status = 400, description = "`bad_body` or `bad_peer_url` (not `http://host[:port]`: \
            no peer can have it).", body = ErrorJson),
        (status = 404, description = "`unknown_peer`.", body = ErrorJson),
    )
)]
pub async fn remove_peer(
    State(state): Shared,
    body: Bytes,
) -> Result<Json<PeerRemovedJson>, ApiError> {
    let body = peer_body(&body)?;
    let removed = state.peers.remove(&body.url).map_err(|error| {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_peer_url", error.to_string())
    })?;
    if removed {
        Ok(Json(PeerRemovedJson {
            url: body.url,
            removed: true,
        }))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_peer",
            format!("{} is not a peer of this node", body.url),
        ))
    }
}

/// `GET /sync` with `Connection: Upgrade` and `Upgrade: meshlog-sync`:
/// answers `101 Switching Protocols`, then runs a sync session over the
/// connection.
#[utoipa::path(
    get,
    path = "/sync",
    tag = "sync",
    summary = "The peer link: upgrade to the sync protocol",
    description = "With `Connection: upgrade` and `Upgrade: meshlog-sync` the node answers `101` \
        and the connection carries the sync protocol's frames (`docs/PROTOCOL.md`). Nodes dial \
        it; it is not for clients. With peer secrets, the upgrade carries the peer handshake \
        (`docs/SECURITY.md`, \"Peer links\"): the dialer's key id and nonce here, the node's \
        nonce and proof in the `101`, the dialer's proof as the first 32 bytes after it.",
    params(
        ("meshlog-peer-key" = Option<String>, Header,
            description = "Which peer secret the dialer proves (16 hex digits)."),
        ("meshlog-peer-nonce" = Option<String>, Header,
            description = "The dialer's 32-byte nonce, base64url."),
    ),
    responses(
        (status = 101, description = "Switching to the sync protocol.",
            headers(("connection" = String, description = "`upgrade`"),
                ("upgrade" = String, description = "`meshlog-sync`"))),
        (status = 401, description = "`peer_unauthorized`: the node has peer secrets and the \
            upgrade names none of them.", body = ErrorJson),
        (status = 403, description = "`peer_certificate_required`: a TLS node with a CA, and \
            the connection showed no client certificate that chains to it.", body = ErrorJson),
        (status = 426, description = "`upgrade_required`: the upgrade headers are missing.",
            body = ErrorJson),
        (status = 500, description = "`internal`: this connection cannot be upgraded.",
            body = ErrorJson),
        (status = 503, description = "`too_many_sessions` (the node runs \
            `inbound_sessions_max` inbound sessions, default 64) or `too_many_connections`.",
            body = ErrorJson),
    )
)]
pub async fn sync_upgrade(State(state): Shared, mut request: Request) -> Response {
    if !asks_sync_upgrade(request.headers()) {
        return ApiError::upgrade_required(
            "/sync",
            format_args!("takes `Connection: Upgrade` and `Upgrade: {SYNC_PROTOCOL}`"),
        )
        .into_response();
    }
    let Some(on_upgrade) = request
        .extensions_mut()
        .remove::<hyper::upgrade::OnUpgrade>()
    else {
        return ApiError::internal("this connection cannot be upgraded").into_response();
    };
    let info = request
        .extensions()
        .get::<super::state::ConnInfo>()
        .cloned();
    let remote = info
        .as_ref()
        .map(|info| info.remote)
        .unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
    let handshake = match admit_peer(&state, request.headers(), info.as_ref(), remote) {
        Ok(handshake) => handshake,
        Err(refused) => return *refused,
    };
    let Some(permit) = state.peers.inbound_permit() else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_sessions",
            "this node runs as many inbound sync sessions as it accepts",
        )
        .into_response();
    };
    let answer = handshake.as_ref().map(|acceptor| acceptor.answer());
    let peers = state.peers.clone();
    let proof_timeout = state.limits.request_read_timeout;
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => peers.run_inbound(
                TokioIo::new(upgraded),
                remote,
                permit,
                handshake,
                proof_timeout,
            ),
            Err(error) => tracing::debug!(%error, "sync upgrade failed"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, HeaderValue::from_static(SYNC_PROTOCOL));
    for (name, value) in answer.into_iter().flatten() {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    response
}

/// Whether a request asks for the sync upgrade: `Connection: Upgrade` and
/// `Upgrade: meshlog-sync`.
fn asks_sync_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    let protocol_ok = headers
        .get(UPGRADE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim().eq_ignore_ascii_case(SYNC_PROTOCOL));
    connection_upgrade && protocol_ok
}

/// Whether a sync upgrade from `remote` may proceed: its client
/// certificate where the node needs one, and the start of the peers'
/// challenge-response where the node has peer secrets (`None`: it has
/// none). `Err`: the refusal to answer.
fn admit_peer(
    state: &AppState,
    headers: &HeaderMap,
    info: Option<&super::state::ConnInfo>,
    remote: std::net::SocketAddr,
) -> Result<Option<crate::peer_auth::Acceptor>, Box<Response>> {
    if state.tls.peers_need_certificate && !info.is_some_and(|i| i.client_certificate) {
        state.metrics.peer_auth_refused.inc();
        tracing::warn!(%remote, "sync upgrade refused: no client certificate chaining to the CA");
        return Err(Box::new(
            ApiError::new(
                StatusCode::FORBIDDEN,
                "peer_certificate_required",
                "a sync link needs a client certificate that chains to this node's CA",
            )
            .into_response(),
        ));
    }
    let keys = state.auth.peer_keys();
    if keys.is_empty() {
        return Ok(None);
    }
    match crate::peer_auth::Acceptor::start(&keys, headers) {
        Ok(acceptor) => Ok(Some(acceptor)),
        Err(reason) => {
            state.metrics.peer_auth_refused.inc();
            tracing::warn!(%remote, %reason, "sync upgrade refused");
            let mut response = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "peer_unauthorized",
                format!("the sync link is not authenticated: {reason}"),
            )
            .into_response();
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("MeshlogPeer"),
            );
            Err(Box::new(response))
        }
    }
}
