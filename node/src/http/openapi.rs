//! The API's OpenAPI 3.1 document, generated from the code: each handler's
//! `#[utoipa::path]` says its parameters, bodies and the statuses it
//! answers; the JSON types' `ToSchema` say their shapes; [`Contract`]
//! adds what every route shares (the statuses the request-reading
//! middleware and the accept loop answer before any handler runs) and
//! which role each route needs.
//!
//! `GET /openapi.json` serves [`document`]; `docs/openapi.json` is the
//! same text, committed (`meshlog openapi > docs/openapi.json`), and
//! `node/tests/openapi.rs` fails when the two differ.
//!
//! Roles: bearer secrets come in three roles, `read`, `write` and `admin`
//! (issue 10). The document declares the `bearer` scheme and, per
//! operation, the role it needs (`crate::auth::need`) with its `401` and `403`; the
//! node that checks them is built apart from this document.

use utoipa::openapi::path::Operation;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required};
use utoipa::{Modify, OpenApi};

use super::handlers;
use super::json;

/// The whole document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "meshlog node",
        description = "One durable replica of a meshlog event log, served over HTTP and JSON; \
            peers sync over an upgrade of the same port. Pages are read with a version-vector \
            cursor token that is valid on every node of the mesh. `docs/HTTP.md` is the prose \
            contract, with examples replayed by the tests.\n\nEvery error is \
            `{\"error\": CODE, \"message\": TEXT}`, sometimes with fields that say what to do. \
            Two answers come from the HTTP layer before any route and carry no JSON: a request \
            that is not HTTP/1.1 gets `400` and the connection closed, a request head larger \
            than about 400 KB gets `431`. An unknown route is `404 not_found`; a known route \
            with another method is `405 method_not_allowed`.",
        license(name = "MIT OR Apache-2.0", identifier = "MIT OR Apache-2.0"),
    ),
    paths(
        handlers::get_events,
        handlers::post_events,
        handlers::query_events,
        handlers::marks,
        handlers::forks,
        super::checkpoints::get_checkpoint,
        handlers::health,
        handlers::metrics,
        handlers::compact,
        super::statements::get_compaction,
        super::statements::post_compaction,
        handlers::verify,
        handlers::list_peers,
        handlers::add_peer,
        handlers::remove_peer,
        handlers::sync_upgrade,
        append_socket,
        follow,
        page,
        openapi_json,
    ),
    components(schemas(json::AppendBatchJson, json::RawPayload, json::VectorSchema)),
    tags(
        (name = "events", description = "Append and page the log."),
        (name = "node", description = "The node's state, health, metrics and compaction."),
        (name = "peers", description = "The peers this node dials."),
        (name = "sync", description = "Peer links."),
        (name = "follow", description = "Live events over WebSocket, and the page that shows them."),
    ),
    modifiers(&Contract),
)]
struct ApiDoc;

/// The role an operation needs, from the one table the node enforces
/// (`crate::auth::need`); `None` for open routes and for `GET /sync`, the
/// peer link, whose peers prove who they are in the upgrade's handshake.
fn role_of(method: &str, path: &str) -> Option<&'static str> {
    let method = axum::http::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).ok()?;
    match crate::auth::need(&method, path) {
        crate::auth::Need::Role(role) => Some(role.name()),
        crate::auth::Need::Open | crate::auth::Need::Peer => None,
    }
}

/// The document as served and committed: pretty JSON, one trailing
/// newline.
pub fn document() -> String {
    let mut value = serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document is JSON");
    spell_formats(&mut value);
    let mut text = serde_json::to_string_pretty(&value).expect("JSON is JSON");
    text.push('\n');
    text
}

/// utoipa spells its unsigned formats in kebab case (`u-int64`); the
/// format registry's name is `uint64`, which says a u64's range (`int64`
/// would say 2^63 - 1 is the largest value).
fn spell_formats(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                match child {
                    serde_json::Value::String(format) if key == "format" => {
                        if let Some(bits) = format.strip_prefix("u-int") {
                            *format = format!("uint{bits}");
                        }
                    }
                    child => spell_formats(child),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(spell_formats),
        _ => {}
    }
}

/// `GET /openapi.json`.
pub(crate) async fn serve_document() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        document(),
    )
        .into_response()
}

/// What every operation shares, added after the handlers' own answers.
struct Contract;

/// A response whose body is [`json::ErrorJson`].
fn error_response(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(RefOr::Ref(Ref::from_schema_name("ErrorJson"))))
                .build(),
        )
        .build()
}

/// The shared responses: `(component name, status, description)`.
const SHARED: [(&str, &str, &str); 6] = [
    (
        "Unauthorized",
        "401",
        "`unauthorized`: no bearer secret, or one the node does not know.",
    ),
    (
        "Forbidden",
        "403",
        "`forbidden`: the secret's role does not allow this route.",
    ),
    (
        "RequestTimeout",
        "408",
        "`request_timeout`: the request body did not arrive within the read timeout \
         (`request_read_timeout_ms`, default 10 s).",
    ),
    (
        "BodyTooLarge",
        "413",
        "`body_too_large`: the body exceeds `body_bytes_max` (default 4 MiB); `limit` says it.",
    ),
    (
        "TooManyConnections",
        "503",
        "`too_many_connections`: the node serves `connections_max` connections (default 256), \
         and `connections_per_ip_max` from one address (default 64); answered with \
         `retry-after: 1` before the request is read.",
    ),
    (
        "HeadTooLarge",
        "431",
        "The request head exceeds `header_bytes_max` (default 16 KiB) or `headers_max` \
         headers (default 64); answered by the HTTP layer, with no body, and the connection \
         closed.",
    ),
];

fn shared_ref(name: &str) -> RefOr<Response> {
    RefOr::Ref(Ref::new(format!("#/components/responses/{name}")))
}

fn operations(item: &mut utoipa::openapi::path::PathItem) -> Vec<(&'static str, &mut Operation)> {
    [
        ("get", item.get.as_mut()),
        ("post", item.post.as_mut()),
        ("delete", item.delete.as_mut()),
    ]
    .into_iter()
    .filter_map(|(method, operation)| operation.map(|operation| (method, operation)))
    .collect()
}

/// The operations whose body may be left out: `POST /events` (an absent
/// body is one empty payload) and `POST /compact` (an absent body is `{}`).
const OPTIONAL_BODIES: [(&str, &str); 2] = [("post", "/events"), ("post", "/compact")];

/// A `limit` query parameter's maximum and description, from the one
/// bound the replica keeps ([`json::PAGE_LEN_MAX`]): a schema attribute
/// takes only a literal, so the number is not written there.
fn bound_page_limit(operation: &mut Operation) {
    for parameter in operation.parameters.iter_mut().flatten() {
        let RefOr::T(parameter) = parameter else {
            continue;
        };
        if parameter.name != "limit" {
            continue;
        }
        let mut value = serde_json::to_value(&*parameter).expect("a parameter is JSON");
        value["schema"]["maximum"] = json::PAGE_LEN_MAX.into();
        value["description"] =
            format!("Events per page, 1 to {}; default 100.", json::PAGE_LEN_MAX).into();
        *parameter = serde_json::from_value(value).expect("the parameter still parses");
    }
}

impl Modify for Contract {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.security_schemes.insert(
            "bearer".into(),
            RefOr::T(SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "`Authorization: Bearer <secret>`. Each secret has a role, `read` \
                         (pages, follow, marks), `write` (append) or `admin` (compaction, \
                         peers); an operation's security requirement names the role it needs.",
                    ))
                    .build(),
            )),
        );
        for (name, status, description) in SHARED {
            let response = if status == "431" {
                ResponseBuilder::new().description(description).build()
            } else {
                error_response(description)
            };
            components.responses.insert(name.into(), RefOr::T(response));
        }
        for (path, item) in openapi.paths.paths.iter_mut() {
            for (method, operation) in operations(item) {
                bound_page_limit(operation);
                if OPTIONAL_BODIES.contains(&(method, path.as_str())) {
                    if let Some(RefOr::T(body)) = operation.request_body.as_mut() {
                        body.required = Some(Required::False);
                    }
                }
                let responses = &mut operation.responses.responses;
                // The request-reading middleware and the accept loop answer
                // these on every route, before its handler runs; a route's
                // own 413 or 503 already names them.
                for (name, status, _) in &SHARED[2..] {
                    responses
                        .entry((*status).into())
                        .or_insert_with(|| shared_ref(name));
                }
                if let Some(role) = role_of(method, path) {
                    operation.security = Some(vec![SecurityRequirement::new("bearer", [role])]);
                    for (name, status, _) in &SHARED[..2] {
                        responses.insert((*status).into(), shared_ref(name));
                    }
                }
            }
        }
    }
}

// `GET /follow` and `GET /` are served by the `follow` module; their
// contract is written here, beside the rest, on functions that exist only
// to carry it.

/// `GET /follow`.
#[utoipa::path(
    get,
    path = "/follow",
    tag = "follow",
    summary = "Follow live events over WebSocket",
    description = "A WebSocket upgrade (`Connection: upgrade`, `Upgrade: websocket`, \
        `Sec-WebSocket-Version: 13`, `Sec-WebSocket-Key`) that pushes every event the cursor \
        `after` does not cover, as they are committed. The request is checked before the \
        upgrade; the frames, and the errors that come as frames once upgraded (`stale`, \
        `lagged`), are in `docs/PROTOCOL.md`, \"Follow\".",
    params(
        ("stream" = Option<String>, Query, pattern = r"^(all|status|writer:0*[1-9][0-9]{0,19})$",
            description = "`all` (the default: the whole log), `writer:<decimal id>` (one \
                writer) or `status` (the node's marks, floor, digest and peers, pushed)."),
        ("after" = Option<String>, Query, pattern = r"^(?:[0-9]*|A[A-Za-z0-9_-]*)$",
            description = "The token to follow from, as `GET /events` takes it (either \
                version; a checkpoint this node lacks is fetched from its peers first); absent: \
                the start."),
        ("tokens" = Option<String>, Query, pattern = r"^(short|v1)$",
            description = "`v1` (the default): every frame's tokens are version 1. `short`: \
                the shortest the node writes, version 2 where shorter (`docs/TOKEN.md`), for a \
                follower that expands them (`GET /checkpoint`). A stale frame's `resume` is \
                version 1 either way."),
        ("access_token" = Option<String>, Query,
            description = "A `read` secret, for clients that cannot set an `Authorization` \
                header on a WebSocket (browsers); only this route takes it."),
    ),
    responses(
        (status = 101, description = "Switching to WebSocket; the frames follow.",
            headers(("connection" = String, description = "`upgrade`"),
                ("upgrade" = String, description = "`websocket`"),
                ("sec-websocket-accept" = String))),
        (status = 400, description = "`bad_stream`, `bad_token` or `bad_query`.",
            body = json::ErrorJson),
        (status = 409, description = "`unknown_checkpoint`: the token is relative to a \
            checkpoint this node does not keep and no peer sent, as on `GET /events`.",
            body = json::ErrorJson),
        (status = 426, description = "`upgrade_required`: not a WebSocket upgrade.",
            body = json::ErrorJson),
        (status = 503, description = "`too_many_followers` (more than `followers_max` \
            subscriptions) or `too_many_connections`.", body = json::ErrorJson),
    )
)]
#[allow(dead_code)]
fn follow() {}

/// `GET /events/append`.
#[utoipa::path(
    get,
    path = "/events/append",
    tag = "events",
    summary = "Stream appends over WebSocket, answered in order by seq range",
    description = "A WebSocket upgrade (`Connection: upgrade`, `Upgrade: websocket`, \
        `Sec-WebSocket-Version: 13`, `Sec-WebSocket-Key`) for clients that pipeline appends. \
        Each message the client sends is one append: a binary message is one event (its bytes \
        the payload), a text message a batch (the `application/json` body `POST /events` \
        takes; one commit, all or nothing). The node's first message names the stream, once \
        (`{\"stream\":\"<id>\"}`); then each message is answered, in the order sent, by one \
        text message once its commit is durable: `{\"seq\":[first,last],\"lamport\":[first,last]}` \
        (`AppendCompactJson` without the stream). A socket idle for `append_idle_timeout_ms` \
        is closed (1001, `idle_timeout`). A refused message (`bad_body`, `payload_too_large`, \
        `message_too_large` over `body_bytes_max`) is answered by `ErrorJson`, then a close \
        whose reason is the code. At most 64 messages are read and not yet answered; the node \
        reads no further until one is. The messages, byte for byte, are in `docs/HTTP.md`.",
    responses(
        (status = 101, description = "Switching to WebSocket; the appends follow.",
            headers(("connection" = String, description = "`upgrade`"),
                ("upgrade" = String, description = "`websocket`"),
                ("sec-websocket-accept" = String))),
        (status = 426, description = "`upgrade_required`: not a WebSocket upgrade.",
            body = json::ErrorJson),
        (status = 503, description = "`too_many_connections`.", body = json::ErrorJson),
    )
)]
#[allow(dead_code)]
fn append_socket() {}

/// `GET /`.
#[utoipa::path(
    get,
    path = "/",
    tag = "follow",
    summary = "The console",
    description = "The mesh console: one HTML page with its style and script (no build step, \
        nothing fetched from elsewhere) that follows the whole log live over `GET /follow` \
        and draws the status stream: the mesh (links, their state, lag and last exchange), \
        the writers, the rates; it pages history over `GET /events`. Its script reads \
        `?gap_ms=N`, how long a heartbeat may stay ahead of the cursor before it refetches \
        (default 3000); the node serves the same page whatever the query.",
    responses((status = 200, description = "The page.", content_type = "text/html",
        body = String)),
)]
#[allow(dead_code)]
fn page() {}

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "node",
    summary = "This document",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API.",
        content_type = "application/json", body = Object)),
)]
#[allow(dead_code)]
fn openapi_json() {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page bound is written once, in the replica: the document's
    /// `limit` (query parameter and body field, number and text) says the
    /// replica's default `page_len_max`, and no other number.
    #[test]
    fn the_documented_page_bound_is_the_replicas() {
        let max = meshlog_replica::Config::new(meshlog_cursor::StreamId::new(1)).page_len_max;
        let doc: serde_json::Value = serde_json::from_str(&document()).unwrap();
        let limit = doc["paths"]["/events"]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "limit")
            .unwrap();
        assert_eq!(limit["schema"]["maximum"], max);
        assert!(limit["description"]
            .as_str()
            .unwrap()
            .contains(&format!("1 to {max};")));
        let text = document();
        let body = text
            .find("The page length, 1 to")
            .expect("the body's limit");
        assert!(text[body..].starts_with(&format!("The page length, 1 to {max} ")));
        let pattern = regex::Regex::new(&json::limit_text_pattern()).unwrap();
        for (n, ok) in [
            ("0", false),
            ("1", true),
            ("007", true),
            (&*max.to_string(), true),
            (&*(max - 1).to_string(), true),
            (&*(max + 1).to_string(), false),
            (&*(max * 10).to_string(), false),
        ] {
            assert_eq!(pattern.is_match(n), ok, "{n}");
        }
    }

    #[test]
    fn the_documented_append_pipeline_bound_is_the_sockets() {
        assert!(document().contains(&format!(
            "At most {} messages are read and not yet answered",
            super::super::APPENDS_IN_FLIGHT_MAX
        )));
    }

    #[test]
    fn the_documented_token_bound_is_the_codecs() {
        let doc = document();
        assert!(doc.contains(&format!(
            "\"maxLength\": {}",
            meshlog_cursor::token::TOKEN_TEXT_MAX
        )));
    }

    #[test]
    fn every_guarded_route_of_the_auth_table_is_in_the_document() {
        let doc = ApiDoc::openapi();
        for (method, path) in [
            ("get", "/events"),
            ("post", "/events/query"),
            ("get", "/marks"),
            ("get", "/forks"),
            ("get", "/follow"),
            ("post", "/events"),
            ("get", "/events/append"),
            ("post", "/compact"),
            ("post", "/verify"),
            ("get", "/peers"),
            ("post", "/peers"),
            ("delete", "/peers"),
        ] {
            assert!(role_of(method, path).is_some(), "{method} {path} is open");
            let item = doc.paths.paths.get(path).expect(path);
            let found = operations(&mut item.clone())
                .iter()
                .any(|(m, _)| *m == method);
            assert!(found, "{method} {path} is not documented");
        }
    }
}
