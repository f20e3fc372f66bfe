//! Live follow over WebSocket (`GET /follow`, `docs/PROTOCOL.md`, "Follow"):
//! the node pushes every event a follower's cursor does not cover, each
//! frame naming the cursor it extends, and the follower refetches any gap
//! from its own cursor over `GET /events`.
//!
//! # Layout
//!
//! - [`frame`]: the JSON frames, both directions, and [`FollowStream`]
//!   (`all`, `writer:<id>`, `status`).
//! - `hub`: what every follow connection shares (limits, permits, the
//!   change watch) and the frames encoded once for every follower at the
//!   same cursor.
//! - `server`: the `GET /follow` upgrade and three tasks per connection
//!   (a pump woken by the replica's change watch, a socket writer behind a
//!   bounded queue, a reader of the follower's requests); the node-wide
//!   subscription bound, and the hub's frames encoded once for every
//!   follower at the same cursor.
//! - [`client`]: [`Follower`], a `Stream` of [`FollowItem`]s that yields
//!   every event once, keeps the cursor to persist, detects and refetches
//!   gaps, and fails over between nodes.
//! - `status`: the status stream's frame, built in one place (marks,
//!   floor, digest, peers; every link's state, lag and freshness; every
//!   writer's head, floor and last event time; the rate counters).
//! - `GET /`: the console, a static page with no build step
//!   (`console.html`, `console.css`, `console.js`, joined into one
//!   response): it follows the whole log and the status stream in a
//!   browser, with the same gap rule, and draws the mesh, the writers and
//!   the rates from the status frames (`docs/OPERATIONS.md`, "The
//!   console").

pub mod client;
pub mod frame;
mod hub;
mod server;
mod status;

pub use client::{FollowError, FollowItem, Follower, FollowerConfig};
pub use frame::{ClientFrame, FollowStream, LinkJson, ServerFrame, StatusJson, WriterJson};
pub(crate) use hub::FollowHub;
pub(crate) use server::follow_upgrade;

/// The page `GET /` serves: the console's markup, style and script in one
/// response, so that it fetches nothing else.
pub const PAGE_HTML: &str = concat!(
    "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
    "<title>meshlog console</title>\n<style>\n",
    include_str!("console.css"),
    "</style>\n</head>\n<body>\n",
    include_str!("console.html"),
    "<script>\n",
    include_str!("console.js"),
    "</script>\n</body>\n</html>\n",
);

/// `GET /`: the console.
pub(crate) async fn page() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE_HTML,
    )
        .into_response()
}
