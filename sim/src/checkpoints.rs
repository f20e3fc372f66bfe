//! Checkpoints in the mesh, as `docs/TOKEN.md` proposes them for the
//! replica and sync (which do not have them yet): each replica keeps the
//! last [`CHECKPOINTS_KEPT`] checkpoints it minted or received, mints one
//! from its marks when even the best of them differs from its marks on more
//! than [`CHECKPOINT_DIFF_MAX`](token::CHECKPOINT_DIFF_MAX) streams (and the newest is at least
//! [`MINT_INTERVAL`] old, so a mesh under writes does not mint on every
//! step), and floods every checkpoint it did not know to its connected
//! peers. A replica answers a token as version 2 relative to the known
//! checkpoint that gives the shortest text, or as version 1 when that is
//! shorter or no checkpoint is within the bound.
//!
//! The gossip is a cost model, not a frame of the protocol core: a
//! checkpoint travels on the simulated links with their latency, loss and
//! duplication (and only while the link's connection is up), and its bytes
//! are what a frame carrying it would take: its name and its parent's, and
//! the streams where it differs from its parent as sync-core encodes a
//! marks difference.

use std::rc::Rc;
use std::time::Duration;

use meshlog_cursor::token;
use meshlog_cursor::{Checkpoint, CheckpointName, TokenError, VersionVector};
use meshlog_sync_core::frame::{self, Frame, MarksDiff, Receipt};

/// The checkpoints a replica keeps, by arrival (`docs/TOKEN.md`).
pub const CHECKPOINTS_KEPT: usize = 16;

/// The least time between two checkpoints a replica mints or adopts.
pub const MINT_INTERVAL: Duration = Duration::from_secs(2);

/// A checkpoint in the mesh: the checkpoint, its generation (its parent's
/// plus one: the newest of two is the higher generation, then the higher
/// name, so every replica agrees which is newest) and when it was minted.
#[derive(Debug)]
pub struct Minted {
    /// The checkpoint.
    pub checkpoint: Checkpoint,
    /// Its parent's generation plus one (1 for a first checkpoint).
    pub generation: u64,
    /// When it was minted (simulated).
    pub minted_at: Duration,
    /// The bytes a frame carrying it takes on the wire.
    pub wire_bytes: u64,
}

/// One replica's checkpoints.
#[derive(Debug, Default)]
pub struct Kept {
    /// Oldest first, at most [`CHECKPOINTS_KEPT`].
    checkpoints: Vec<Rc<Minted>>,
    /// A mint is scheduled.
    pub mint_pending: bool,
}

impl Kept {
    /// The newest checkpoint kept.
    pub fn newest(&self) -> Option<&Rc<Minted>> {
        self.checkpoints
            .iter()
            .max_by_key(|m| (m.generation, m.checkpoint.name()))
    }

    /// The checkpoint named `name`, if kept.
    pub fn named(&self, name: CheckpointName) -> Option<&Checkpoint> {
        self.checkpoints
            .iter()
            .map(|m| &m.checkpoint)
            .find(|c| c.name() == name)
    }

    /// Keeps `minted` unless it is known; whether it was new.
    pub fn keep(&mut self, minted: &Rc<Minted>) -> bool {
        if self.named(minted.checkpoint.name()).is_some() {
            return false;
        }
        if self.checkpoints.len() == CHECKPOINTS_KEPT {
            self.checkpoints.remove(0);
        }
        self.checkpoints.push(Rc::clone(minted));
        true
    }

    /// Whether a replica at `marks` should mint at `now`: no checkpoint
    /// it keeps is within the bound of its marks, and the newest is at
    /// least [`MINT_INTERVAL`] old.
    pub fn should_mint(&self, marks: &VersionVector, now: Duration) -> bool {
        if let Some(newest) = self.newest() {
            if now < newest.minted_at + MINT_INTERVAL {
                return false;
            }
        }
        !self
            .checkpoints
            .iter()
            .any(|m| token::encode_relative(marks, &m.checkpoint).is_ok())
    }

    /// Mints a checkpoint of `marks`, the child of the newest kept.
    pub fn mint(&mut self, marks: VersionVector, now: Duration) -> Rc<Minted> {
        let parent = self.newest().cloned();
        let wire_bytes = wire_bytes(parent.as_deref(), &marks);
        let checkpoint = Checkpoint::new(marks).expect("marks are within STREAMS_MAX");
        let minted = Rc::new(Minted {
            checkpoint,
            generation: parent.map_or(1, |p| p.generation + 1),
            minted_at: now,
            wire_bytes,
        });
        self.keep(&minted);
        minted
    }

    /// `cursor`'s token as this replica would answer it: the shortest of
    /// version 2 against each checkpoint kept and version 1. Answers the
    /// text, the checkpoint it is relative to (`None` for version 1), and
    /// whether version 2 was refused for too many differences from every
    /// checkpoint kept (the fallback the bench counts).
    pub fn token(&self, cursor: &VersionVector) -> Answer {
        let mut best: Option<(String, CheckpointName)> = None;
        let mut refused = 0;
        for minted in &self.checkpoints {
            match token::encode_relative_text(cursor, &minted.checkpoint) {
                Ok(text) if best.as_ref().is_none_or(|(b, _)| text.len() < b.len()) => {
                    best = Some((text, minted.checkpoint.name()));
                }
                Ok(_) => {}
                Err(TokenError::TooManyDifferences { .. })
                | Err(TokenError::DifferenceOutOfRange { .. }) => refused += 1,
                Err(other) => panic!("a cursor of a replica encodes: {other}"),
            }
        }
        let v1 = token::encode_text(cursor).expect("a cursor is within STREAMS_MAX");
        let fell_back = best.is_none() && refused > 0;
        match best {
            Some((text, name)) if text.len() < v1.len() => Answer {
                text,
                checkpoint: Some(name),
                fell_back,
            },
            _ => Answer {
                text: v1,
                checkpoint: None,
                fell_back,
            },
        }
    }
}

/// A replica's token for a cursor: see [`Kept::token`].
#[derive(Debug, Clone)]
pub struct Answer {
    /// The text token.
    pub text: String,
    /// The checkpoint a version-2 token is relative to.
    pub checkpoint: Option<CheckpointName>,
    /// Version 1 because every checkpoint kept was beyond the bound.
    pub fell_back: bool,
}

/// What a frame carrying a checkpoint would take: a length prefix and a
/// kind, its name and its parent's (16 bytes each), its generation, and its
/// difference from the parent as sync-core encodes a marks difference (the
/// changed streams with their seqs). A stream the parent has and the child
/// lacks would need one more entry; marks only rise, so a child minted from
/// marks lacks one only if its parent came from a replica ahead of it, and
/// it is not counted.
fn wire_bytes(parent: Option<&Minted>, vector: &VersionVector) -> u64 {
    let empty = VersionVector::new();
    let base = parent.map_or(&empty, |p| p.checkpoint.vector());
    let changes: VersionVector = vector
        .iter()
        .filter(|&(stream, seq)| base.get(stream) != seq)
        .collect();
    let generation = parent.map_or(1, |p| p.generation + 1);
    let heartbeat = Frame::Heartbeat(Receipt {
        received: 0,
        seen: 0,
        marks: MarksDiff {
            number: generation,
            base: generation - 1,
            changes,
        },
    });
    let bytes = frame::encode(&heartbeat).expect("a marks difference encodes");
    // The heartbeat's own receipt numbers stand for the generation; the
    // names are added.
    (bytes.len() + 2 * meshlog_cursor::CHECKPOINT_NAME_BYTES) as u64
}
