//! The serde representation: the private types postcard writes for a
//! hello's fields and for version vectors, converted to and from the domain
//! types at this boundary.
//!
//! `meshlog-cursor` and `meshlog-replica` keep their types free of serde (a
//! serializable type is a boundary type), so the mapping lives here, beside
//! [`check_counts`], which walks the same postcard layout to refuse a
//! vector's count above its limit before anything is decoded for it.

use std::fmt;
use std::marker::PhantomData;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_cursor::{CHECKPOINT_NAME_BYTES, STREAMS_MAX};
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{tag, FrameError};

/// A hello's fields after its kind, in the order postcard writes them; the
/// protocol version first, so a peer of any version can read it.
#[derive(Serialize, Deserialize)]
pub(super) struct HelloRepr {
    pub(super) protocol: u16,
    pub(super) stream: u64,
    pub(super) marks: VectorRepr,
    pub(super) floor: VectorRepr,
    pub(super) frame_bytes_max: u32,
}

/// An ack's or heartbeat's fields after its kind: the last delta number
/// received, the peer's marks number held, then the sender's marks as a
/// difference (its number, how many numbers back its base is, the changes).
#[derive(Serialize, Deserialize)]
pub(super) struct ReceiptRepr {
    pub(super) received: u64,
    pub(super) seen: u64,
    pub(super) number: u64,
    pub(super) back: u64,
    pub(super) changes: VectorRepr,
}

/// A routes frame's fields after its kind: its number, then the streams
/// the sender asks to be quiet and those it asks to be loud again.
#[derive(Serialize, Deserialize)]
pub(super) struct RoutesRepr {
    pub(super) number: u64,
    pub(super) quiet: StreamsRepr,
    pub(super) loud: StreamsRepr,
}

/// A checkpoint frame's fields after its kind: its name (16 bytes), its
/// parent's name if it is a difference (a byte 0 or 1, then 16 bytes),
/// and the changes.
#[derive(Serialize, Deserialize)]
pub(super) struct CheckpointRepr {
    pub(super) name: [u8; CHECKPOINT_NAME_BYTES],
    pub(super) parent: Option<[u8; CHECKPOINT_NAME_BYTES]>,
    pub(super) changes: VectorRepr,
}

/// A hello against a checkpoint's fields after its kind: the protocol
/// version first (as a hello's), the stream, the checkpoint's name (16
/// bytes), the marks above it, the unfolded streams, the floor, and the
/// frame limit.
#[derive(Serialize, Deserialize)]
pub(super) struct HelloAgainstRepr {
    pub(super) protocol: u16,
    pub(super) stream: u64,
    pub(super) base: [u8; CHECKPOINT_NAME_BYTES],
    pub(super) marks: VectorRepr,
    pub(super) unfolded: StreamsRepr,
    pub(super) floor: VectorRepr,
    pub(super) frame_bytes_max: u32,
}

/// A set of streams on the wire: their ids, strictly ascending.
#[derive(Serialize, Deserialize)]
pub(super) struct StreamsRepr(Seq<u64>);

impl StreamsRepr {
    pub(super) fn into_streams(
        self,
        kind: &'static str,
        field: &'static str,
    ) -> Result<Vec<StreamId>, FrameError> {
        let streams = self.0 .0;
        let bad = |detail: String| FrameError::BadVector {
            kind,
            field,
            detail,
        };
        if streams.len() > STREAMS_MAX {
            return Err(bad(format!(
                "{} streams exceed the limit of {STREAMS_MAX}",
                streams.len()
            )));
        }
        if let Some(pair) = streams.windows(2).find(|pair| pair[1] <= pair[0]) {
            return Err(bad(format!(
                "stream {} follows stream {}: streams must be strictly ascending",
                StreamId::new(pair[1]),
                StreamId::new(pair[0])
            )));
        }
        Ok(streams.into_iter().map(StreamId::new).collect())
    }
}

/// A version vector on the wire: `(stream, seq)` pairs, streams strictly
/// ascending, seqs nonzero.
#[derive(Serialize, Deserialize)]
pub(super) struct VectorRepr(Seq<(u64, u64)>);

/// A sequence that is grown as its elements are read, never reserved by the
/// count the input announces: every element takes at least one input byte,
/// so memory stays proportional to what was actually decoded. (serde's own
/// `Vec` impl reserves by the announced count, up to 1 MiB; postcard happens
/// to refuse counts above the bytes left, but that is its flavor's choice,
/// not a contract this boundary should rest on.)
struct Seq<T>(Vec<T>);

impl<T: Serialize> Serialize for Seq<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Seq<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SeqVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for SeqVisitor<T> {
            type Value = Seq<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Seq<T>, A::Error> {
                let mut out = Vec::new();
                while let Some(element) = seq.next_element()? {
                    out.push(element);
                }
                Ok(Seq(out))
            }
        }

        deserializer.deserialize_seq(SeqVisitor(PhantomData))
    }
}

impl VectorRepr {
    pub(super) fn into_vector(
        self,
        kind: &'static str,
        field: &'static str,
    ) -> Result<VersionVector, FrameError> {
        let entries = self.0 .0;
        let bad = |detail: String| FrameError::BadVector {
            kind,
            field,
            detail,
        };
        // Also checked before decoding (`check_counts`); kept here so that
        // no vector over the limit is built whatever path led here.
        if entries.len() > STREAMS_MAX {
            return Err(bad(format!(
                "{} streams exceed the limit of {STREAMS_MAX}",
                entries.len()
            )));
        }
        let mut previous: Option<u64> = None;
        for &(stream, seq) in &entries {
            if seq == 0 {
                return Err(bad(format!("stream {} has seq 0", StreamId::new(stream))));
            }
            if let Some(previous) = previous {
                if stream <= previous {
                    return Err(bad(format!(
                        "stream {} follows stream {}: streams must be strictly ascending",
                        StreamId::new(stream),
                        StreamId::new(previous)
                    )));
                }
            }
            previous = Some(stream);
        }
        Ok(entries
            .into_iter()
            .map(|(stream, seq)| (StreamId::new(stream), seq))
            .collect())
    }
}

/// One `T` from the front of `bytes`, if they parse.
fn take<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<(T, &[u8])> {
    postcard::take_from_bytes::<T>(bytes).ok()
}

/// Reads a sequence's count, refuses it above `STREAMS_MAX`, and skips
/// its elements (`E`: a vector's `(stream, seq)` entries, or a set's
/// stream ids); `Ok(None)` if the bytes do not parse.
fn skip_seq<'a, E: serde::de::DeserializeOwned>(
    bytes: &'a [u8],
    kind: &'static str,
    field: &'static str,
) -> Result<Option<&'a [u8]>, FrameError> {
    let Some((count, mut rest)) = take::<u64>(bytes) else {
        return Ok(None);
    };
    if count > STREAMS_MAX as u64 {
        return Err(FrameError::BadVector {
            kind,
            field,
            detail: format!("{count} streams exceed the limit of {STREAMS_MAX}"),
        });
    }
    for _ in 0..count {
        let Some((_, after)) = take::<E>(rest) else {
            return Ok(None);
        };
        rest = after;
    }
    Ok(Some(rest))
}

/// Checks the counts of the payload's vectors against their limit (at most
/// [`STREAMS_MAX`] entries) before anything is decoded for their entries. A
/// delta's event counts are checked by `decode_events` as it reads them.
///
/// postcard writes a sequence's count (a varint) before its elements, so
/// this walks the payload's layout reading varints only, skipping vector
/// entries without storing them: it allocates nothing. Bytes that do not
/// parse are left to the decoder, which reports them as it would without
/// this check.
pub(super) fn check_counts(tag: u32, kind: &'static str, payload: &[u8]) -> Result<(), FrameError> {
    let skip_vector = skip_seq::<(u64, u64)>;
    let skip_streams = skip_seq::<u64>;

    let Some((_, body)) = take::<u32>(payload) else {
        return Ok(());
    };
    match tag {
        tag::HELLO => {
            let Some((_, vectors)) = take::<(u16, u64)>(body) else {
                return Ok(());
            };
            if let Some(floor) = skip_vector(vectors, kind, "marks")? {
                skip_vector(floor, kind, "floor")?;
            }
        }
        tag::DELTA => {
            // The event counts are checked by `decode_events`, which reads
            // them before anything else of the events.
            let Some((_, floor)) = take::<u64>(body) else {
                return Ok(());
            };
            skip_vector(floor, kind, "floor")?;
        }
        tag::ROUTES => {
            // Two sets of streams, each a count then the ids.
            let Some((_, quiet)) = take::<u64>(body) else {
                return Ok(());
            };
            if let Some(loud) = skip_streams(quiet, kind, "quiet")? {
                skip_streams(loud, kind, "loud")?;
            }
        }
        tag::CHECKPOINT => {
            type Names = (
                [u8; CHECKPOINT_NAME_BYTES],
                Option<[u8; CHECKPOINT_NAME_BYTES]>,
            );
            let Some((_, changes)) = take::<Names>(body) else {
                return Ok(());
            };
            skip_vector(changes, kind, "changes")?;
        }
        tag::CHECKPOINT_WANT => {}
        tag::HELLO_AGAINST => {
            type Head = (u16, u64, [u8; CHECKPOINT_NAME_BYTES]);
            let Some((_, marks)) = take::<Head>(body) else {
                return Ok(());
            };
            let Some(unfolded) = skip_vector(marks, kind, "marks")? else {
                return Ok(());
            };
            if let Some(floor) = skip_streams(unfolded, kind, "unfolded")? {
                skip_vector(floor, kind, "floor")?;
            }
        }
        _ => {
            let Some((_, changes)) = take::<(u64, u64, u64, u64)>(body) else {
                return Ok(());
            };
            skip_vector(changes, kind, "changes")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    // A vector postcard can read is still refused unless it is canonical:
    // streams strictly ascending, no zero seq.
    use crate::frame::{decode_payload as decode, FrameError};

    #[test]
    fn non_canonical_vectors_are_refused() {
        // Ack (received 0, seen 0, marks 1 from 0) with two changes, streams
        // descending.
        let err = decode(&[2, 0, 0, 1, 1, 2, 5, 1, 3, 1]).unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::BadVector {
                    field: "changes",
                    ..
                }
            ),
            "{err}"
        );
        // Ack with a zero seq.
        let err = decode(&[2, 0, 0, 1, 1, 1, 5, 0]).unwrap_err();
        assert!(matches!(err, FrameError::BadVector { .. }), "{err}");
    }
}
