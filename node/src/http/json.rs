//! The API's JSON shapes. Stream ids are decimal strings (they are 64-bit;
//! JavaScript numbers lose precision above 2^53); every other number is a
//! JSON number. A payload is `payload` (UTF-8 text) when its bytes are valid
//! UTF-8, else `payload_base64` (standard alphabet, padded).
//!
//! The response types derive `Deserialize` too, so clients (the `meshlog`
//! CLI, tests) read the API with the very types the server writes, and
//! `ToSchema`, so the OpenAPI document (`super::openapi`) describes the
//! very types the server writes. Where a field's Rust type says less than
//! the contract (a stream id is decimal text, a limit a number or decimal
//! text), its schema says the rest.

use axum::http::StatusCode;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use meshlog_cursor::VersionVector;
use meshlog_replica::Event;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use serde_json::Value;
use utoipa::ToSchema;

use super::error::ApiError;

/// An event as pages answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EventJson {
    /// The writer's stream id, in decimal.
    #[schema(pattern = r"^[1-9][0-9]{0,19}$", example = "1")]
    pub stream: String,
    /// Its seq in the stream.
    pub seq: u64,
    /// Its lamport stamp.
    pub lamport: u64,
    /// Wall-clock time of the append, ms since the epoch.
    pub time: u64,
    /// The payload, when it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The payload in base64 (standard, padded), when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(content_encoding = "base64")]
    pub payload_base64: Option<String>,
}

/// A payload as the API writes it: its text when it is UTF-8 (`Ok`), else
/// its base64 (`Err`). Both representations split it here.
fn payload_text(payload: &[u8]) -> Result<String, String> {
    match std::str::from_utf8(payload) {
        Ok(text) => Ok(text.to_owned()),
        Err(_) => Err(STANDARD.encode(payload)),
    }
}

impl From<&Event> for EventJson {
    fn from(event: &Event) -> Self {
        let (payload, payload_base64) = match payload_text(&event.payload) {
            Ok(text) => (Some(text), None),
            Err(encoded) => (None, Some(encoded)),
        };
        EventJson {
            stream: decimal(event.stream),
            seq: event.seq,
            lamport: event.lamport,
            time: event.time_ms,
            payload,
            payload_base64,
        }
    }
}

impl EventJson {
    /// The payload's bytes, from whichever field carries them; `None` if
    /// neither (or both) is present or the base64 is invalid.
    ///
    /// ```
    /// use meshlog_node::http::json::EventJson;
    /// let event: EventJson = serde_json::from_str(
    ///     r#"{"stream": "1", "seq": 1, "lamport": 1, "time": 0, "payload_base64": "/w=="}"#,
    /// )?;
    /// assert_eq!(event.payload_bytes(), Some(vec![0xff]));
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn payload_bytes(&self) -> Option<Vec<u8>> {
        match (&self.payload, &self.payload_base64) {
            (Some(text), None) => Some(text.as_bytes().to_vec()),
            (None, Some(encoded)) => STANDARD.decode(encoded).ok(),
            _ => None,
        }
    }
}

/// `GET /events` and `POST /events/query`: a page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PageJson {
    /// Up to `limit` events after the cursor, in `(lamport, stream)` order.
    pub events: Vec<EventJson>,
    /// The token to page from next.
    #[schema(example = "AQEBAiOCL28")]
    pub next: String,
    /// Whether `next` covers every event this node holds now.
    pub at_head: bool,
    /// Whether the cursor covers events this node does not hold yet.
    pub behind: bool,
}

/// An appended event's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AppendedJson {
    /// The stream id, in decimal.
    #[schema(pattern = r"^[1-9][0-9]{0,19}$", example = "1")]
    pub stream: String,
    /// The seq.
    pub seq: u64,
    /// The lamport stamp.
    pub lamport: u64,
}

/// `POST /events`: the events appended, in order, once durable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AppendJson {
    /// One per payload.
    pub events: Vec<AppendedJson>,
}

/// The compact representation's media type: a client that lists it in
/// `Accept` gets [`AppendCompactJson`] from `POST /events` and
/// [`PageCompactJson`] from `GET /events` and `POST /events/query`; any
/// other `Accept` (or none) gets today's JSON, the default.
pub const COMPACT_MEDIA_TYPE: &str = "application/vnd.meshlog.compact+json";

/// Which representation a request asked for in its `Accept` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    /// Today's JSON, one object per event: the default.
    Json,
    /// [`COMPACT_MEDIA_TYPE`].
    Compact,
}

impl Representation {
    /// The representation `accept` (an `Accept` header's values) asks
    /// for: compact when it lists [`COMPACT_MEDIA_TYPE`] with a non-zero
    /// quality, whatever else it lists; JSON otherwise.
    ///
    /// ```
    /// use meshlog_node::http::json::Representation;
    /// let accept = ["application/json, application/vnd.meshlog.compact+json"];
    /// assert_eq!(Representation::from_accept(accept), Representation::Compact);
    /// let declined = ["application/vnd.meshlog.compact+json;q=0"];
    /// assert_eq!(Representation::from_accept(declined), Representation::Json);
    /// assert_eq!(Representation::from_accept(["*/*"]), Representation::Json);
    /// ```
    pub fn from_accept<'a>(accept: impl IntoIterator<Item = &'a str>) -> Representation {
        let compact = accept
            .into_iter()
            .flat_map(|value| value.split(','))
            .any(|range| {
                let mut parts = range.split(';');
                let media = parts.next().unwrap_or("").trim();
                let declined = parts.any(|param| {
                    let param = param.trim();
                    param
                        .strip_prefix("q=")
                        .or_else(|| param.strip_prefix("Q="))
                        .and_then(|q| q.trim().parse::<f32>().ok())
                        .is_some_and(|q| q <= 0.0)
                });
                media.eq_ignore_ascii_case(COMPACT_MEDIA_TYPE) && !declined
            });
        if compact {
            Representation::Compact
        } else {
            Representation::Json
        }
    }
}

/// `POST /events`' answer in the compact representation: the batch's
/// stream and its seq and lamport ranges, each `[first, last]`, not every
/// event. A batch is one commit on this node's own stream, so its seqs
/// are `first..=last` with no gap, and its lamport stamps rise by one per
/// event: event `i` of the batch is `(seq[0] + i, lamport[0] + i)`. An
/// empty batch names the stream alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AppendCompactJson {
    /// The stream id, in decimal: this node's own stream.
    #[schema(pattern = r"^[1-9][0-9]{0,19}$", example = "1")]
    pub stream: String,
    /// The first and the last event's seq (absent for an empty batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Vec<u64>, required = false, min_items = 2, max_items = 2)]
    pub seq: Option<[u64; 2]>,
    /// The first and the last event's lamport stamp (absent for an empty
    /// batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Vec<u64>, required = false, min_items = 2, max_items = 2)]
    pub lamport: Option<[u64; 2]>,
}

impl AppendCompactJson {
    /// The answer for `events`, appended in one commit to `stream`.
    pub fn new(stream: meshlog_cursor::StreamId, events: &[Event]) -> AppendCompactJson {
        let ends = events.first().zip(events.last());
        AppendCompactJson {
            stream: decimal(stream),
            seq: ends.map(|(first, last)| [first.seq, last.seq]),
            lamport: ends.map(|(first, last)| [first.lamport, last.lamport]),
        }
    }

    /// The events it names, as the default answer names them; an empty
    /// list for an empty batch, or when the ranges are not ones (a last
    /// below its first, one range missing).
    pub fn events(&self) -> Vec<AppendedJson> {
        let (Some([first, last]), Some([lamport_first, lamport_last])) = (self.seq, self.lamport)
        else {
            return Vec::new();
        };
        if last < first || lamport_last < lamport_first {
            return Vec::new();
        }
        // An append request's events take consecutive stamps from the
        // clock (the replica's planner), so the inner stamps are exact;
        // the cap only keeps a forged answer's list within its range.
        (first..=last)
            .map(|seq| AppendedJson {
                stream: self.stream.clone(),
                seq,
                lamport: lamport_first.saturating_add(seq - first).min(lamport_last),
            })
            .collect()
    }
}

/// A page in the compact representation: the events as runs, each a
/// stream's consecutive events in page order (the stream id once per run,
/// each event an array, no key names repeated); `next`, `at_head` and
/// `behind` as in [`PageJson`]. [`PageCompactJson::decode`] gives back
/// the very [`PageJson`] the default representation answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PageCompactJson {
    /// The page's events in `(lamport, stream)` order, as runs.
    pub runs: Vec<RunJson>,
    /// The token to page from next.
    #[schema(example = "AQEBAiOCL28")]
    pub next: String,
    /// Whether `next` covers every event this node holds now.
    pub at_head: bool,
    /// Whether the cursor covers events this node does not hold yet.
    pub behind: bool,
}

/// Consecutive events of one stream in a compact page: seqs `first`,
/// `first + 1`, ... in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunJson {
    /// The stream id, in decimal.
    #[schema(pattern = r"^[1-9][0-9]{0,19}$", example = "1")]
    pub stream: String,
    /// The seq of the run's first event.
    pub first: u64,
    /// The run's events, each `[lamport, time, payload]`.
    pub events: Vec<RunEventJson>,
}

/// One event of a [`RunJson`]: `[lamport, time, payload]`, the payload a
/// string when it is UTF-8, else `{"payload_base64": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEventJson(pub u64, pub u64, pub PayloadJson);

/// A compact event's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PayloadJson {
    /// UTF-8 text.
    Text(String),
    /// Any other bytes.
    Base64(Base64Json),
}

/// A payload that is not UTF-8, in base64 (standard, padded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Base64Json {
    /// The bytes in base64.
    pub payload_base64: String,
}

impl utoipa::PartialSchema for RunEventJson {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        schema_from_json(serde_json::json!({
            "description": "An event of a run: `[lamport, time, payload]`; its seq is the run's `first` plus its index.",
            "type": "array",
            "prefixItems": [
                {"type": "integer", "format": "uint64", "minimum": 0, "description": "Its lamport stamp."},
                {"type": "integer", "format": "uint64", "minimum": 0, "description": "Wall-clock time of the append, ms since the epoch."},
                {"oneOf": [
                    {"type": "string", "description": "The payload, when it is UTF-8."},
                    {
                        "type": "object",
                        "description": "The payload in base64 (standard, padded), when it is not UTF-8.",
                        "properties": {"payload_base64": {"type": "string", "contentEncoding": "base64"}},
                        "required": ["payload_base64"],
                        "additionalProperties": false
                    }
                ]}
            ],
            "minItems": 3,
            "maxItems": 3
        }))
    }
}

impl ToSchema for RunEventJson {}

/// A compact page that does not decode: a run whose seqs pass `u64::MAX`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("run {run} of stream {stream}: seq {first} plus {len} events passes the largest seq")]
pub struct CompactPageError {
    /// The run's index in the page.
    pub run: usize,
    /// Its stream, as the page wrote it.
    pub stream: String,
    /// Its first seq.
    pub first: u64,
    /// Its length.
    pub len: usize,
}

impl PageCompactJson {
    /// The compact page of `events`, in their order: a new run wherever
    /// the stream changes or its seq does not follow on.
    pub fn new(events: &[Event], next: String, at_head: bool, behind: bool) -> PageCompactJson {
        let mut runs: Vec<RunJson> = Vec::new();
        let mut run_end: Option<(meshlog_cursor::StreamId, u64)> = None;
        for event in events {
            let payload = match payload_text(&event.payload) {
                Ok(text) => PayloadJson::Text(text),
                Err(payload_base64) => PayloadJson::Base64(Base64Json { payload_base64 }),
            };
            let item = RunEventJson(event.lamport, event.time_ms, payload);
            let follows = run_end.is_some_and(|(stream, seq)| {
                stream == event.stream && seq.checked_add(1) == Some(event.seq)
            });
            match runs.last_mut() {
                Some(run) if follows => run.events.push(item),
                _ => runs.push(RunJson {
                    stream: decimal(event.stream),
                    first: event.seq,
                    events: vec![item],
                }),
            }
            run_end = Some((event.stream, event.seq));
        }
        PageCompactJson {
            runs,
            next,
            at_head,
            behind,
        }
    }

    /// The same page in the default representation: every event named in
    /// full, in order, and the same `next`.
    pub fn decode(self) -> Result<PageJson, CompactPageError> {
        let mut events = Vec::new();
        for (index, run) in self.runs.into_iter().enumerate() {
            let len = run.events.len();
            let overflow = |run_json: &RunJson| CompactPageError {
                run: index,
                stream: run_json.stream.clone(),
                first: run_json.first,
                len,
            };
            if len > 0 && run.first.checked_add(len as u64 - 1).is_none() {
                return Err(overflow(&run));
            }
            for (offset, RunEventJson(lamport, time, payload)) in run.events.into_iter().enumerate()
            {
                let (payload, payload_base64) = match payload {
                    PayloadJson::Text(text) => (Some(text), None),
                    PayloadJson::Base64(Base64Json { payload_base64 }) => {
                        (None, Some(payload_base64))
                    }
                };
                events.push(EventJson {
                    stream: run.stream.clone(),
                    seq: run.first + offset as u64,
                    lamport,
                    time,
                    payload,
                    payload_base64,
                });
            }
        }
        Ok(PageJson {
            events,
            next: self.next,
            at_head: self.at_head,
            behind: self.behind,
        })
    }
}

/// One stream's range lost to compaction, in a `410 stale_cursor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LostJson {
    /// The stream id, in decimal.
    #[schema(pattern = r"^[1-9][0-9]{0,19}$", example = "1")]
    pub stream: String,
    /// The first seq lost.
    pub first: u64,
    /// The last seq lost.
    pub last: u64,
}

/// A stale cursor's answer, as every surface carries it: the `410
/// stale_cursor` body of `GET /events` (beside `error`), follow's `stale`
/// frame, what the CLI and MCP report. Built once from the replica's
/// answer (`StaleJson::try_from`) and read once from a `410` body
/// ([`ErrorJson::stale`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleJson {
    /// The node's explanation.
    pub message: String,
    /// Every stream and range lost.
    pub lost: Vec<LostJson>,
    /// The token that accepts exactly that loss.
    pub resume: String,
}

impl StaleJson {
    /// How many events were lost, over every stream.
    pub fn lost_count(&self) -> u64 {
        self.lost
            .iter()
            .map(|range| range.last + 1 - range.first)
            .sum()
    }
}

impl StaleJson {
    /// The answer to `stale`, its resume cursor written as `resume` (the
    /// node writes the shortest token, as for a page's `next`).
    pub fn new(stale: &meshlog_cursor::StaleCursor, resume: String) -> StaleJson {
        StaleJson {
            message: stale.to_string(),
            lost: stale
                .lost()
                .iter()
                .map(|range| LostJson {
                    stream: decimal(range.stream),
                    first: range.first_seq,
                    last: range.last_seq,
                })
                .collect(),
            resume,
        }
    }
}

impl TryFrom<&meshlog_cursor::StaleCursor> for StaleJson {
    /// The resume cursor does not encode as a token (more streams than a
    /// token holds).
    type Error = meshlog_cursor::token::TokenError;

    /// The answer with its resume as a version-1 token (a follower that
    /// did not ask for short tokens reads only those).
    fn try_from(stale: &meshlog_cursor::StaleCursor) -> Result<StaleJson, Self::Error> {
        let resume = meshlog_cursor::token::encode_text(stale.resume())?;
        Ok(StaleJson::new(stale, resume))
    }
}

/// `410 stale_cursor`: the cursor is below the floor; `lost` names every
/// stream and range lost, `resume` the token to go on from (the shortest
/// the replica writes, as a page's `next`: version 2 where shorter).
pub(crate) fn stale_error(
    replica: &crate::replica::NodeReplica,
    stale: &meshlog_cursor::StaleCursor,
) -> ApiError {
    match replica
        .try_token(stale.resume())
        .map(|resume| StaleJson::new(stale, resume))
    {
        Ok(answer) => ApiError::new(StatusCode::GONE, "stale_cursor", answer.message)
            .with(
                "lost",
                serde_json::to_value(answer.lost).expect("lost ranges are JSON"),
            )
            .with("resume", answer.resume.into()),
        Err(error) => ApiError::internal(format!("cannot encode the resume token: {error}")),
    }
}

/// `GET /checkpoint`: a checkpoint's vector, as a version-1 token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointJson {
    /// The checkpoint's name: 32 hex digits, the first 16 bytes of the
    /// BLAKE3 of `token`'s bytes (`docs/TOKEN.md`, "Checkpoints and their
    /// names"): check it before expanding a version-2 token with `token`.
    #[schema(example = "81242b5e18bd7ccc6f090caa9e6a059d")]
    pub checkpoint: String,
    /// The checkpoint's vector as a version-1 token.
    #[schema(example = "AQMBrAIABZL4qfqXt96bngEBx4c4ww")]
    pub token: String,
}

/// Every error's body: a stable code and a message, with the fields a
/// caller needs to act on some codes (`lost` and `resume` on
/// `stale_cursor`, `max` on `bad_limit`, `limit` on the `413`s).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorJson {
    /// The stable code (`bad_token`, `stale_cursor`, ...; `docs/HTTP.md`
    /// lists them all).
    #[schema(example = "bad_token")]
    pub error: String,
    /// For humans.
    pub message: String,
    /// A stale cursor's lost ranges, every stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<Vec<LostJson>>,
    /// A stale cursor's token to resume from, accepting the gap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<String>,
    /// `bad_limit`: the largest page length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    /// `body_too_large` and `payload_too_large`: the limit in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// `unknown_checkpoint`: the name (32 hex digits) of the checkpoint the
    /// token is relative to, which this node does not keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// `unknown_checkpoint`: how many peers the node asked for the
    /// checkpoint before it answered (none sent it within
    /// `checkpoint_fetch_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers_asked: Option<u64>,
}

impl ErrorJson {
    /// The stale answer a `410 stale_cursor` body carries, if it is one
    /// (both `lost` and `resume`).
    pub fn stale(self) -> Option<StaleJson> {
        Some(StaleJson {
            lost: self.lost?,
            resume: self.resume?,
            message: self.message,
        })
    }
}

/// A version vector as JSON: `{"<stream id>": seq, ...}`.
pub type VectorJson = BTreeMap<String, u64>;

/// [`VectorJson`]'s schema, named `VectorJson` in the document (a type
/// alias has no name of its own there). A schema only.
pub struct VectorSchema;

impl utoipa::PartialSchema for VectorSchema {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        schema_from_json(serde_json::json!({
            "description": "A version vector: per stream (its decimal id), a seq.",
            "type": "object",
            "propertyNames": {"type": "string", "pattern": "^[1-9][0-9]{0,19}$"},
            "additionalProperties": {"type": "integer", "format": "uint64", "minimum": 0},
            "example": {"1": 6}
        }))
    }
}

impl ToSchema for VectorSchema {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("VectorJson")
    }
}

/// The digest of the events a node holds: it moves with the floor, so
/// two nodes that hold the same heads but compacted differently answer
/// different sums (compare the chain heads, `chains`, instead).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DigestJson {
    /// How many events.
    pub events: u64,
    /// The sum of their content hashes, 32 hex digits.
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub sum: String,
}

/// The digest of the events a node holds, as JSON.
pub fn digest_json(digest: meshlog_replica::Digest) -> DigestJson {
    DigestJson {
        events: digest.events,
        sum: format!("{:032x}", digest.sum),
    }
}

/// The chain heads of the streams a node holds (`docs/SIGNING.md`): equal
/// on nodes that hold the same heads, whatever each compacted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChainsJson {
    /// BLAKE3 over every stream's head and chain hash (the formula of
    /// `meshlog_replica::ChainDigest`), 64 hex digits. An unanchored
    /// stream counts by its head alone.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub hash: String,
    /// Per stream held (its decimal id), its head and the chain hash there.
    pub streams: BTreeMap<String, StreamHeadJson>,
}

/// One stream's chain head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamHeadJson {
    /// The last seq held (the stream's mark).
    pub head: u64,
    /// The chain hash at `head`, 64 hex digits; `null` when the stream is
    /// unanchored: this node learned its floor from a peer, or upgraded a
    /// compacted data file, and so never had the hash at its floor
    /// (`docs/SIGNING.md`). Its head still counts in `hash`.
    #[schema(pattern = "^[0-9a-f]{64}$", required = true)]
    pub hash: Option<String>,
}

/// The chain heads, as JSON.
pub fn chains_json(digest: &meshlog_replica::ChainDigest) -> ChainsJson {
    ChainsJson {
        hash: digest.hash.to_string(),
        streams: digest
            .streams
            .iter()
            .map(|head| {
                let json = StreamHeadJson {
                    head: head.head,
                    hash: head.chain.map(|chain| chain.to_string()),
                };
                (head.stream.to_string(), json)
            })
            .collect(),
    }
}

/// `GET /forks`: the streams this node holds proven forked
/// (`docs/SIGNING.md`, "Equivocation with valid signatures").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ForksJson {
    /// One per forked stream, streams ascending.
    pub forks: Vec<ForkJson>,
}

/// One forked stream and the proof of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ForkJson {
    /// The forked stream (its decimal id); frozen on this node.
    #[schema(pattern = r"^[1-9][0-9]{0,19}$", example = "1")]
    pub stream: String,
    /// The seq at which the two histories' chain hashes differ: they
    /// diverge at or below it.
    pub seq: u64,
    /// The writer's public key that signed both, 64 hex digits.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub key: String,
    /// The two signed chain heads (each branch's seal).
    pub heads: Vec<ForkHeadJson>,
    /// The whole proof, standard base64 of `ForkProof::to_bytes`
    /// (`docs/SIGNING.md` gives its layout): check it with
    /// `ForkProof::verify`, or by hand.
    pub proof: String,
}

/// One signed chain head of a fork.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ForkHeadJson {
    /// The seq the seal is at.
    pub seq: u64,
    /// The chain hash it signs, 64 hex digits.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub hash: String,
}

/// A kept fork proof as JSON.
pub fn fork_json(proof: &meshlog_replica::ForkProof) -> ForkJson {
    use base64::Engine;
    ForkJson {
        stream: decimal(proof.stream()),
        seq: proof.seq,
        key: proof.key.to_string(),
        heads: proof
            .branches
            .iter()
            .map(|branch| ForkHeadJson {
                seq: branch.seal.seq,
                hash: branch.seal.head.to_string(),
            })
            .collect(),
        proof: base64::engine::general_purpose::STANDARD.encode(proof.to_bytes()),
    }
}

/// One dialed peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PeerJson {
    /// Its URL, normalized.
    pub url: String,
    /// Whether its session is established.
    pub connected: bool,
    /// Its stream id, once its hello arrived.
    #[schema(pattern = r"^[1-9][0-9]{0,19}$")]
    pub stream: Option<String>,
    /// The marks it has acknowledged.
    #[schema(value_type = VectorSchema)]
    pub marks: VectorJson,
    /// Events this node holds that it has not acknowledged.
    pub lag_events: u64,
    /// Why its last session or dial ended badly.
    pub last_error: Option<String>,
    /// The streams its current (or last) session cuts and why, the
    /// first [`LINK_LIMITS_SHOWN`] hit (an older node's answer has none).
    #[serde(default)]
    #[schema(max_items = 64)]
    pub limits: Vec<LinkLimitJson>,
    /// How many limits that session hit, listed or not.
    #[serde(default)]
    pub limits_total: u64,
    /// Its current (or last) session's counters (an older node's answer
    /// has none: zeros).
    #[serde(default)]
    pub counters: LinkCountersJson,
}

/// A link's session counters, as `GET /peers` shows them; summed over
/// every session, they are `/metrics`' `meshlog_sync_*_total` of the same
/// names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LinkCountersJson {
    /// Compaction statements offered to the peer in `Statement` frames.
    pub statements_sent: u64,
    /// Compaction statements the peer offered that this node refused
    /// (no authority, or another history at the floor); a repeat is
    /// counted without being judged again.
    pub statements_refused: u64,
    /// Frames of a kind this node does not know, skipped.
    pub frames_skipped: u64,
}

/// A session's counters as `GET /peers` shows them.
pub(crate) fn link_counters_json(session: &meshlog_sync::SessionState) -> LinkCountersJson {
    LinkCountersJson {
        statements_sent: session.statements_sent,
        statements_refused: session.statements_refused,
        frames_skipped: session.frames_skipped,
    }
}

/// The most limits `GET /peers` lists per link: one is hit per stream
/// cut, so a link could hit thousands (`streams_max`); the count says
/// how many there are.
pub const LINK_LIMITS_SHOWN: usize = 64;

/// A stream a link's session cuts, and why: a limit it ran into
/// (`meshlog_sync::LimitHit`). The session keeps exchanging every other
/// stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LinkLimitJson {
    /// The stream cut (decimal; empty for a limit of a kind this node
    /// does not name).
    pub stream: String,
    /// Which limit: `streams_max`, `payload_bytes_max`, `frame_bytes_max`
    /// (over a size limit), `unknown_writer` (its writer is not admitted),
    /// `frozen` (its writer forked it), `unsealed` (it comes unsealed and
    /// this node requires seals), `statement_no_authority` (the peer's
    /// compaction statement for it is signed by a key this node does not
    /// trust), `statement_refusals_max` (no stream: the peer offered more
    /// distinct refused statements than a session remembers, 256, so each
    /// repeat of the others is judged again);
    /// `other` from a newer sync layer.
    #[schema(example = "unsealed")]
    pub limit: String,
    /// What is not exchanged and which setting says so, for an operator.
    pub reason: String,
}

/// A limit hit as `GET /peers` and the status stream show it.
pub(crate) fn link_limit_json(hit: &meshlog_sync::LimitHit) -> LinkLimitJson {
    use meshlog_sync::LimitHit;
    let (stream, limit) = match hit {
        LimitHit::StreamsMax { stream, .. } => (Some(stream), "streams_max"),
        LimitHit::PayloadBytesMax { stream, .. } => (Some(stream), "payload_bytes_max"),
        LimitHit::FrameBytesMax { stream, .. } => (Some(stream), "frame_bytes_max"),
        LimitHit::UnknownWriter { stream, .. } => (Some(stream), "unknown_writer"),
        LimitHit::Frozen { stream, .. } => (Some(stream), "frozen"),
        LimitHit::Unsealed { stream } => (Some(stream), "unsealed"),
        LimitHit::StatementNoAuthority { stream, .. } => (Some(stream), "statement_no_authority"),
        LimitHit::StatementRefusalsMax { .. } => (None, "statement_refusals_max"),
        _ => (None, "other"),
    };
    LinkLimitJson {
        stream: stream.map(|&stream| decimal(stream)).unwrap_or_default(),
        limit: limit.into(),
        reason: limit_reason(hit),
    }
}

/// A limit hit, for an operator: the one place its words are written.
fn limit_reason(hit: &meshlog_sync::LimitHit) -> String {
    use meshlog_sync::LimitHit;
    match hit {
        LimitHit::StreamsMax { stream, limit } => format!(
            "stream {} refused: streams_max {limit} reached",
            stream.get()
        ),
        LimitHit::PayloadBytesMax {
            stream,
            seq,
            len,
            limit,
        } => format!(
            "stream {} stops below seq {seq}: its {len}-byte payload is over payload_bytes_max {limit}",
            stream.get()
        ),
        LimitHit::FrameBytesMax {
            stream,
            seq,
            len,
            limit,
        } => format!(
            "stream {} not sent past seq {seq}: its {len}-byte payload is over the frame limit {limit}",
            stream.get()
        ),
        LimitHit::UnknownWriter { stream, key } => format!(
            "stream {} refused: its writer{} is not admitted by the trust configuration",
            stream.get(),
            key.map(|key| format!(" (key {key})")).unwrap_or_default()
        ),
        LimitHit::Frozen { stream, head } => format!(
            "stream {} refused above seq {head}: its writer forked it (GET /forks has the proof)",
            stream.get()
        ),
        LimitHit::Unsealed { stream } => format!(
            "stream {} refused: it comes unsealed (a legacy stream) and this node requires seals",
            stream.get()
        ),
        LimitHit::StatementNoAuthority { stream, floor } => format!(
            "stream {} refused: the peer's compaction statement (floor {floor}) is signed by a key \
             the trust configuration does not trust to erase it",
            stream.get()
        ),
        LimitHit::StatementRefusalsMax { limit } => format!(
            "the peer offered more than {limit} distinct compaction statements refused this session \
             (no authority, or a hash that does not match): repeats of further ones each cost a \
             commit round"
        ),
        other => format!("{other:?}"),
    }
}

/// A link's limits as `GET /peers` lists them: the first
/// [`LINK_LIMITS_SHOWN`], and how many there are.
pub(crate) fn link_limits_json(hits: &[meshlog_sync::LimitHit]) -> (Vec<LinkLimitJson>, u64) {
    let shown = hits
        .iter()
        .take(LINK_LIMITS_SHOWN)
        .map(link_limit_json)
        .collect();
    (shown, hits.len() as u64)
}

/// One inbound session: a peer that dialed this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InboundJson {
    /// The address its connection came from, `host:port`.
    #[schema(example = "127.0.0.1:50412")]
    pub remote: String,
    /// Whether its hello has arrived.
    pub connected: bool,
    /// Its stream id, once its hello arrived.
    #[schema(pattern = r"^[1-9][0-9]{0,19}$")]
    pub stream: Option<String>,
    /// The marks it has acknowledged.
    #[schema(value_type = VectorSchema)]
    pub marks: VectorJson,
    /// Events this node holds that it has not acknowledged.
    pub lag_events: u64,
    /// The streams its session cuts and why, as for a dialed peer
    /// ([`PeerJson::limits`]).
    #[serde(default)]
    #[schema(max_items = 64)]
    pub limits: Vec<LinkLimitJson>,
    /// How many limits its session hit, listed or not.
    #[serde(default)]
    pub limits_total: u64,
    /// Its session's counters, as for a dialed peer
    /// ([`PeerJson::counters`]).
    #[serde(default)]
    pub counters: LinkCountersJson,
}

/// `GET /peers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PeersJson {
    /// The peers this node dials, in the order they were added.
    pub peers: Vec<PeerJson>,
    /// The inbound sessions running now, in the order they started (an
    /// older node's answer has none).
    #[serde(default)]
    pub inbound: Vec<InboundJson>,
}

/// `GET /marks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MarksJson {
    /// This node's own stream id.
    #[schema(pattern = r"^[1-9][0-9]{0,19}$", example = "1")]
    pub stream: String,
    /// Per stream, the last seq held.
    #[schema(value_type = VectorSchema)]
    pub marks: VectorJson,
    /// Per stream, the last seq compacted away.
    #[schema(value_type = VectorSchema)]
    pub floor: VectorJson,
    /// The marks as a token.
    pub token: String,
    /// The digest of the events held (moves with the floor).
    pub digest: DigestJson,
    /// The chain heads: per stream, its head and chain hash, and one hash
    /// over them (equal whatever each node compacted; an older node's
    /// answer has none).
    #[serde(default)]
    pub chains: ChainsJson,
    /// This node's writer: its public key and whether it seals its
    /// stream (an older node's answer has none).
    #[serde(default)]
    pub writer: Option<WriterJson>,
    /// The dialed peers.
    pub peers: Vec<PeerJson>,
}

/// `GET /marks`' `writer`: the node's writer key, and whether peers can
/// verify its stream (`docs/SIGNING.md`, the upgrade policy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WriterJson {
    /// The writer's public key, 64 hex digits (`meshlog key show` prints
    /// it as the `writers` entry other nodes take).
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub public_key: String,
    /// Whether the node seals its stream (its key derives the stream, or
    /// the trust configuration binds it to this legacy stream).
    pub sealed: bool,
    /// Why not, when it does not: `unbound_legacy_stream` (a data
    /// directory from before signed streams whose key no `writers =
    /// ["KEY@STREAM"]` entry or admin binding names for it; peers that
    /// require seals refuse its events). `null` when sealed.
    pub unsealed_reason: Option<UnsealedReason>,
    /// Whether the node is relearning its own stream from its peers
    /// before it appends again (a data directory restored from an old
    /// backup); appends answer `503 recovering` meanwhile.
    #[serde(default)]
    pub recovering: bool,
}

/// Why a node writes its stream unsealed ([`WriterJson::unsealed_reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UnsealedReason {
    /// A legacy stream its key does not derive, and no binding names.
    UnboundLegacyStream,
}

/// `POST /compact`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CompactedJson {
    /// Events dropped.
    pub dropped: u64,
    /// Streams whose floor rose.
    pub streams: u64,
    /// The floor now.
    #[schema(value_type = VectorSchema)]
    pub floor: VectorJson,
}

/// `POST /verify`'s answer: every held event was read and checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VerifiedJson {
    /// Streams held.
    pub streams: u64,
    /// Events read and checked.
    pub events: u64,
}

/// `POST /peers`' answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PeerAddedJson {
    /// The URL, normalized.
    pub url: String,
    /// `false` if it was already a peer.
    pub added: bool,
}

/// `DELETE /peers`' answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PeerRemovedJson {
    /// The URL as given.
    pub url: String,
    /// Always `true` (an unknown peer is `404 unknown_peer`).
    pub removed: bool,
}

/// A stream id as the API writes it: decimal text (the cursor crate's own
/// text form is hexadecimal; the API's contract is decimal, as in the
/// `stream-id` file and `--stream-id`).
pub fn decimal(stream: meshlog_cursor::StreamId) -> String {
    stream.get().to_string()
}

/// A version vector as JSON.
pub fn vector_json(vector: &VersionVector) -> VectorJson {
    vector
        .iter()
        .map(|(stream, seq)| (decimal(stream), seq))
        .collect()
}

/// One element of a JSON or NDJSON batch: a string, or an object with
/// exactly one of `payload` and `payload_base64`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum BatchElement {
    Text(String),
    Object(PayloadObject),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PayloadObject {
    payload: Option<String>,
    payload_base64: Option<String>,
}

fn element_bytes(element: BatchElement, index: usize) -> Result<Bytes, ApiError> {
    match element {
        BatchElement::Text(text) => Ok(Bytes::from(text)),
        BatchElement::Object(PayloadObject {
            payload: Some(text),
            payload_base64: None,
        }) => Ok(Bytes::from(text)),
        BatchElement::Object(PayloadObject {
            payload: None,
            payload_base64: Some(encoded),
        }) => STANDARD
            .decode(encoded.as_bytes())
            .map(Bytes::from)
            .map_err(|error| {
                ApiError::bad_body(format!("element {index}: invalid payload_base64: {error}"))
            }),
        BatchElement::Object(_) => Err(ApiError::bad_body(format!(
            "element {index}: an object needs exactly one of payload and payload_base64"
        ))),
    }
}

/// The payloads of a JSON batch: an array of elements.
pub(crate) fn json_batch(body: &[u8]) -> Result<Vec<Bytes>, ApiError> {
    let elements: Vec<BatchElement> = serde_json::from_slice(body).map_err(|error| {
        ApiError::bad_body(format!(
            "expected a JSON array of strings or {{\"payload\"}} / {{\"payload_base64\"}} objects: {error}"
        ))
    })?;
    elements
        .into_iter()
        .enumerate()
        .map(|(index, element)| element_bytes(element, index))
        .collect()
}

/// The payloads of an NDJSON batch: one element per line; blank lines are
/// skipped.
pub(crate) fn ndjson_batch(body: &[u8]) -> Result<Vec<Bytes>, ApiError> {
    let mut payloads = Vec::new();
    for (line_index, line) in body.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let element: BatchElement = serde_json::from_slice(line)
            .map_err(|error| ApiError::bad_body(format!("line {}: {error}", line_index + 1)))?;
        payloads.push(element_bytes(element, payloads.len())?);
    }
    Ok(payloads)
}

/// Parses a request body that must be one JSON object of type `T` (serde
/// would also take an array for a struct; the API does not).
pub(crate) fn object_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
    shape: &str,
) -> Result<T, ApiError> {
    let bad = |reason: String| ApiError::bad_body(format!("expected {shape}: {reason}"));
    let value: Value = serde_json::from_slice(body).map_err(|error| bad(error.to_string()))?;
    if !value.is_object() {
        return Err(bad("the body is not a JSON object".into()));
    }
    serde_json::from_value(value).map_err(|error| bad(error.to_string()))
}

/// `POST /events/query`'s body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryBody {
    /// The token to page after (`null` or absent: the start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^(?:[0-9]*|A[A-Za-z0-9_-]*)$", max_length = 436890)]
    pub after: Option<String>,
    /// The page length: a number (or a decimal string). Kept raw so that
    /// a bad one is answered `bad_limit`, not `bad_body`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = limit_schema)]
    pub limit: Option<Value>,
}

/// `GET /compaction`: what a compaction statement of a stream at a floor
/// commits to, for the mesh admin to sign (`meshlog key compact`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CompactionJson {
    /// The stream.
    #[schema(pattern = r"^[1-9][0-9]{0,19}$")]
    pub stream: String,
    /// The floor: the last seq the statement drops.
    pub floor: u64,
    /// The stream's chain hash at `floor`, 64 hex digits.
    #[schema(pattern = r"^[0-9a-f]{64}$")]
    pub hash: String,
}

/// `POST /compaction`'s body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatementBody {
    /// The signed compaction statement: hex of its 144 bytes
    /// (`docs/SIGNING.md`, "The bytes signed and carried").
    #[schema(pattern = r"^[0-9a-fA-F]{288}$")]
    pub statement: String,
}

/// `POST /compaction`: the statement taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StatementTakenJson {
    /// The stream.
    #[schema(pattern = r"^[1-9][0-9]{0,19}$")]
    pub stream: String,
    /// The node's floor of the stream now.
    pub floor: u64,
    /// Whether the statement raised it (`false`: the node's floor was at
    /// or past the statement's already).
    pub raised: bool,
}

/// `POST /compact`'s body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompactBody {
    /// Keep at least this many of each stream's newest events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u64>,
    /// Keep events younger than this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_ms: Option<u64>,
    /// Compact past what peers have acknowledged.
    #[serde(default)]
    pub ignore_peers: bool,
}

/// `POST /peers`' and `DELETE /peers`' body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PeerBody {
    /// The peer's URL, `http://host[:port]` (port 80 if absent).
    #[schema(
        pattern = r"^http://(?:[A-Za-z0-9._~!$&'()*+,;=%-]+|\[[0-9A-Fa-f:.]+\])(?::0*(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?/?$",
        example = "http://127.0.0.1:7071"
    )]
    pub url: String,
}

/// `GET /health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HealthJson {
    /// Always `ok`: the node answers.
    #[schema(example = "ok")]
    pub status: String,
}

/// The largest `limit` a page takes: the replica's page bound.
pub const PAGE_LEN_MAX: u64 = meshlog_replica::PAGE_LEN_MAX as u64;

/// `PAGE_LEN_MAX` is a power of ten, so the decimal text from 1 to it is
/// "up to its digits less one, or itself" ([`limit_text_pattern`]).
const _: () = assert!(PAGE_LEN_MAX >= 10 && 10u64.pow(PAGE_LEN_MAX.ilog10()) == PAGE_LEN_MAX);

/// The pattern of `limit` as decimal text: 1 to [`PAGE_LEN_MAX`], leading
/// zeros allowed.
pub(crate) fn limit_text_pattern() -> String {
    format!(
        "^0*(?:[1-9][0-9]{{0,{}}}|{PAGE_LEN_MAX})$",
        PAGE_LEN_MAX.ilog10() - 1
    )
}

/// `limit` in a query body: a whole number from 1 to [`PAGE_LEN_MAX`], or
/// the same as decimal text (what a query string carries), or `null` for
/// the default.
fn limit_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    schema_from_json(serde_json::json!({
        "description": format!("The page length, 1 to {PAGE_LEN_MAX} (default 100): a number, or the same in decimal text; `null` is the default."),
        "oneOf": [
            {"type": "integer", "minimum": 1, "maximum": PAGE_LEN_MAX},
            {"type": "string", "pattern": limit_text_pattern()},
            {"type": "null"}
        ]
    }))
}

/// A schema written as JSON, for the shapes derive cannot say (unions of
/// a string and an object, numbers that may come as text).
pub(crate) fn schema_from_json(
    value: Value,
) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    serde_json::from_value(value).expect("a hand-written schema is a valid Schema object")
}

/// `POST /events`' body as `application/json`: a batch, an array whose
/// elements are each a string (the UTF-8 payload), `{"payload": TEXT}` or
/// `{"payload_base64": BASE64}` (standard alphabet, padded, canonical).
/// A schema only: the body is read by [`json_batch`].
pub struct AppendBatchJson;

impl utoipa::PartialSchema for AppendBatchJson {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        schema_from_json(serde_json::json!({
            "description": "A batch: one event per element, appended as one commit.",
            "type": "array",
            "items": {
                "oneOf": [
                    {"type": "string", "description": "A UTF-8 payload."},
                    {
                        "type": "object",
                        "description": "A UTF-8 payload.",
                        "properties": {"payload": {"type": "string"}},
                        "required": ["payload"],
                        "additionalProperties": false
                    },
                    {
                        "type": "object",
                        "description": "Any bytes, in base64 (standard alphabet, padded).",
                        "properties": {"payload_base64": {"type": "string", "pattern": BASE64_PATTERN}},
                        "required": ["payload_base64"],
                        "additionalProperties": false
                    }
                ]
            }
        }))
    }
}

impl ToSchema for AppendBatchJson {}

/// `POST /events`' body as any other content type: one payload, its bytes
/// as they are. A schema only.
pub struct RawPayload;

impl utoipa::PartialSchema for RawPayload {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        schema_from_json(serde_json::json!({
            "description": "One payload: the body's bytes, whatever they are.",
            "type": "string",
            "format": "binary"
        }))
    }
}

impl ToSchema for RawPayload {}

/// Canonical standard base64, padded: the unused bits of the last symbol
/// are zero, as the decoder demands.
const BASE64_PATTERN: &str =
    "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$";
