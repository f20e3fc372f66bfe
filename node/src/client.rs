//! A typed HTTP client of one node: the calls the CLI and the demo make,
//! each answering the API's JSON (`docs/HTTP.md`) as the very types the
//! server writes (`meshlog_node::http::json`).
//!
//! It speaks HTTP only: it never opens a data directory, so it works the
//! same against a node on this machine or another.

use std::sync::Arc;
use std::time::Duration;

use meshlog_cursor::token::{self, Token};
use meshlog_cursor::{Checkpoint, CheckpointName, StreamId, VersionVector};
use serde_json::json;

use crate::http::json::{AppendCompactJson, PageCompactJson, Representation, COMPACT_MEDIA_TYPE};
use crate::url::NodeUrl;

pub use crate::http::json::{
    AppendJson, AppendedJson, CheckpointJson, CompactedJson, CompactionJson, ErrorJson, EventJson,
    InboundJson, LostJson, MarksJson, PageJson, PeerAddedJson, PeerJson, PeerRemovedJson,
    PeersJson, StaleJson, StatementTakenJson, VectorJson, VerifiedJson,
};

/// Tokens longer than this are sent in a `POST /events/query` body rather
/// than a query string: URLs that long are refused by some proxies and
/// servers, and a token of a few hundred streams passes it.
pub const TOKEN_QUERY_MAX: usize = 2_000;

/// The `Accept` of appends and pages: the compact representation first,
/// the default JSON from a node that does not know it.
fn accept_compact() -> String {
    format!("{COMPACT_MEDIA_TYPE}, application/json;q=0.5")
}

/// How long one request may take before the client gives up.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A client of the node at one base URL.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL given for the node names no node (`crate::url`).
    #[error("bad node URL {url:?}: {reason}; expected http://HOST:PORT")]
    BadUrl {
        /// The URL given.
        url: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The node did not answer (refused, timed out, connection lost).
    #[error("cannot reach the node at {url}: {reason}")]
    Unreachable {
        /// The node's URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The node answered with an error.
    #[error("the node at {url} answered {status} {code}: {message}")]
    Api {
        /// The node's URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The API's stable error code (`bad_token`, `bad_limit`, ...).
        code: String,
        /// The node's explanation.
        message: String,
    },
    /// A token's text is no token (neither version decodes it).
    #[error("bad token: {reason}")]
    BadToken {
        /// Why it does not decode.
        reason: String,
    },
    /// The node answered something that is not the API's JSON.
    #[error("the node at {url} answered {status} with an unexpected body: {reason}")]
    BadResponse {
        /// The node's URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// Why the body was not understood.
        reason: String,
    },
}

/// A `410 stale_cursor` answer: the cursor is below the node's compaction
/// floor.
pub type Stale = StaleJson;

/// What a page request answers: a page, or the expected outcome of a stale
/// cursor.
#[derive(Debug, Clone)]
pub enum PageOutcome {
    /// The events after the cursor.
    Page(PageJson),
    /// The cursor is stale.
    Stale(Stale),
}

/// How a [`Client`] reaches a node that needs more than a URL.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// A bearer secret, sent as `Authorization: Bearer` with every request.
    pub token: Option<String>,
    /// The CA (PEM) an `https://` node's certificate chains to.
    pub ca: Option<std::path::PathBuf>,
}

impl Client {
    /// A client of the node at `url` (`http://HOST:PORT`, a trailing `/`
    /// allowed).
    pub fn new(url: &str) -> Result<Client, ClientError> {
        Client::with_options(url, &ClientOptions::default())
    }

    /// A client of the node at `url` with a secret and a CA.
    pub fn with_options(url: &str, options: &ClientOptions) -> Result<Client, ClientError> {
        let (base, http) = http_client(url, options)?;
        Ok(Client { base, http })
    }

    /// A client of the node at `url` with a secret and a TLS client
    /// configuration already built (the follower's).
    pub fn with_tls(
        url: &str,
        token: Option<&str>,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> Result<Client, ClientError> {
        let node = parse_url(url)?;
        let http = build(&node, token, tls)?;
        Ok(Client {
            base: node.base,
            http,
        })
    }

    /// The node's base URL, without a trailing `/`.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// Appends `payloads` as one batch (one durable commit). Asks for the
    /// compact answer (the batch's ranges) and reads either: a node that
    /// does not know it answers the default JSON.
    pub async fn append(&self, payloads: &[String]) -> Result<Vec<AppendedJson>, ClientError> {
        let request = self
            .http
            .post(format!("{}/events", self.base))
            .header(reqwest::header::ACCEPT, accept_compact())
            .json(&payloads);
        let (status, representation, body) = self.send_negotiated(request).await?;
        self.check(status, &body)?;
        let events = match representation {
            Representation::Json => self.parse::<AppendJson>(status, &body)?.events,
            Representation::Compact => self.parse::<AppendCompactJson>(status, &body)?.events(),
        };
        if events.len() != payloads.len() {
            return Err(ClientError::BadResponse {
                url: self.base.clone(),
                status,
                reason: format!(
                    "{} payloads appended, {} events answered",
                    payloads.len(),
                    events.len()
                ),
            });
        }
        Ok(events)
    }

    /// Up to `limit` events after `after` (`None`: from the start). A token
    /// longer than [`TOKEN_QUERY_MAX`] goes in a `POST /events/query` body.
    pub async fn page(
        &self,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<PageOutcome, ClientError> {
        self.page_of(after, limit, None).await
    }

    /// [`Client::page`], of one writer's events alone with `stream`
    /// (`GET /events?stream=`, whatever the token's length: the query body
    /// takes no stream).
    pub async fn page_of(
        &self,
        after: Option<&str>,
        limit: Option<usize>,
        stream: Option<StreamId>,
    ) -> Result<PageOutcome, ClientError> {
        let after = after.filter(|token| !token.is_empty());
        let request =
            if stream.is_none() && after.is_some_and(|token| token.len() > TOKEN_QUERY_MAX) {
                self.http
                    .post(format!("{}/events/query", self.base))
                    .json(&json!({"after": after, "limit": limit}))
            } else {
                // Tokens are URL-safe base64 and limits are digits: nothing to
                // escape.
                let mut url = format!("{}/events", self.base);
                let mut sep = '?';
                if let Some(token) = after {
                    url.push_str(&format!("{sep}after={token}"));
                    sep = '&';
                }
                if let Some(limit) = limit {
                    url.push_str(&format!("{sep}limit={limit}"));
                    sep = '&';
                }
                if let Some(stream) = stream {
                    url.push_str(&format!("{sep}stream={}", stream.get()));
                }
                self.http.get(url)
            };
        let request = request.header(reqwest::header::ACCEPT, accept_compact());
        let (status, representation, body) = self.send_negotiated(request).await?;
        if status == 410 {
            let error: ErrorJson = self.parse(status, &body)?;
            if let Some(stale) = error.stale() {
                return Ok(PageOutcome::Stale(stale));
            }
            return Err(ClientError::BadResponse {
                url: self.base.clone(),
                status,
                reason: "a 410 answer without `lost` and `resume`".into(),
            });
        }
        self.check(status, &body)?;
        let page = match representation {
            Representation::Json => self.parse(status, &body)?,
            Representation::Compact => self
                .parse::<PageCompactJson>(status, &body)?
                .decode()
                .map_err(|error| ClientError::BadResponse {
                    url: self.base.clone(),
                    status,
                    reason: error.to_string(),
                })?,
        };
        Ok(PageOutcome::Page(page))
    }

    /// `GET /marks`.
    pub async fn marks(&self) -> Result<MarksJson, ClientError> {
        self.json(self.http.get(format!("{}/marks", self.base)))
            .await
    }

    /// `GET /metrics`, as text.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let (status, body) = self
            .send(self.http.get(format!("{}/metrics", self.base)))
            .await?;
        String::from_utf8(body).map_err(|error| ClientError::BadResponse {
            url: self.base.clone(),
            status,
            reason: error.to_string(),
        })
    }

    /// `POST /compact`.
    pub async fn compact(
        &self,
        keep_last: Option<u64>,
        keep_ms: Option<u64>,
        ignore_peers: bool,
    ) -> Result<CompactedJson, ClientError> {
        let mut body = serde_json::Map::new();
        if let Some(n) = keep_last {
            body.insert("keep_last".into(), n.into());
        }
        if let Some(n) = keep_ms {
            body.insert("keep_ms".into(), n.into());
        }
        if ignore_peers {
            body.insert("ignore_peers".into(), true.into());
        }
        self.json(
            self.http
                .post(format!("{}/compact", self.base))
                .json(&serde_json::Value::Object(body)),
        )
        .await
    }

    /// `GET /compaction`: what a compaction statement of `stream` at
    /// `floor` commits to, as this node holds the stream.
    pub async fn compaction(
        &self,
        stream: StreamId,
        floor: u64,
    ) -> Result<CompactionJson, ClientError> {
        self.json(self.http.get(format!(
            "{}/compaction?stream={}&floor={floor}",
            self.base,
            stream.get()
        )))
        .await
    }

    /// `GET /checkpoint`: the checkpoint `name`, which the node keeps or
    /// fetches from its peers, its vector checked against the name: a
    /// node cannot hand back another vector under it.
    pub async fn checkpoint(&self, name: CheckpointName) -> Result<Checkpoint, ClientError> {
        let answer: CheckpointJson = self
            .json(
                self.http
                    .get(format!("{}/checkpoint?name={name}", self.base)),
            )
            .await?;
        let bad = |reason: String| ClientError::BadResponse {
            url: self.base.clone(),
            status: 200,
            reason,
        };
        let vector = token::decode_text(&answer.token)
            .map_err(|error| bad(format!("checkpoint {name}: {error}")))?;
        match Checkpoint::new(vector) {
            Ok(checkpoint) if checkpoint.name() == name => Ok(checkpoint),
            _ => Err(bad(format!(
                "checkpoint {name} was answered with a vector of another name"
            ))),
        }
    }

    /// The cursor a token's text stands for, either version: version 1
    /// as it is, version 2 expanded against its checkpoint, asked of the
    /// node ([`Client::checkpoint`]; what a reader holding a token from
    /// another node resumes with).
    pub async fn cursor(&self, text: &str) -> Result<VersionVector, ClientError> {
        let bad = |reason: String| ClientError::BadToken { reason };
        match token::decode_any_text(text).map_err(|error| bad(error.to_string()))? {
            Token::Absolute(vector) => Ok(vector),
            Token::Relative(relative) => {
                let checkpoint = self.checkpoint(relative.checkpoint()).await?;
                relative
                    .expand(&checkpoint)
                    .map_err(|error| bad(error.to_string()))
            }
        }
    }

    /// `POST /compaction`: hands the node a signed compaction statement.
    pub async fn submit_statement(
        &self,
        signed: &meshlog_replica::SignedCompaction,
    ) -> Result<StatementTakenJson, ClientError> {
        let statement = crate::trust::encode_hex(&signed.to_bytes());
        self.json(
            self.http
                .post(format!("{}/compaction", self.base))
                .json(&json!({ "statement": statement })),
        )
        .await
    }

    /// `POST /verify`: the node reads and checks every event it holds.
    pub async fn verify(&self) -> Result<VerifiedJson, ClientError> {
        self.json(self.http.post(format!("{}/verify", self.base)))
            .await
    }

    /// `GET /peers`.
    pub async fn peers(&self) -> Result<PeersJson, ClientError> {
        self.json(self.http.get(format!("{}/peers", self.base)))
            .await
    }

    /// `POST /peers`: starts syncing with `url`.
    pub async fn add_peer(&self, url: &str) -> Result<PeerAddedJson, ClientError> {
        self.json(
            self.http
                .post(format!("{}/peers", self.base))
                .json(&json!({ "url": url })),
        )
        .await
    }

    /// `DELETE /peers`: stops syncing with `url`.
    pub async fn remove_peer(&self, url: &str) -> Result<PeerRemovedJson, ClientError> {
        self.json(
            self.http
                .delete(format!("{}/peers", self.base))
                .json(&json!({ "url": url })),
        )
        .await
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let (status, body) = self.send(request).await?;
        self.parse(status, &body)
    }

    /// Sends, and turns a non-2xx answer into [`ClientError::Api`].
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<(u16, Vec<u8>), ClientError> {
        let (status, body) = self.send_raw(request).await?;
        self.check(status, &body)?;
        Ok((status, body))
    }

    async fn send_raw(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let (status, _, body) = self.send_negotiated(request).await?;
        Ok((status, body))
    }

    /// Sends; the status, the representation the answer's content type
    /// names (compact only for the compact media type) and the body.
    async fn send_negotiated(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(u16, Representation, Vec<u8>), ClientError> {
        let unreachable = |error: reqwest::Error| ClientError::Unreachable {
            url: self.base.clone(),
            reason: describe(&error),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status().as_u16();
        let compact = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .is_some_and(|media| media.trim().eq_ignore_ascii_case(COMPACT_MEDIA_TYPE));
        let representation = if compact {
            Representation::Compact
        } else {
            Representation::Json
        };
        let body = response.bytes().await.map_err(unreachable)?;
        Ok((status, representation, body.to_vec()))
    }

    fn check(&self, status: u16, body: &[u8]) -> Result<(), ClientError> {
        if (200..300).contains(&status) {
            return Ok(());
        }
        Err(match serde_json::from_slice::<ErrorJson>(body) {
            Ok(error) => ClientError::Api {
                url: self.base.clone(),
                status,
                code: error.error,
                message: error.message,
            },
            Err(_) => ClientError::Api {
                url: self.base.clone(),
                status,
                code: "unknown".into(),
                message: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
            },
        })
    }

    fn parse<T: serde::de::DeserializeOwned>(
        &self,
        status: u16,
        body: &[u8],
    ) -> Result<T, ClientError> {
        serde_json::from_slice(body).map_err(|error| ClientError::BadResponse {
            url: self.base.clone(),
            status,
            reason: error.to_string(),
        })
    }
}

/// reqwest's error with its sources, which hold the useful part
/// ("Connection refused").
pub(crate) fn describe(error: &reqwest::Error) -> String {
    let mut text = if error.is_connect() {
        "connection failed".to_owned()
    } else if error.is_timeout() {
        format!("no answer within {} s", REQUEST_TIMEOUT.as_secs())
    } else {
        error.to_string()
    };
    let mut source = std::error::Error::source(error);
    let mut last = String::new();
    while let Some(cause) = source {
        last = cause.to_string();
        source = cause.source();
    }
    if !last.is_empty() {
        text.push_str(": ");
        text.push_str(&last);
    }
    text
}

/// The base URL (normalized, `crate::url`) and an HTTP client for the
/// node at `url`, `http://` or `https://` (with `options.ca`): what the CLI
/// and `meshlog mcp` both talk through.
pub(crate) fn http_client(
    url: &str,
    options: &ClientOptions,
) -> Result<(String, reqwest::Client), ClientError> {
    let node = parse_url(url)?;
    let tls = trust(&node, options)?;
    let http = build(&node, options.token.as_deref(), tls)?;
    Ok((node.base, http))
}

/// `url` parsed by the node's one URL parser, refused as a [`ClientError`].
pub(crate) fn parse_url(url: &str) -> Result<NodeUrl, ClientError> {
    NodeUrl::parse(url).map_err(|error| ClientError::BadUrl {
        url: error.url,
        reason: error.reason,
    })
}

/// The TLS client for an `https://` node: one trusting `options.ca`. An
/// `https://` node without it is refused with a clear reason; an `http://`
/// node needs none.
pub(crate) fn trust(
    node: &NodeUrl,
    options: &ClientOptions,
) -> Result<Option<Arc<rustls::ClientConfig>>, ClientError> {
    match &options.ca {
        Some(path) => crate::tls::client_trusting(path)
            .map(Some)
            .map_err(|error| ClientError::Unreachable {
                url: node.base.clone(),
                reason: error.to_string(),
            }),
        None if node.secure => Err(ClientError::Unreachable {
            url: node.base.clone(),
            reason:
                "an https:// node needs --ca FILE (MESHLOG_CA), the CA its certificate chains to"
                    .into(),
        }),
        None => Ok(None),
    }
}

/// An HTTP client of `node`, sending `token` as a bearer secret, trusting
/// `tls` (none: an `http://` node).
pub(crate) fn build(
    node: &NodeUrl,
    token: Option<&str>,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<reqwest::Client, ClientError> {
    let cannot = |reason: String| ClientError::Unreachable {
        url: node.base.clone(),
        reason,
    };
    // Always a rustls configuration of our own (ring, no platform
    // roots): the node's CA if given, else no roots at all, so an
    // `https://` node without one fails with a clear reason.
    let tls = match tls {
        Some(tls) => tls.as_ref().clone(),
        None => rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|error| cannot(error.to_string()))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth(),
    };
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token.filter(|t| !t.is_empty()) {
        let value = crate::auth::bearer_header(token)
            .ok_or_else(|| cannot("the token is not a valid header value".into()))?;
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .default_headers(headers)
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|error| cannot(format!("cannot build an HTTP client: {error}")))
}
