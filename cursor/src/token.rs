//! The token codec: a version vector as compact, canonical, checksummed bytes,
//! and as URL-safe base64 text. The byte format is in `docs/TOKEN.md`.
//!
//! ```text
//! token   = version n entry{n} crc32
//! version = 0x01
//! n       = varint          ; number of streams, 0 ..= STREAMS_MAX
//! entry   = gap seq
//! gap     = varint          ; first entry: the stream id; then id - previous id - 1
//! seq     = varint          ; >= 1
//! crc32   = 4 bytes LE      ; CRC-32 (IEEE) of every byte before it
//! varint  = unsigned LEB128, shortest form, at most 10 bytes, value < 2^64
//! ```
//!
//! Gap coding makes unsorted and repeated streams unrepresentable, so each
//! vector has exactly one encoding: decoding rejects overlong varints, zero
//! seqs, stream ids past 2^64, trailing bytes and a bad checksum.
//!
//! Version 2 ([`encode_relative`], read by [`decode_any`]) writes a cursor
//! relative to a [`Checkpoint`]: its name and the streams where the cursor
//! differs from it, at most [`CHECKPOINT_DIFF_MAX`]. [`decode`] and
//! [`decode_text`] read version 1 only, as they always have; [`decode_any`]
//! and [`decode_any_text`] read both, into a [`Token`].

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

#[cfg(doc)]
use crate::Checkpoint;
use crate::{CheckpointName, StreamId, VersionVector, STREAMS_MAX};

mod relative;

pub use relative::{
    decode_any, decode_any_text, encode_relative, encode_relative_text, RelativeCursor, Token,
    CHECKPOINT_DIFF_MAX, RELATIVE_BYTES_MAX, RELATIVE_TEXT_MAX, TOKEN_VERSION_RELATIVE,
};

/// The version of an absolute token (a whole vector): what [`encode`] writes
/// and [`decode`] reads. Version 2 ([`TOKEN_VERSION_RELATIVE`]) is relative
/// to a checkpoint.
pub const TOKEN_VERSION: u8 = 1;

/// The checksum's bytes, at the end of every token.
const CRC_BYTES: usize = 4;

/// Bytes that are not entries: version (1), count (at most 2), checksum (4).
pub const TOKEN_OVERHEAD_MAX: usize = 1 + 2 + 4;

/// The longest a varint may be (a u64 takes at most 10 LEB128 bytes).
const VARINT_BYTES_MAX: usize = 10;

/// The largest binary token: the overhead plus two 10-byte varints per stream.
pub const TOKEN_BYTES_MAX: usize = TOKEN_OVERHEAD_MAX + STREAMS_MAX * 2 * VARINT_BYTES_MAX;

/// The largest text token: base64 of [`TOKEN_BYTES_MAX`] bytes, no padding.
pub const TOKEN_TEXT_MAX: usize = (TOKEN_BYTES_MAX * 4).div_ceil(3);

/// The smallest binary token (the empty vector): version, zero count, checksum.
const TOKEN_BYTES_MIN: usize = 1 + 1 + 4;

/// Why a token could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The text form is longer than any valid token.
    #[error("token text is {len} characters; the limit is {limit}")]
    TextTooLarge {
        /// The text's length in bytes.
        len: usize,
        /// [`TOKEN_TEXT_MAX`].
        limit: usize,
    },
    /// The text form is not URL-safe base64 without padding.
    #[error("token text is not URL-safe base64 without padding at offset {offset}: {reason}")]
    Base64 {
        /// The offset of the offending character (the text's length for a
        /// bad length).
        offset: usize,
        /// What is wrong there.
        reason: &'static str,
    },
    /// The binary form is longer than any valid token.
    #[error("token is {len} bytes; the limit is {limit}")]
    TooLarge {
        /// The token's length in bytes.
        len: usize,
        /// [`TOKEN_BYTES_MAX`].
        limit: usize,
    },
    /// The first byte names a format this decoder does not read: [`decode`]
    /// reads version 1, [`decode_any`] versions 1 and 2.
    #[error(
        "token format version {version} is unknown to this decoder (decode reads version 1, decode_any versions 1 and 2)"
    )]
    UnknownVersion {
        /// The version byte found.
        version: u8,
    },
    /// The token ends before a complete field.
    #[error("token is truncated: it ends at byte {len} while reading the {field}")]
    Truncated {
        /// The token's length in bytes (of the body, for fields inside it).
        len: usize,
        /// The field that was being read.
        field: &'static str,
    },
    /// The stored checksum does not match the bytes.
    #[error("token checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// The checksum in the token.
        stored: u32,
        /// The checksum of the token's bytes.
        computed: u32,
    },
    /// The token names more streams than [`STREAMS_MAX`]; when encoding, the
    /// vector has more streams than a token may carry.
    #[error("token names {streams} streams; the limit is {limit}")]
    TooManyStreams {
        /// The count in the token (or the vector's length).
        streams: u64,
        /// [`STREAMS_MAX`].
        limit: usize,
    },
    /// The bytes decode, but not in the one canonical encoding.
    #[error("token is not canonical at byte {offset}: {rule}")]
    NonCanonical {
        /// The offset of the offending field.
        offset: usize,
        /// The rule broken.
        rule: CanonicalRule,
    },
    /// Bytes follow the last entry.
    #[error("token has {count} trailing byte(s) after the last entry, at byte {offset}")]
    TrailingBytes {
        /// The offset of the first trailing byte.
        offset: usize,
        /// How many bytes trail.
        count: usize,
    },
    /// A version-2 token differs from its checkpoint on more streams than
    /// [`CHECKPOINT_DIFF_MAX`]; when encoding, the cursor does, and the
    /// caller writes version 1 instead.
    #[error("token differs from its checkpoint on {differences} streams; the limit is {limit}")]
    TooManyDifferences {
        /// The count in the token, or the streams where the cursor differs.
        differences: usize,
        /// [`CHECKPOINT_DIFF_MAX`].
        limit: usize,
    },
    /// When encoding version 2: the cursor differs from the checkpoint on
    /// `stream` by more than an `i64` holds; the caller writes version 1.
    #[error(
        "stream {stream}: cursor seq {cursor_seq} and checkpoint seq {checkpoint_seq} differ by more than a version-2 token holds"
    )]
    DifferenceOutOfRange {
        /// The stream.
        stream: StreamId,
        /// The cursor's seq there.
        cursor_seq: u64,
        /// The checkpoint's seq there.
        checkpoint_seq: u64,
    },
    /// A version-2 token was expanded against a checkpoint of another name.
    #[error("token is relative to checkpoint {token}, not to checkpoint {given}")]
    CheckpointMismatch {
        /// The checkpoint the token names.
        token: CheckpointName,
        /// The checkpoint it was expanded against.
        given: CheckpointName,
    },
    /// A version-2 token's difference takes a seq of its checkpoint below 0
    /// or past 2^64 − 1.
    #[error(
        "stream {stream}: checkpoint seq {checkpoint_seq} plus difference {difference} is not a seq"
    )]
    SeqOutOfRange {
        /// The stream.
        stream: StreamId,
        /// The checkpoint's seq there (0 if it does not name the stream).
        checkpoint_seq: u64,
        /// The token's difference there.
        difference: i64,
    },
}

/// The canonical-form rule a token broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalRule {
    /// A varint has more bytes than its value needs, or exceeds 2^64 - 1.
    #[error("varint is overlong or exceeds 64 bits")]
    Varint,
    /// An entry has seq 0: streams with nothing covered are omitted.
    #[error("stream {stream} has seq 0; zero entries are omitted")]
    ZeroEntry {
        /// The stream with the zero entry.
        stream: StreamId,
    },
    /// A stream gap carries the id past 2^64 - 1.
    #[error("stream id past 2^64 - 1")]
    StreamOverflow,
    /// A version-2 entry has difference 0: streams where the cursor equals
    /// the checkpoint are omitted.
    #[error("stream {stream} has difference 0; equal streams are omitted")]
    ZeroDifference {
        /// The stream with the zero difference.
        stream: StreamId,
    },
}

/// Encodes a vector as a binary token.
///
/// Fails only when the vector has more than [`STREAMS_MAX`] streams.
///
/// ```
/// use meshlog_cursor::{token, StreamId, VersionVector};
/// let v: VersionVector = [(StreamId::new(1), 300), (StreamId::new(2), 5)].into_iter().collect();
/// let bytes = token::encode(&v)?;
/// // version, count, (gap 1, seq 300 as 2 bytes), (gap 0, seq 5), crc32
/// assert_eq!(bytes.len(), 1 + 1 + 3 + 2 + 4);
/// assert_eq!(token::decode(&bytes)?, v);
/// # Ok::<(), meshlog_cursor::TokenError>(())
/// ```
pub fn encode(vector: &VersionVector) -> Result<Vec<u8>, TokenError> {
    let streams = vector.len();
    if streams > STREAMS_MAX {
        return Err(TokenError::TooManyStreams {
            streams: streams as u64,
            limit: STREAMS_MAX,
        });
    }
    let mut out = Vec::with_capacity(TOKEN_OVERHEAD_MAX + streams * 4);
    out.push(TOKEN_VERSION);
    put_varint(&mut out, streams as u64);
    let mut next_stream = 0u64;
    for (stream, seq) in vector.iter() {
        // Streams ascend strictly, so the gap never underflows.
        put_varint(&mut out, stream.get() - next_stream);
        put_varint(&mut out, seq);
        next_stream = stream.get().wrapping_add(1);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Decodes a binary token. Total: any byte string gives a vector or an error,
/// in time linear in its length, allocating at most a small multiple of it.
pub fn decode(bytes: &[u8]) -> Result<VersionVector, TokenError> {
    let body = checked_body(bytes)?;
    let mut reader = Reader { body, pos: 1 };
    let entries = read_entries(&mut reader)?;
    no_trailing_bytes(&reader)?;
    Ok(VersionVector::from_sorted_entries(entries))
}

fn no_trailing_bytes(reader: &Reader<'_>) -> Result<(), TokenError> {
    if reader.pos == reader.body.len() {
        Ok(())
    } else {
        Err(TokenError::TrailingBytes {
            offset: reader.pos,
            count: reader.body.len() - reader.pos,
        })
    }
}

/// Checks a binary token's envelope: its size, its version byte and its
/// checksum, in that order. Answers the body: every byte before the
/// checksum, the version byte included.
fn checked_body(bytes: &[u8]) -> Result<&[u8], TokenError> {
    if bytes.len() > TOKEN_BYTES_MAX {
        return Err(TokenError::TooLarge {
            len: bytes.len(),
            limit: TOKEN_BYTES_MAX,
        });
    }
    let Some(&version) = bytes.first() else {
        return Err(TokenError::Truncated {
            len: 0,
            field: "version",
        });
    };
    if version != TOKEN_VERSION {
        return Err(TokenError::UnknownVersion { version });
    }
    if bytes.len() < TOKEN_BYTES_MIN {
        return Err(TokenError::Truncated {
            len: bytes.len(),
            field: "stream count and checksum",
        });
    }
    checksummed(bytes)
}

/// Checks the CRC-32 at the end of `bytes` (at least [`CRC_BYTES`] long)
/// and answers the bytes before it.
fn checksummed(bytes: &[u8]) -> Result<&[u8], TokenError> {
    let (body, crc) = bytes.split_at(bytes.len() - CRC_BYTES);
    let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(TokenError::ChecksumMismatch { stored, computed });
    }
    Ok(body)
}

/// Reads the stream count and the entries it announces, from the reader's
/// position; what follows the last entry is the caller's to check.
fn read_entries(reader: &mut Reader<'_>) -> Result<Vec<(StreamId, u64)>, TokenError> {
    let body_len = reader.body.len();
    let streams = reader.varint("stream count")?;
    if streams > STREAMS_MAX as u64 {
        return Err(TokenError::TooManyStreams {
            streams,
            limit: STREAMS_MAX,
        });
    }
    // Every entry takes at least two bytes: a count the body cannot hold is
    // refused before any entry is read.
    if streams.saturating_mul(2) > (body_len - reader.pos) as u64 {
        return Err(TokenError::Truncated {
            len: body_len,
            field: "entries",
        });
    }
    // The count is at most half the remaining bytes: this allocation is
    // bounded by the input's length, whatever the count claims.
    let mut entries: Vec<(StreamId, u64)> = Vec::with_capacity(streams as usize);
    let mut next_stream = Some(0u64);
    for _ in 0..streams {
        let (stream, seq) = read_entry(reader, next_stream)?;
        entries.push((stream, seq));
        next_stream = stream.get().checked_add(1);
    }
    Ok(entries)
}

/// Reads one entry: its gap from `next_stream` (the id after the previous
/// entry's, `None` after stream `u64::MAX`) and its seq, which is not 0.
fn read_entry(
    reader: &mut Reader<'_>,
    next_stream: Option<u64>,
) -> Result<(StreamId, u64), TokenError> {
    let stream = read_stream(reader, next_stream)?;
    let offset = reader.pos;
    let seq = reader.varint("seq")?;
    if seq == 0 {
        return Err(TokenError::NonCanonical {
            offset,
            rule: CanonicalRule::ZeroEntry { stream },
        });
    }
    Ok((stream, seq))
}

/// Reads an entry's stream: its gap from `next_stream` (the id after the
/// previous entry's, `None` after stream `u64::MAX`).
fn read_stream(reader: &mut Reader<'_>, next_stream: Option<u64>) -> Result<StreamId, TokenError> {
    let offset = reader.pos;
    let gap = reader.varint("stream gap")?;
    // After stream u64::MAX no id remains: any further entry overflows.
    let id =
        next_stream
            .and_then(|next| next.checked_add(gap))
            .ok_or(TokenError::NonCanonical {
                offset,
                rule: CanonicalRule::StreamOverflow,
            })?;
    Ok(StreamId::new(id))
}

/// Encodes a vector as a text token: URL-safe base64 of [`encode`], without
/// padding, so it fits a query string unescaped.
///
/// ```
/// use meshlog_cursor::{token, VersionVector};
/// // The start of the log has a fixed token.
/// assert_eq!(token::encode_text(&VersionVector::new())?, token::START_TEXT);
/// # Ok::<(), meshlog_cursor::TokenError>(())
/// ```
pub fn encode_text(vector: &VersionVector) -> Result<String, TokenError> {
    Ok(URL_SAFE_NO_PAD.encode(encode(vector)?))
}

/// Decodes a text token; total like [`decode`], and canonical: only the text
/// [`encode_text`] gives is accepted (no padding, no stray trailing bits).
pub fn decode_text(text: &str) -> Result<VersionVector, TokenError> {
    decode(&text_bytes(text)?)
}

/// A text token's bytes: its length checked first, then its base64.
fn text_bytes(text: &str) -> Result<Vec<u8>, TokenError> {
    if text.len() > TOKEN_TEXT_MAX {
        return Err(TokenError::TextTooLarge {
            len: text.len(),
            limit: TOKEN_TEXT_MAX,
        });
    }
    URL_SAFE_NO_PAD.decode(text).map_err(base64_error(text))
}

/// The text token of the empty vector: the start of the log.
pub const START_TEXT: &str = "AQC-I8JY";

fn base64_error(text: &str) -> impl Fn(base64::DecodeError) -> TokenError + '_ {
    move |error| {
        let (offset, reason) = match error {
            base64::DecodeError::InvalidByte(offset, b'=') => (offset, "padding is not used"),
            base64::DecodeError::InvalidByte(offset, _) => {
                (offset, "character outside A-Z a-z 0-9 - _")
            }
            base64::DecodeError::InvalidLength(_) => {
                (text.len(), "length leaves a dangling character")
            }
            base64::DecodeError::InvalidLastSymbol(offset, _) => {
                (offset, "last character has nonzero unused bits")
            }
            base64::DecodeError::InvalidPadding => {
                (text.find('=').unwrap_or(text.len()), "padding is not used")
            }
        };
        TokenError::Base64 { offset, reason }
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

struct Reader<'a> {
    body: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    /// Reads one canonical varint: shortest form, at most 64 bits.
    fn varint(&mut self, field: &'static str) -> Result<u64, TokenError> {
        let start = self.pos;
        let mut value = 0u64;
        for i in 0..VARINT_BYTES_MAX {
            let Some(&byte) = self.body.get(self.pos) else {
                return Err(TokenError::Truncated {
                    len: self.body.len(),
                    field,
                });
            };
            self.pos += 1;
            let bits = u64::from(byte & 0x7f);
            // The tenth byte holds only bit 63.
            if i == VARINT_BYTES_MAX - 1 && bits > 1 {
                break;
            }
            value |= bits << (7 * i);
            if byte & 0x80 == 0 {
                // A last byte of zero after others means an overlong form.
                if i > 0 && byte == 0 {
                    break;
                }
                return Ok(value);
            }
        }
        Err(TokenError::NonCanonical {
            offset: start,
            rule: CanonicalRule::Varint,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_token_is_the_empty_vector() {
        assert_eq!(encode_text(&VersionVector::new()).unwrap(), START_TEXT);
        assert_eq!(decode_text(START_TEXT), Ok(VersionVector::new()));
    }

    #[test]
    fn varints_reject_overlong_and_oversized_forms() {
        let read = |bytes: &[u8]| {
            Reader {
                body: bytes,
                pos: 0,
            }
            .varint("test")
        };
        assert_eq!(read(&[0x00]), Ok(0));
        assert_eq!(read(&[0x7f]), Ok(127));
        assert_eq!(read(&[0x80, 0x01]), Ok(128));
        let mut max = Vec::new();
        put_varint(&mut max, u64::MAX);
        assert_eq!(max.len(), 10);
        assert_eq!(read(&max), Ok(u64::MAX));
        for bad in [
            &[0x80, 0x00][..],
            &[0xff, 0x80, 0x00],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
            &[
                0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
            ],
        ] {
            assert!(
                matches!(read(bad), Err(TokenError::NonCanonical { .. })),
                "{bad:?} accepted"
            );
        }
        assert!(matches!(read(&[0x80]), Err(TokenError::Truncated { .. })));
    }

    #[test]
    fn the_last_stream_id_is_representable_and_nothing_after_it() {
        let last: VersionVector = [(StreamId::new(u64::MAX), 1), (StreamId::new(0), 2)]
            .into_iter()
            .collect();
        assert_eq!(decode(&encode(&last).unwrap()), Ok(last));
    }
}
