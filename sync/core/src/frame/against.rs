//! A hello against a checkpoint ([`HelloAgainst`], kind 9): a hello's
//! marks and floor written as what differs from a checkpoint both sides
//! can name, so that a writer retired and compacted before the checkpoint
//! costs a hello nothing (`docs/PROTOCOL.md`, "A hello against a
//! checkpoint").
//!
//! Pure functions beside the codec: [`HelloAgainst::new`] writes a hello
//! against a checkpoint, [`HelloAgainst::expand`] rebuilds the hello from
//! the checkpoint of its name, refusing (a typed [`FrameError`]) what is
//! not the one way [`HelloAgainst::new`] writes it: every hello has
//! exactly one form against a given checkpoint.

use std::collections::BTreeSet;

use meshlog_cursor::{Checkpoint, CheckpointName, StreamId, VersionVector, STREAMS_MAX};

use super::{FrameError, Hello};

const KIND: &str = "hello against";

/// A [`Hello`] whose marks and floor are written against a checkpoint
/// (`base`): the marks as the streams where they are above it, the floor
/// as its entries on every stream that is not **folded**. A folded stream
/// is a stream of the checkpoint whose mark is the checkpoint's and whose
/// floor is that seq too: a writer retired and compacted to its head,
/// which is written nowhere. Build one with [`HelloAgainst::new`], read
/// it with [`HelloAgainst::expand`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloAgainst {
    /// The protocol version, as in a [`Hello`] (its first field, so that
    /// a peer of any version reads it).
    pub protocol: u16,
    /// The sender's own writer stream.
    pub stream: StreamId,
    /// The largest frame payload the sender takes, as in a [`Hello`]
    /// (its lowest bit: it skips kinds it does not know).
    pub frame_bytes_max: u32,
    /// The checkpoint the vectors are written against.
    pub base: CheckpointName,
    /// Every stream whose mark is above the checkpoint's, with its mark.
    pub marks: VersionVector,
    /// The streams of the checkpoint whose mark is the checkpoint's but
    /// whose floor is not that seq (a live writer): not folded. Strictly
    /// ascending, none in `marks`.
    pub unfolded: Vec<StreamId>,
    /// The floor on every stream that is not folded (streams with no
    /// floor are absent, as in any vector).
    pub floor: VersionVector,
}

impl HelloAgainst {
    /// `hello` written against `base`; `None` if its marks are below the
    /// checkpoint's somewhere (only a checkpoint the marks dominate can be
    /// a base: each stream's mark is then the checkpoint's or above).
    pub fn new(hello: &Hello, base: &Checkpoint) -> Option<HelloAgainst> {
        let checkpoint = base.vector();
        if !hello.marks.dominates(checkpoint) {
            return None;
        }
        let marks: VersionVector = hello
            .marks
            .iter()
            .filter(|&(stream, seq)| seq > checkpoint.get(stream))
            .collect();
        let folded =
            |stream: StreamId, seq: u64| marks.get(stream) == 0 && hello.floor.get(stream) == seq;
        let unfolded = checkpoint
            .iter()
            .filter(|&(stream, seq)| marks.get(stream) == 0 && !folded(stream, seq))
            .map(|(stream, _)| stream)
            .collect();
        let floor = hello
            .floor
            .iter()
            .filter(|&(stream, _)| {
                let seq = checkpoint.get(stream);
                seq == 0 || !folded(stream, seq)
            })
            .collect();
        Some(HelloAgainst {
            protocol: hello.protocol,
            stream: hello.stream,
            frame_bytes_max: hello.frame_bytes_max,
            base: base.name(),
            marks,
            unfolded,
            floor,
        })
    }

    /// The hello this stands for, rebuilt from `base`: marks `base ⊔
    /// marks`, floor `floor` and, on every folded stream, the checkpoint's
    /// seq.
    ///
    /// # Errors
    ///
    /// [`FrameError::Malformed`] (kind `hello against`) for a checkpoint
    /// of another name, and for a form [`HelloAgainst::new`] does not
    /// write: a mark not above the checkpoint's, unfolded streams not
    /// strictly ascending, an unfolded stream that is not the checkpoint's,
    /// whose mark moved or whose floor is the checkpoint's seq (it is
    /// folded), a floor written on a folded stream (its floor is the checkpoint's seq by being folded).
    /// [`FrameError::BadVector`] if the marks or the floor come to more
    /// than [`STREAMS_MAX`] streams.
    pub fn expand(&self, base: &Checkpoint) -> Result<Hello, FrameError> {
        let bad = |detail: String| FrameError::Malformed { kind: KIND, detail };
        if base.name() != self.base {
            return Err(bad(format!(
                "written against checkpoint {}, not {}",
                self.base,
                base.name()
            )));
        }
        let checkpoint = base.vector();
        if let Some((stream, seq)) = self
            .marks
            .iter()
            .find(|&(stream, seq)| seq <= checkpoint.get(stream))
        {
            return Err(bad(format!(
                "stream {stream}'s mark {seq} is not above the checkpoint's {}",
                checkpoint.get(stream)
            )));
        }
        if self.unfolded.windows(2).any(|pair| pair[1] <= pair[0]) {
            return Err(bad("unfolded streams are not strictly ascending".into()));
        }
        let unfolded: BTreeSet<StreamId> = self.unfolded.iter().copied().collect();
        if let Some(stream) = unfolded.iter().find(|&&stream| {
            let seq = checkpoint.get(stream);
            seq == 0 || self.marks.get(stream) > 0 || self.floor.get(stream) == seq
        }) {
            return Err(bad(format!(
                "stream {stream} is unfolded but is not the checkpoint's at its mark, \
                 or its floor is the checkpoint's seq"
            )));
        }
        let folded = |stream: StreamId| {
            checkpoint.get(stream) > 0 && self.marks.get(stream) == 0 && !unfolded.contains(&stream)
        };
        if let Some((stream, _)) = self.floor.iter().find(|&(stream, _)| folded(stream)) {
            return Err(bad(format!(
                "stream {stream} is folded: its floor is the checkpoint's, not written"
            )));
        }
        let marks = checkpoint.joined(&self.marks);
        let mut floor = self.floor.clone();
        floor.join(
            &checkpoint
                .iter()
                .filter(|&(stream, _)| folded(stream))
                .collect(),
        );
        for (field, vector) in [("marks", &marks), ("floor", &floor)] {
            if vector.len() > STREAMS_MAX {
                return Err(FrameError::BadVector {
                    kind: KIND,
                    field,
                    detail: format!("{} streams exceed the limit of {STREAMS_MAX}", vector.len()),
                });
            }
        }
        Ok(Hello {
            protocol: self.protocol,
            stream: self.stream,
            marks,
            floor,
            frame_bytes_max: self.frame_bytes_max,
        })
    }
}

#[cfg(test)]
mod tests {
    // Properties of the form, over seeded random hellos and checkpoints
    // (streams from a small pool, so that marks, floors and checkpoints
    // overlap in every way): a hello written against a checkpoint its
    // marks dominate rebuilds to itself and round trips on the wire; each
    // hello has one form (what decodes and expands re-encodes to the same
    // bytes, and any other form of it is refused); and retired, compacted
    // streams cost the frame nothing.
    use meshlog_testkit::rng::SplitMix64;
    use meshlog_testkit::seed::for_each_seed;

    use super::*;
    use crate::frame::{decode, encode, Frame, FRAME_BYTES_MAX, PROTOCOL_VERSION};

    fn vector(rng: &mut SplitMix64, pool: u64, seq_max: u64) -> VersionVector {
        let mut out = VersionVector::new();
        for s in 0..pool {
            if rng.chance(0.5) {
                out.advance(StreamId::new(s * 0x9e37_79b9 + 1), rng.between(1, seq_max));
            }
        }
        out
    }

    /// A hello and a checkpoint its marks dominate: marks = checkpoint ⊔
    /// some streams above it, floor at most the marks, some streams
    /// compacted to their head.
    fn hello_and_base(rng: &mut SplitMix64) -> (Hello, Checkpoint) {
        let checkpoint = vector(rng, 40, 5);
        let marks = checkpoint.joined(&vector(rng, 60, 9));
        let floor: VersionVector = marks
            .iter()
            .filter_map(|(stream, seq)| match rng.below(3) {
                0 => None,
                1 => Some((stream, seq)),
                _ => Some((stream, rng.between(1, seq))),
            })
            .collect();
        let hello = Hello {
            protocol: PROTOCOL_VERSION,
            stream: StreamId::new(rng.next_u64()),
            marks,
            floor,
            frame_bytes_max: FRAME_BYTES_MAX as u32 | 1,
        };
        (hello, Checkpoint::new(checkpoint).expect("small"))
    }

    #[test]
    fn a_hello_against_a_checkpoint_rebuilds_to_itself_and_round_trips() {
        for_each_seed("a_hello_against_a_checkpoint_rebuilds", 0x27, 300, |seed| {
            let mut rng = SplitMix64::new(seed);
            let (hello, base) = hello_and_base(&mut rng);
            let against = HelloAgainst::new(&hello, &base).expect("the marks dominate");
            assert_eq!(against.expand(&base), Ok(hello.clone()));
            let frame = Frame::HelloAgainst(against);
            let bytes = encode(&frame).unwrap();
            assert_eq!(decode(&bytes), Ok(frame));
            // Against a checkpoint of another vector, it is refused.
            let other = Checkpoint::new(base.vector().joined(&hello.marks)).unwrap();
            if other.name() != base.name() {
                let Ok(Frame::HelloAgainst(read)) = decode(&bytes) else {
                    unreachable!("decoded above")
                };
                assert!(read.expand(&other).is_err());
            }
        });
    }

    /// One form per hello: every other way to write the same hello
    /// against the same checkpoint (a stream moved between the marks,
    /// the unfolded set and the floor) is refused on expansion, and what
    /// expands re-encodes to the bytes it came from.
    #[test]
    fn every_other_form_of_a_hello_is_refused() {
        for_each_seed(
            "every_other_form_of_a_hello_is_refused",
            0x2727,
            300,
            |seed| {
                let mut rng = SplitMix64::new(seed);
                let (hello, base) = hello_and_base(&mut rng);
                let canonical = HelloAgainst::new(&hello, &base).unwrap();
                let checkpoint = base.vector();
                let mut forms = Vec::new();
                for (stream, seq) in checkpoint.iter() {
                    // A mark written at the checkpoint's seq.
                    let mut form = canonical.clone();
                    form.marks.advance(stream, seq);
                    forms.push(form);
                    // A folded stream's floor written, alone or with the
                    // stream named unfolded (named alone, it is another
                    // hello's form: one whose floor there is 0).
                    let folded = hello.marks.get(stream) == seq && hello.floor.get(stream) == seq;
                    if folded {
                        let mut form = canonical.clone();
                        form.floor.advance(stream, seq);
                        forms.push(form.clone());
                        form.unfolded.push(stream);
                        form.unfolded.sort();
                        forms.push(form);
                    }
                }
                for form in forms.into_iter().filter(|form| *form != canonical) {
                    let expanded = form.expand(&base);
                    assert!(expanded.is_err(), "{form:?} expanded to {expanded:?}");
                }
                let bytes = encode(&Frame::HelloAgainst(canonical)).unwrap();
                let Ok(Frame::HelloAgainst(read)) = decode(&bytes) else {
                    panic!("decodes")
                };
                let again = HelloAgainst::new(&read.expand(&base).unwrap(), &base).unwrap();
                assert_eq!(encode(&Frame::HelloAgainst(again)).unwrap(), bytes);
            },
        );
    }

    /// What issue 27's writer churn asks of a hello: 10,000 writers
    /// retired and compacted before the checkpoint cost it nothing; the
    /// whole hello carries each of them twice.
    #[test]
    fn retired_compacted_writers_cost_a_hello_against_a_checkpoint_nothing() {
        let retired: VersionVector = (0..10_000u64)
            .map(|i| {
                (
                    StreamId::new((i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                    3,
                )
            })
            .collect();
        let live: VersionVector = (0..20u64).map(|i| (StreamId::new(i + 1), 7)).collect();
        let base = Checkpoint::new(retired.joined(&live)).unwrap();
        let hello_with = |retired: &VersionVector| Hello {
            protocol: PROTOCOL_VERSION,
            stream: StreamId::new(1),
            marks: retired.joined(&live),
            floor: retired.clone(),
            frame_bytes_max: FRAME_BYTES_MAX as u32 | 1,
        };
        let whole = encode(&Frame::Hello(hello_with(&retired))).unwrap().len();
        let against = HelloAgainst::new(&hello_with(&retired), &base).unwrap();
        let against = encode(&Frame::HelloAgainst(against)).unwrap().len();
        let none = Checkpoint::new(live.clone()).unwrap();
        let alone = HelloAgainst::new(&hello_with(&VersionVector::new()), &none).unwrap();
        let alone = encode(&Frame::HelloAgainst(alone)).unwrap().len();
        println!("10,000 retired: whole hello {whole} bytes, against a checkpoint {against}; none retired: {alone}");
        assert!(whole > 10_000 * 2 * 9, "{whole}");
        // The live writers are unfolded (their floor is not their mark);
        // the retired ones are written nowhere.
        assert_eq!(against, alone);
    }
}
