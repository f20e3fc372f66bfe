//! `Admission`: how much of a received delta a replica can take under its
//! limits, asked before applying it (see [`Replica::admission`]), so that
//! a sync session cuts a delta to it instead of re-checking the limits
//! itself.
//!
//! [`Replica::admission`]: crate::Replica::admission

use meshlog_cursor::StreamId;

use crate::{Delta, DeltaColumns};

/// How much of a delta a replica can take under its limits
/// ([`Config::streams_max`](crate::Config::streams_max),
/// [`Config::payload_bytes_max`](crate::Config::payload_bytes_max)), its
/// [`Config::membership`](crate::Config::membership) and
/// [`Config::require_seals`](crate::Config::require_seals): every event but
/// those the cuts name. The rest still goes through the full validation
/// of apply (equivocation, lamport order, seals, the own stream); only
/// the limits, membership and unsealed legacy streams are answered here.
///
/// ```
/// use meshlog_cursor::{StreamId, VersionVector};
/// use meshlog_replica::{Config, Limit, MemStore, Replica};
///
/// let mut config = Config::new(StreamId::new(1));
/// config.payload_bytes_max = 4;
/// let mut receiver = Replica::open(config, MemStore::default())?;
/// let mut writer = Replica::new(StreamId::new(2));
/// for payload in ["ok", "too large", "ok"] {
///     writer.append(payload)?;
/// }
/// let columns = writer.delta_columns_for(&VersionVector::new(), usize::MAX);
/// let admission = receiver.admission(&columns);
/// assert_eq!(admission.cuts[0].from_seq, 2);
/// assert!(matches!(admission.cuts[0].limit, Limit::PayloadBytesMax { len: 9, limit: 4 }));
/// let fits = admission.cut_columns(&columns);
/// assert_eq!(receiver.apply_columns(&fits)?.applied, 1);
/// # Ok::<(), meshlog_replica::ReplicaError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admission {
    /// Per stream that does not fit whole, streams ascending: from which
    /// seq on its events cannot be taken, and why.
    pub cuts: Vec<Cut>,
}

/// Where a stream of a delta stops fitting the replica's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The stream.
    pub stream: StreamId,
    /// Its first seq that cannot be taken (0: none of it, its floor
    /// included).
    pub from_seq: u64,
    /// The limit it meets there.
    pub limit: Limit,
}

/// A limit a delta meets ([`Cut::limit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// The replica holds as many streams as it may (its own stream's slot
    /// counted); the stream is new to it.
    StreamsMax {
        /// `Config::streams_max`.
        limit: usize,
    },
    /// The event at [`Cut::from_seq`] has a payload above the limit.
    PayloadBytesMax {
        /// Its payload's length.
        len: usize,
        /// `Config::payload_bytes_max`.
        limit: usize,
    },
    /// The stream is an unknown writer's: the replica's closed
    /// [`Membership`](crate::Membership) admits no key that writes it,
    /// and the delta brings something new of it or seals it. Cut whole
    /// ([`Cut::from_seq`] 0); applied whole, the delta would be refused
    /// with [`DeltaError::UnknownWriter`](crate::DeltaError::UnknownWriter)
    /// (one rule: `docs/SIGNING.md`, "Membership").
    UnknownWriter {
        /// The key that sealed its run, if the delta carries a seal of it.
        key: Option<crate::WriterPublicKey>,
    },
    /// The stream is frozen at a fork: the replica keeps a proof that its
    /// writer signed two histories of it ([`Replica::forks`]), and takes
    /// nothing of it above its head ([`Cut::from_seq`] is the head + 1);
    /// applied whole, the delta would be refused with
    /// [`DeltaError::Frozen`](crate::DeltaError::Frozen).
    ///
    /// [`Replica::forks`]: crate::Replica::forks
    Frozen {
        /// The head the stream is frozen at.
        head: u64,
    },
    /// The stream's run brings new events with no seal, and the replica
    /// requires seals ([`Config::require_seals`](crate::Config::require_seals))
    /// of a stream it has not pinned a key for: a legacy stream, from
    /// before signed streams. Cut whole ([`Cut::from_seq`] 0); applied
    /// whole, the delta would be refused with
    /// [`DeltaError::Unsealed`](crate::DeltaError::Unsealed). (A pinned
    /// stream's run with its seal cut off is no legacy stream but a
    /// tampering: refused, never cut.)
    Unsealed,
    /// The delta carries a compaction statement for the stream whose
    /// signer has no authority here (an admin key this replica does not
    /// trust, a writer key it does not admit): the stream is cut whole
    /// ([`Cut::from_seq`] 0), its floor and statement with it, so the rest
    /// of the delta is taken; nothing of it above a floor this replica
    /// cannot trust is. Applied whole, the delta would be refused with
    /// [`DeltaError::StatementNoAuthority`](crate::DeltaError::StatementNoAuthority)
    /// (one rule: the validator's signer check, `docs/SIGNING.md`).
    StatementNoAuthority {
        /// The statement's floor.
        floor: u64,
    },
}

impl Admission {
    /// Whether the whole delta fits.
    pub fn is_whole(&self) -> bool {
        self.cuts.is_empty()
    }

    /// Whether the event `(stream, seq)` fits.
    pub fn admits(&self, stream: StreamId, seq: u64) -> bool {
        self.cut_of(stream).is_none_or(|from| seq < from)
    }

    fn cut_of(&self, stream: StreamId) -> Option<u64> {
        self.cuts
            .binary_search_by_key(&stream, |cut| cut.stream)
            .ok()
            .map(|index| self.cuts[index].from_seq)
    }

    /// `delta` without what does not fit: each cut stream's events from
    /// its cut on, the floor (and what backs it) of a stream cut whole, and each seal the cut
    /// leaves short (a seal vouches for its run up to its seq; the seals
    /// of the streams not cut stay with their runs).
    pub fn cut_delta(&self, delta: &Delta) -> Delta {
        let mut floor_proofs = delta.floor_proofs.clone();
        floor_proofs.retain(|stream| self.cut_of(stream) != Some(0));
        Delta {
            floor_proofs,
            floor: delta
                .floor
                .iter()
                .filter(|&(stream, _)| self.cut_of(stream) != Some(0))
                .collect(),
            events: delta
                .events
                .iter()
                .filter(|event| self.admits(event.stream, event.seq))
                .cloned()
                .collect(),
            seals: delta
                .seals
                .iter()
                .filter(|run_seal| self.admits(run_seal.seal.stream, run_seal.seal.seq))
                .copied()
                .collect(),
        }
    }

    /// [`Admission::cut_delta`] for a delta in columns (the columns
    /// themselves when it fits whole).
    pub fn cut_columns(&self, columns: &DeltaColumns) -> DeltaColumns {
        if self.is_whole() {
            return columns.clone();
        }
        let mut cut = DeltaColumns::from_delta(&self.cut_delta(&columns.to_delta()));
        cut.forks.clone_from(&columns.forks);
        cut
    }
}
