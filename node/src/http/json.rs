//! The API's JSON shapes. Stream ids are decimal strings (they are 64-bit;
//! JavaScript numbers lose precision above 2^53); every other number is a
//! JSON number. A payload is `payload` (UTF-8 text) when its bytes are valid
//! UTF-8, else `payload_base64` (standard alphabet, padded).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use meshlog_cursor::VersionVector;
use meshlog_replica::Event;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::error::ApiError;

/// An event as pages answer it.
#[derive(Debug, Serialize)]
pub struct EventJson {
    /// The writer's stream id, in decimal.
    pub stream: String,
    /// Its seq in the stream.
    pub seq: u64,
    /// Its lamport stamp.
    pub lamport: u64,
    /// Wall-clock time of the append, ms since the epoch.
    pub time: u64,
    /// The payload, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The payload in base64, when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
}

impl From<&Event> for EventJson {
    fn from(event: &Event) -> Self {
        let (payload, payload_base64) = match std::str::from_utf8(&event.payload) {
            Ok(text) => (Some(text.to_owned()), None),
            Err(_) => (None, Some(STANDARD.encode(&event.payload))),
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

/// An appended event's name, as `POST /events` answers it.
#[derive(Debug, Serialize)]
pub struct AppendedJson {
    /// The stream id, in decimal.
    pub stream: String,
    /// The seq.
    pub seq: u64,
    /// The lamport stamp.
    pub lamport: u64,
}

/// A stream id as the API writes it: decimal text (the cursor crate's own
/// text form is hexadecimal; the API's contract is decimal, as in the
/// `stream-id` file and `--stream-id`).
pub fn decimal(stream: meshlog_cursor::StreamId) -> String {
    stream.get().to_string()
}

/// A version vector as a JSON object: `{"<stream id>": seq, ...}`.
pub fn vector_json(vector: &VersionVector) -> Value {
    let map: Map<String, Value> = vector
        .iter()
        .map(|(stream, seq)| (decimal(stream), Value::from(seq)))
        .collect();
    Value::Object(map)
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
pub fn json_batch(body: &[u8]) -> Result<Vec<Bytes>, ApiError> {
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
pub fn ndjson_batch(body: &[u8]) -> Result<Vec<Bytes>, ApiError> {
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
pub fn object_body<T: serde::de::DeserializeOwned>(
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryBody {
    /// The token to page after (`null` or absent: the start).
    #[serde(default)]
    pub after: Option<String>,
    /// The page length; kept raw so a bad one is `bad_limit`, not `bad_body`.
    #[serde(default)]
    pub limit: Option<Value>,
}

/// `POST /compact`'s body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactBody {
    /// Keep at least this many of each stream's newest events.
    pub keep_last: Option<u64>,
    /// Keep events younger than this many milliseconds.
    pub keep_ms: Option<u64>,
    /// Compact past what peers have acknowledged.
    #[serde(default)]
    pub ignore_peers: bool,
}

/// `POST /peers`' and `DELETE /peers`' body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerBody {
    /// The peer's URL.
    pub url: String,
}
