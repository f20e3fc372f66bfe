//! Version 2: a cursor relative to a [`Checkpoint`], as the checkpoint's
//! name and the streams where the cursor differs from it.
//!
//! ```text
//! token   = version name n entry{n} crc32
//! version = 0x02
//! name    = 16 bytes        ; the checkpoint's name
//! n       = varint          ; differences, 0 ..= CHECKPOINT_DIFF_MAX
//! entry   = gap diff        ; one per stream where cursor and checkpoint differ
//! gap     = varint          ; as in version 1
//! diff    = varint          ; zig-zag of cursor[s] - checkpoint[s] (an i64), never 0
//! crc32   = 4 bytes LE      ; CRC-32 (IEEE) of every byte before it, as in version 1
//! ```

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use super::{put_varint, Reader, TokenError, CRC_BYTES};
use crate::checkpoint::CHECKPOINT_NAME_BYTES;
use crate::{CanonicalRule, Checkpoint, CheckpointName, StreamId, VersionVector, STREAMS_MAX};

/// The version byte of a token relative to a checkpoint.
pub const TOKEN_VERSION_RELATIVE: u8 = 2;

/// The most streams a version-2 token may differ from its checkpoint on.
/// A cursor that differs on more is written as version 1
/// ([`TokenError::TooManyDifferences`] tells the encoder's caller so).
pub const CHECKPOINT_DIFF_MAX: usize = 128;

/// The largest version-2 token: version, name, a two-byte count, two
/// ten-byte varints per difference, checksum: 2,583 bytes.
pub const RELATIVE_BYTES_MAX: usize =
    1 + CHECKPOINT_NAME_BYTES + 2 + CHECKPOINT_DIFF_MAX * 2 * super::VARINT_BYTES_MAX + CRC_BYTES;

/// The largest version-2 text token: base64 of [`RELATIVE_BYTES_MAX`]
/// bytes, no padding: 3,444 characters.
pub const RELATIVE_TEXT_MAX: usize = (RELATIVE_BYTES_MAX * 4).div_ceil(3);

/// The smallest version-2 token (the cursor is the checkpoint): version,
/// name, a zero count, checksum.
const RELATIVE_BYTES_MIN: usize = 1 + CHECKPOINT_NAME_BYTES + 1 + CRC_BYTES;

/// A token of either version, decoded by [`decode_any`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// Version 1: the cursor itself.
    Absolute(VersionVector),
    /// Version 2: the cursor relative to a checkpoint, which
    /// [`RelativeCursor::expand`] needs to make it a cursor.
    Relative(RelativeCursor),
}

impl Token {
    /// The token's canonical bytes: for a decoded token, exactly the bytes
    /// it was decoded from.
    pub fn encode(&self) -> Result<Vec<u8>, TokenError> {
        match self {
            Token::Absolute(vector) => super::encode(vector),
            Token::Relative(relative) => Ok(relative.encode()),
        }
    }
}

/// Decodes a binary token of either version: version 1 as [`decode`](super::decode) does,
/// version 2 into a [`RelativeCursor`]. Total, like [`decode`](super::decode); a version-2
/// token is bounded by [`RELATIVE_BYTES_MAX`] and its checksum is checked
/// before any field is read.
pub fn decode_any(bytes: &[u8]) -> Result<Token, TokenError> {
    match bytes.first() {
        Some(&TOKEN_VERSION_RELATIVE) => decode_relative(bytes).map(Token::Relative),
        _ => super::decode(bytes).map(Token::Absolute),
    }
}

/// Decodes a text token of either version; total and canonical like
/// [`decode_text`](super::decode_text).
pub fn decode_any_text(text: &str) -> Result<Token, TokenError> {
    decode_any(&super::text_bytes(text)?)
}

/// Encodes `cursor` as a version-2 token relative to `checkpoint`.
///
/// Refused, so that the caller writes version 1 ([`encode`](super::encode)) instead, when
/// the cursor differs from the checkpoint on more than
/// [`CHECKPOINT_DIFF_MAX`] streams ([`TokenError::TooManyDifferences`]) or
/// by more than an `i64` on one ([`TokenError::DifferenceOutOfRange`]), or
/// has more than [`STREAMS_MAX`] streams.
pub fn encode_relative(
    cursor: &VersionVector,
    checkpoint: &Checkpoint,
) -> Result<Vec<u8>, TokenError> {
    Ok(relative(cursor, checkpoint)?.encode())
}

/// [`encode_relative`] as URL-safe base64 text without padding.
pub fn encode_relative_text(
    cursor: &VersionVector,
    checkpoint: &Checkpoint,
) -> Result<String, TokenError> {
    Ok(URL_SAFE_NO_PAD.encode(encode_relative(cursor, checkpoint)?))
}

/// A decoded version-2 token: a checkpoint's name and the cursor's
/// differences from it. [`RelativeCursor::expand`] makes it a cursor again,
/// given the checkpoint of that name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelativeCursor {
    checkpoint: CheckpointName,
    /// Strictly ascending streams, nonzero differences, at most
    /// [`CHECKPOINT_DIFF_MAX`].
    differences: Vec<(StreamId, i64)>,
}

impl RelativeCursor {
    /// The name of the checkpoint this cursor is relative to.
    pub fn checkpoint(&self) -> CheckpointName {
        self.checkpoint
    }

    /// Per stream where the cursor differs from its checkpoint,
    /// `cursor[s] - checkpoint[s]`: strictly ascending streams, none 0.
    pub fn differences(&self) -> &[(StreamId, i64)] {
        &self.differences
    }

    /// The cursor: `checkpoint ⊕ differences`. Never guesses: a checkpoint
    /// of another name is [`TokenError::CheckpointMismatch`], a difference
    /// that takes a seq below 0 or past 2^64 − 1 is
    /// [`TokenError::SeqOutOfRange`], and a cursor of more than
    /// [`STREAMS_MAX`] streams is [`TokenError::TooManyStreams`].
    pub fn expand(&self, checkpoint: &Checkpoint) -> Result<VersionVector, TokenError> {
        if checkpoint.name() != self.checkpoint {
            return Err(TokenError::CheckpointMismatch {
                token: self.checkpoint,
                given: checkpoint.name(),
            });
        }
        // Merge the checkpoint's entries with the differences, both sorted.
        let mut entries = Vec::with_capacity(checkpoint.vector().len() + self.differences.len());
        let mut base = checkpoint.vector().iter().peekable();
        for &(stream, difference) in &self.differences {
            while let Some(&(s, seq)) = base.peek() {
                if s >= stream {
                    break;
                }
                entries.push((s, seq));
                base.next();
            }
            let checkpoint_seq = base
                .next_if(|&(s, _)| s == stream)
                .map_or(0, |(_, seq)| seq);
            let seq =
                checkpoint_seq
                    .checked_add_signed(difference)
                    .ok_or(TokenError::SeqOutOfRange {
                        stream,
                        checkpoint_seq,
                        difference,
                    })?;
            if seq > 0 {
                entries.push((stream, seq));
            }
        }
        entries.extend(base);
        if entries.len() > STREAMS_MAX {
            return Err(TokenError::TooManyStreams {
                streams: entries.len() as u64,
                limit: STREAMS_MAX,
            });
        }
        Ok(VersionVector::from_sorted_entries(entries))
    }

    /// The canonical bytes of this cursor: the one version-2 token for it.
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RELATIVE_BYTES_MIN + self.differences.len() * 11);
        out.push(TOKEN_VERSION_RELATIVE);
        out.extend_from_slice(self.checkpoint.as_bytes());
        put_varint(&mut out, self.differences.len() as u64);
        let mut next_stream = 0u64;
        for &(stream, difference) in &self.differences {
            put_varint(&mut out, stream.get() - next_stream);
            put_varint(&mut out, zigzag(difference));
            next_stream = stream.get().wrapping_add(1);
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
}

/// `cursor` relative to `checkpoint`: the streams where they differ, and by
/// how much. Refuses (so that the caller writes version 1) a cursor that
/// differs on more than [`CHECKPOINT_DIFF_MAX`] streams
/// ([`TokenError::TooManyDifferences`], with the exact count), or by more
/// than an `i64` on one ([`TokenError::DifferenceOutOfRange`]), or of more
/// than [`STREAMS_MAX`] streams.
fn relative(cursor: &VersionVector, checkpoint: &Checkpoint) -> Result<RelativeCursor, TokenError> {
    if cursor.len() > STREAMS_MAX {
        return Err(TokenError::TooManyStreams {
            streams: cursor.len() as u64,
            limit: STREAMS_MAX,
        });
    }
    let mut differences = Vec::new();
    let mut count = 0usize;
    let mut out_of_range = None;
    for (stream, cursor_seq, checkpoint_seq) in differing(cursor, checkpoint.vector()) {
        count += 1;
        if count > CHECKPOINT_DIFF_MAX {
            continue; // counted only, for the error
        }
        let difference = i128::from(cursor_seq) - i128::from(checkpoint_seq);
        match i64::try_from(difference) {
            Ok(difference) => differences.push((stream, difference)),
            Err(_) => {
                out_of_range.get_or_insert(TokenError::DifferenceOutOfRange {
                    stream,
                    cursor_seq,
                    checkpoint_seq,
                });
            }
        }
    }
    if count > CHECKPOINT_DIFF_MAX {
        return Err(TokenError::TooManyDifferences {
            differences: count,
            limit: CHECKPOINT_DIFF_MAX,
        });
    }
    if let Some(error) = out_of_range {
        return Err(error);
    }
    Ok(RelativeCursor {
        checkpoint: checkpoint.name(),
        differences,
    })
}

/// The streams where `a` and `b` differ, ascending, with both seqs.
fn differing<'a>(
    a: &'a VersionVector,
    b: &'a VersionVector,
) -> impl Iterator<Item = (StreamId, u64, u64)> + 'a {
    let mut a = a.iter().peekable();
    let mut b = b.iter().peekable();
    std::iter::from_fn(move || loop {
        let next = match (a.peek().copied(), b.peek().copied()) {
            (None, None) => return None,
            (Some((s, x)), None) => {
                a.next();
                (s, x, 0)
            }
            (None, Some((s, y))) => {
                b.next();
                (s, 0, y)
            }
            (Some((s, x)), Some((t, y))) => match s.cmp(&t) {
                std::cmp::Ordering::Less => {
                    a.next();
                    (s, x, 0)
                }
                std::cmp::Ordering::Greater => {
                    b.next();
                    (t, 0, y)
                }
                std::cmp::Ordering::Equal => {
                    a.next();
                    b.next();
                    (s, x, y)
                }
            },
        };
        if next.1 != next.2 {
            return Some(next);
        }
    })
}

/// Decodes a version-2 token (the caller saw its version byte). The
/// envelope first, in this order: the size bound, the smallest size, the
/// checksum; then the name, the count and the entries.
fn decode_relative(bytes: &[u8]) -> Result<RelativeCursor, TokenError> {
    if bytes.len() > RELATIVE_BYTES_MAX {
        return Err(TokenError::TooLarge {
            len: bytes.len(),
            limit: RELATIVE_BYTES_MAX,
        });
    }
    if bytes.len() < RELATIVE_BYTES_MIN {
        return Err(TokenError::Truncated {
            len: bytes.len(),
            field: "checkpoint name, difference count and checksum",
        });
    }
    let body = super::checksummed(bytes)?;
    let mut name = [0; CHECKPOINT_NAME_BYTES];
    name.copy_from_slice(&body[1..1 + CHECKPOINT_NAME_BYTES]);
    let mut reader = Reader {
        body,
        pos: 1 + CHECKPOINT_NAME_BYTES,
    };
    let count = reader.varint("difference count")?;
    if count > CHECKPOINT_DIFF_MAX as u64 {
        return Err(TokenError::TooManyDifferences {
            differences: usize::try_from(count).unwrap_or(usize::MAX),
            limit: CHECKPOINT_DIFF_MAX,
        });
    }
    // Every entry takes at least two bytes.
    if count * 2 > (body.len() - reader.pos) as u64 {
        return Err(TokenError::Truncated {
            len: body.len(),
            field: "entries",
        });
    }
    let mut differences = Vec::with_capacity(count as usize);
    let mut next_stream = Some(0u64);
    for _ in 0..count {
        let stream = super::read_stream(&mut reader, next_stream)?;
        let offset = reader.pos;
        let zigzagged = reader.varint("difference")?;
        if zigzagged == 0 {
            return Err(TokenError::NonCanonical {
                offset,
                rule: CanonicalRule::ZeroDifference { stream },
            });
        }
        differences.push((stream, unzigzag(zigzagged)));
        next_stream = stream.get().checked_add(1);
    }
    super::no_trailing_bytes(&reader)?;
    Ok(RelativeCursor {
        checkpoint: CheckpointName::from_bytes(name),
        differences,
    })
}

/// Zig-zag: 0, -1, 1, -2, 2, ... as 0, 1, 2, 3, 4, ..., so a small
/// difference of either sign is a short varint.
fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_maps_small_magnitudes_to_small_values_and_round_trips() {
        for (value, coded) in [
            (0i64, 0u64),
            (-1, 1),
            (1, 2),
            (-2, 3),
            (8191, 16382),
            (-8192, 16383),
            (i64::MAX, u64::MAX - 1),
            (i64::MIN, u64::MAX),
        ] {
            assert_eq!(zigzag(value), coded, "{value}");
            assert_eq!(unzigzag(coded), value, "{coded}");
        }
    }

    #[test]
    fn the_documented_bounds_are_the_constants() {
        assert_eq!(RELATIVE_BYTES_MAX, 2_583);
        assert_eq!(RELATIVE_TEXT_MAX, 3_444);
        assert_eq!(RELATIVE_BYTES_MIN, 22);
    }
}
