//! `Membership`: which writers a replica accepts events of, and the legacy
//! streams bound to their keys (`docs/SIGNING.md`, "Membership"). A value
//! of [`Config`](crate::Config), judged in the one acceptance path.

use std::collections::BTreeMap;

use meshlog_cursor::StreamId;

use crate::{
    AdminPublicKey, Binding, RunSeal, SealError, SignedAdmission, SignedBinding, WriterPublicKey,
};

/// The writers a replica accepts, and the legacy streams it knows the keys
/// of: its trust configuration.
///
/// **Open** (the default): any writer is accepted; a seal verifies under
/// the key that derives its stream, or the key a binding here names.
/// **Closed** (once a writer is admitted, or [`Membership::closed`]): a
/// stream no admitted key writes is an unknown writer's where a received
/// delta brings anything new of it (events above the receiver's head, or
/// a floor that would raise the stream) or carries a seal of it. A
/// receiver's admission cuts such a stream out of the delta
/// ([`Limit::UnknownWriter`](crate::Limit::UnknownWriter)) and takes the
/// rest; a delta applied whole with one is refused with
/// [`DeltaError::UnknownWriter`](crate::DeltaError::UnknownWriter). A
/// seal of an admitted stream by another key than the admitted one is a
/// forgery, refused as
/// [`DeltaError::KeyMismatch`](crate::DeltaError::KeyMismatch). An
/// admitted key writes the stream it derives, and a legacy stream a
/// binding names it for. The replica's own stream is never judged.
///
/// Membership judges which stream an event belongs to, not whether its
/// writer signed it: an unsealed run of an admitted stream passes here
/// (that is [`Config::require_seals`](crate::Config::require_seals)).
///
/// ```
/// use meshlog_replica::{AdminKey, Membership, WriterAdmission, WriterKey};
/// let (admin, writer) = (AdminKey::from_bytes([1; 32]), WriterKey::from_bytes([2; 32]));
/// let mut membership = Membership::default();
/// assert!(membership.is_open());
/// let admission = WriterAdmission { key: writer.public() }.sign(&admin);
/// membership.admit_signed(&admission, &admin.public())?;
/// assert!(!membership.is_open());
/// assert!(membership.admits(writer.stream(), &writer.public()));
/// // Signed by another key than the admin's: refused, nothing admitted.
/// let stranger = WriterKey::from_bytes([3; 32]);
/// let forged = WriterAdmission { key: stranger.public() }.sign(&AdminKey::from_bytes([4; 32]));
/// assert!(membership.admit_signed(&forged, &admin.public()).is_err());
/// assert!(!membership.admits_stream(stranger.stream()));
/// # Ok::<(), meshlog_replica::SealError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    /// `None`: open. Else the admitted streams, each with its writer's key.
    writers: Option<BTreeMap<StreamId, WriterPublicKey>>,
    /// Legacy streams and the keys they are bound to (trusted bindings).
    bindings: BTreeMap<StreamId, WriterPublicKey>,
    /// The mesh admin key, if this replica trusts one: its compaction
    /// statements erase any writer's stream but the own.
    admin: Option<AdminPublicKey>,
}

impl Membership {
    /// Open membership: every writer is accepted (the default).
    pub fn open() -> Membership {
        Membership::default()
    }

    /// Closed membership admitting nobody yet (the own stream is always
    /// the replica's to write).
    pub fn closed() -> Membership {
        Membership {
            writers: Some(BTreeMap::new()),
            ..Membership::default()
        }
    }

    /// Whether every writer is accepted.
    pub fn is_open(&self) -> bool {
        self.writers.is_none()
    }

    /// Admits `key` as the writer of the stream it derives. Closes an open
    /// membership: from then on only admitted writers are accepted.
    pub fn admit(&mut self, key: WriterPublicKey) {
        self.close().insert(key.stream(), key);
    }

    /// Closes the membership (the bound streams' keys admitted for them),
    /// and answers the admitted writers.
    fn close(&mut self) -> &mut BTreeMap<StreamId, WriterPublicKey> {
        self.writers.get_or_insert_with(|| self.bindings.clone())
    }

    /// Admits the key of an admission `admin` signed ([`Membership::admit`]);
    /// an admission another key signed is refused
    /// ([`SealError::BadStatement`]) and admits nothing.
    pub fn admit_signed(
        &mut self,
        admission: &SignedAdmission,
        admin: &AdminPublicKey,
    ) -> Result<WriterPublicKey, SealError> {
        let key = admission.verify(admin)?.key;
        self.admit(key);
        Ok(key)
    }

    /// Trusts `binding` (one the trust configuration lists as
    /// `key@stream`): the legacy stream's seals verify under its key, and
    /// under a closed membership the key is admitted for that stream.
    pub fn bind(&mut self, binding: Binding) {
        self.bindings.insert(binding.stream, binding.key);
        if let Some(writers) = &mut self.writers {
            writers.insert(binding.stream, binding.key);
        }
    }

    /// Trusts a binding `admin` signed ([`Membership::bind`]); one another
    /// key signed is refused ([`SealError::BadStatement`]) and binds
    /// nothing.
    pub fn bind_signed(
        &mut self,
        binding: &SignedBinding,
        admin: &AdminPublicKey,
    ) -> Result<Binding, SealError> {
        let binding = binding.verify(admin)?;
        self.bind(binding);
        Ok(binding)
    }

    /// Trusts `admin` as the mesh admin key: a compaction statement it
    /// signs erases any writer's stream but the own (`docs/SIGNING.md`,
    /// "Floors with an authority"). Leaves the membership open or closed
    /// as it was.
    pub fn trust_admin(&mut self, admin: AdminPublicKey) {
        self.admin = Some(admin);
    }

    /// The mesh admin key trusted, if any.
    pub fn admin(&self) -> Option<&AdminPublicKey> {
        self.admin.as_ref()
    }

    /// The trusted binding of `stream`, if it is a bound legacy stream.
    pub fn binding(&self, stream: StreamId) -> Option<Binding> {
        self.bindings
            .get(&stream)
            .map(|&key| Binding { stream, key })
    }

    /// Whether this membership knows a key for `stream`: a binding names
    /// one, or (closed) an admitted key writes it. Such a stream is keyed
    /// before any seal of it arrives: a peer's floor of it needs the
    /// writer's authority (`docs/SIGNING.md`, "Floors with an
    /// authority").
    pub fn knows_key(&self, stream: StreamId) -> bool {
        self.bindings.contains_key(&stream)
            || self
                .writers
                .as_ref()
                .is_some_and(|writers| writers.contains_key(&stream))
    }

    /// Whether events of `stream` are accepted: membership is open, or an
    /// admitted key writes the stream.
    pub fn admits_stream(&self, stream: StreamId) -> bool {
        self.writers
            .as_ref()
            .is_none_or(|writers| writers.contains_key(&stream))
    }

    /// Whether a seal of `stream` by `key` is accepted as far as
    /// membership goes: membership is open, or `key` is the admitted
    /// writer of `stream`. (Whether `key` signs for `stream` at all is the
    /// seal's own check.)
    pub fn admits(&self, stream: StreamId, key: &WriterPublicKey) -> bool {
        self.writers
            .as_ref()
            .is_none_or(|writers| writers.get(&stream) == Some(key))
    }

    /// The one membership rule, which the validator and the admission both
    /// ask (`docs/SIGNING.md`, "Membership"): the streams of a delta that
    /// are an unknown writer's, ascending, each with the key that sealed
    /// its run if the delta carries a seal of it. Under a closed
    /// membership, a stream other than `own` that no admitted key writes
    /// is unknown if the delta seals it (`seals`) or brings something new
    /// of it (`brought`: events above the receiver's head, a floor that
    /// raises it; the caller judges that against the state it checks).
    pub(crate) fn unknown_writers(
        &self,
        own: StreamId,
        seals: &[RunSeal],
        brought: impl IntoIterator<Item = StreamId>,
    ) -> BTreeMap<StreamId, Option<WriterPublicKey>> {
        let mut unknown = BTreeMap::new();
        if self.is_open() {
            return unknown;
        }
        let stranger = |stream: StreamId| stream != own && !self.admits_stream(stream);
        for run_seal in seals.iter().filter(|s| stranger(s.seal.stream)) {
            unknown.insert(run_seal.seal.stream, Some(run_seal.key));
        }
        for stream in brought.into_iter().filter(|&s| stranger(s)) {
            unknown.entry(stream).or_insert(None);
        }
        unknown
    }

    /// The admitted streams and their writers' keys, streams ascending
    /// (none while open).
    pub fn writers(&self) -> impl Iterator<Item = (StreamId, WriterPublicKey)> + '_ {
        self.writers.iter().flatten().map(|(&s, &k)| (s, k))
    }
}
