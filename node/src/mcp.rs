//! `meshlog mcp --node URL`: the Model Context Protocol on stdio, so that an
//! agent pages, follows and appends to a node's log with the same cursor as
//! every other surface (the text token of `GET /events`).
//!
//! It is a client of the node's HTTP API through the node's one HTTP client
//! (`http://`, or `https://` with `--ca`): it never opens a data
//! directory. Tools:
//!
//! - `page_events {after?, limit?}`: one page (`POST /events/query`), with
//!   the token to pass as the next `after`;
//! - `follow_events {after?, limit?, wait_ms?}`: waits up to `wait_ms`
//!   (at most [`FOLLOW_WAIT_MS_MAX`]) for events past `after`, then answers
//!   them like `page_events` (an empty page with the same token when none
//!   came). It waits on the node's push channel (`GET /follow`, through
//!   the [`Follower`](crate::follow::Follower)), never by polling: the
//!   first event pushed ends the wait;
//! - `append_events {payloads}`: appends UTF-8 payloads in one durable
//!   commit (`POST /events`);
//! - `read_marks {}`: the node's marks, floor, digest, chain heads and peers
//!   (`GET /marks`).
//!
//! A node's error (a stale token, a malformed one, a limit) comes back as a
//! tool error whose text is the node's JSON error body, so the agent sees
//! the same `error` code, message, lost ranges and resume token as any
//! other client.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use reqwest::Method;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::client::{build, describe, parse_url, trust, ClientError, ClientOptions};
use crate::follow::{FollowItem, FollowStream, Follower, FollowerConfig};

/// The longest a `follow_events` call waits for new events.
pub const FOLLOW_WAIT_MS_MAX: u32 = 30_000;
/// The largest response body the client reads from the node.
const RESPONSE_BYTES_MAX: usize = 64 << 20;

/// Arguments of `meshlog mcp`.
#[derive(Debug, clap::Args)]
pub struct McpArgs {
    /// The node's base URL.
    #[arg(long, env = "MESHLOG_NODE", default_value = "http://127.0.0.1:7070")]
    pub node: String,
    /// A bearer secret for a node that needs one: `read` to page and
    /// follow, `write` to append (`docs/SECURITY.md`).
    #[arg(long, env = "MESHLOG_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The CA (PEM) an `https://` node's certificate chains to.
    #[arg(long, env = "MESHLOG_CA")]
    pub ca: Option<std::path::PathBuf>,
}

/// Serves MCP on stdin/stdout until the client closes it.
pub fn run(args: McpArgs) -> ExitCode {
    let options = ClientOptions {
        token: args.token,
        ca: args.ca,
    };
    let node = match NodeClient::new(&args.node, &options) {
        Ok(node) => node,
        Err(error) => {
            eprintln!("meshlog mcp: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("meshlog mcp: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(async {
        let service = MeshlogMcp::new(node)
            .serve(rmcp::transport::stdio())
            .await?;
        service.waiting().await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("meshlog mcp: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The arguments of `page_events`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PageRequest {
    /// The text token to resume after: the `next` of the previous page (the
    /// same token `GET /events?after=` and the CLI take). Absent or null:
    /// the start of the log.
    #[serde(default)]
    pub after: Option<String>,
    /// The most events to return, 1 to 10,000; 100 when absent.
    #[serde(default)]
    pub limit: Option<u32>,
}

/// The arguments of `follow_events`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct FollowRequest {
    /// The text token to follow from (the `next` of the previous answer).
    /// Absent or null: the start of the log.
    #[serde(default)]
    pub after: Option<String>,
    /// The most events to return, 1 to 10,000; 100 when absent.
    #[serde(default)]
    pub limit: Option<u32>,
    /// How long to wait for events past `after`, in milliseconds; at most
    /// 30,000; 5,000 when absent.
    #[serde(default)]
    pub wait_ms: Option<u32>,
}

/// The arguments of `append_events`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct AppendRequest {
    /// The payloads to append, as UTF-8 text, in one durable commit (all
    /// or none).
    pub payloads: Vec<String>,
}

/// The MCP server: a client of one node's HTTP API.
#[derive(Debug, Clone)]
pub struct MeshlogMcp {
    node: NodeClient,
    #[expect(dead_code, reason = "read by the code #[tool_handler] generates")]
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl MeshlogMcp {
    /// A server talking to `node`.
    pub fn new(node: NodeClient) -> Self {
        MeshlogMcp {
            node,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(
        description = "Read one page of the node's event log after a cursor token. Returns {events, next, at_head, behind}: pass `next` as `after` to continue; every event comes exactly once across pages, also on another node of the mesh. A stale token is answered with the exact ranges lost and a `resume` token."
    )]
    async fn page_events(
        &self,
        Parameters(request): Parameters<PageRequest>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(answer(self.node.page(request.after, request.limit).await))
    }

    #[tool(
        description = "Wait up to wait_ms (max 30000) for events after a cursor token, then return them like page_events (an empty page with the same `next` if none arrived)."
    )]
    async fn follow_events(
        &self,
        Parameters(request): Parameters<FollowRequest>,
    ) -> Result<CallToolResult, ErrorData> {
        let wait_ms = request.wait_ms.unwrap_or(5_000).min(FOLLOW_WAIT_MS_MAX);
        let page = self.node.page(request.after.clone(), request.limit).await;
        let next = match &page {
            Ok(body) if body["events"].as_array().is_some_and(Vec::is_empty) => {
                body["next"].as_str().unwrap_or_default().to_owned()
            }
            // Events, or the node's error: answered at once.
            _ => return Ok(answer(page)),
        };
        let wait = Duration::from_millis(u64::from(wait_ms));
        if self.node.pushed_past(&next, wait).await {
            return Ok(answer(self.node.page(request.after, request.limit).await));
        }
        Ok(answer(page))
    }

    #[tool(
        description = "Append UTF-8 payloads to the node's own stream in one durable commit. Returns each event's stream, seq and lamport."
    )]
    async fn append_events(
        &self,
        Parameters(request): Parameters<AppendRequest>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(answer(self.node.append(request.payloads).await))
    }

    #[tool(
        description = "Read the node's marks (per writer stream, the last seq held), floor, digest, chain heads (per stream its head and chain hash, and one hash over them: equal on nodes that hold the same heads, whatever each compacted), its own stream and its peers' state, and the marks as a token."
    )]
    async fn read_marks(&self) -> Result<CallToolResult, ErrorData> {
        Ok(answer(self.node.marks().await))
    }
}

#[tool_handler]
impl ServerHandler for MeshlogMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "meshlog: a replicated event log. Page with page_events, passing each answer's \
             `next` as the following `after`; the token works on every node of the mesh and \
             never skips an event (a stale one is reported with what was lost).",
        )
    }
}

/// A tool's answer: the node's JSON body, or a tool error carrying the
/// node's error body (or why the node could not be asked).
fn answer(result: Result<Value, NodeError>) -> CallToolResult {
    match result {
        Ok(body) => CallToolResult::success(vec![ContentBlock::text(body.to_string())]),
        Err(error) => CallToolResult::error(vec![ContentBlock::text(error.to_string())]),
    }
}

/// Why a request to the node failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The node answered with an error status; the body is its JSON error
    /// (`{"error": code, "message", ...}`).
    #[error("{body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The node's error body.
        body: Value,
    },
    /// The node could not be reached or answered something unreadable.
    #[error("{{\"error\":\"node_unreachable\",\"message\":{}}}", Value::String(.0.clone()))]
    Unreachable(String),
}

/// A client of one node's HTTP API (`http://`, or `https://` with a CA),
/// that hands back its JSON bodies as they are.
#[derive(Debug, Clone)]
pub struct NodeClient {
    base: String,
    http: reqwest::Client,
    /// What the follower needs to reach the node's push channel.
    token: Option<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl NodeClient {
    /// A client of the node at `url` (`http://host:port` or
    /// `https://host:port`), with the secret and the CA of `options`.
    pub fn new(url: &str, options: &ClientOptions) -> Result<NodeClient, ClientError> {
        let node = parse_url(url)?;
        let tls = trust(&node, options)?;
        let http = build(&node, options.token.as_deref(), tls.clone())?;
        Ok(NodeClient {
            base: node.base,
            http,
            token: options.token.clone(),
            tls,
        })
    }

    /// Follows the node from `after` (a token) on its push channel until it
    /// pushes something past it (an event; or a lagged or stale answer,
    /// which a page then reports), at most `wait`. `false` when nothing
    /// came (or the follow could not start: the page already answered).
    async fn pushed_past(&self, after: &str, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        // Either version: a version-2 token is expanded with its
        // checkpoint, asked of the node (the follower needs the vector).
        let client =
            crate::client::Client::with_tls(&self.base, self.token.as_deref(), self.tls.clone());
        let Ok(client) = client else {
            return false;
        };
        let Ok(Ok(after)) = tokio::time::timeout_at(deadline, client.cursor(after)).await else {
            return false;
        };
        let mut config = FollowerConfig::new(vec![self.base.clone()], FollowStream::All);
        config.after = after;
        config.token = self.token.clone();
        config.tls = self.tls.clone();
        let Ok(mut follower) = Follower::start(config) else {
            return false;
        };
        let pushed = async {
            while let Some(item) = follower.next().await {
                if let FollowItem::Event(_) | FollowItem::Lagged { .. } | FollowItem::Stale { .. } =
                    item
                {
                    return true;
                }
            }
            false
        };
        tokio::time::timeout_at(deadline, pushed)
            .await
            .unwrap_or(false)
    }

    async fn page(&self, after: Option<String>, limit: Option<u32>) -> Result<Value, NodeError> {
        let mut query = json!({ "after": after });
        if let Some(limit) = limit {
            query["limit"] = json!(limit);
        }
        self.call(Method::POST, "/events/query", Some(query)).await
    }

    async fn append(&self, payloads: Vec<String>) -> Result<Value, NodeError> {
        self.call(Method::POST, "/events", Some(json!(payloads)))
            .await
    }

    async fn marks(&self) -> Result<Value, NodeError> {
        self.call(Method::GET, "/marks", None).await
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, NodeError> {
        let unreachable = |what: &str, error: &dyn std::fmt::Display| {
            NodeError::Unreachable(format!("{what} {}: {error}", self.base))
        };
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        // (The client's own timeout bounds the whole exchange.)
        let mut response = request
            .send()
            .await
            .map_err(|error| unreachable("request failed to", &describe(&error)))?;
        let status = response.status();
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| unreachable("cannot read the answer of", &describe(&error)))?
        {
            if bytes.len() + chunk.len() > RESPONSE_BYTES_MAX {
                return Err(unreachable(
                    "an answer over the limit from",
                    &format!("more than {RESPONSE_BYTES_MAX} bytes"),
                ));
            }
            bytes.extend_from_slice(&chunk);
        }
        let body: Value = serde_json::from_slice(&bytes)
            .map_err(|error| unreachable("unreadable JSON from", &error))?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(NodeError::Status {
                status: status.as_u16(),
                body,
            })
        }
    }
}
