//! The follow hub: what every follow connection of a node shares (the
//! limits, the node-wide subscription permits, one watch on the replica's
//! changes), the `events` frames built once for every follower at the
//! same cursor, and the status frames' writer times, read once per head.
//! Its own file, so that the node's shared state holds a hub
//! without the connections' code, which reads that state.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::extract::ws::Utf8Bytes;
use meshlog_cursor::VersionVector;
use meshlog_replica::Change;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::frame::FollowStream;
use super::status::HeadTimes;
use crate::config::FollowSettings;
use crate::metrics::Metrics;
use crate::replica::NodeReplica;

/// The most `events` frames the hub keeps for other followers to share.
const SHARED_FRAMES_MAX: usize = 8;
/// The largest frame kept for sharing: live frames are small; a large
/// catch-up page is rarely wanted twice.
const SHARED_FRAME_BYTES_MAX: usize = 256 << 10;

/// What every follow connection of a node shares: the limits, the
/// node-wide subscription permits and one watch on the replica's changes.
pub(crate) struct FollowHub {
    pub(crate) settings: FollowSettings,
    permits: Arc<Semaphore>,
    pub(super) changes: watch::Receiver<Change>,
    _watch: meshlog_sync::ChangeWatch,
    pub(crate) stop: CancellationToken,
    /// The latest `events` frames built, oldest first, for the followers
    /// at the same cursor to queue without paging and encoding again.
    shared_frames: Mutex<VecDeque<SharedFrame>>,
    /// The status frames' writer times, read once per head.
    head_times: Mutex<HeadTimes>,
}

/// An `events` frame as one follower's pump built it, for the others.
pub(super) struct SharedFrame {
    pub(super) stream: FollowStream,
    pub(super) extends: VersionVector,
    pub(super) next: VersionVector,
    /// The floor and change version read before the page was taken.
    pub(super) floor: VersionVector,
    pub(super) version: u64,
    /// The page reached the head (as of `version`).
    pub(super) at_head: bool,
    /// Whether its tokens are the shortest (`tokens=short`) or version 1.
    pub(super) short_tokens: bool,
    pub(super) text: Utf8Bytes,
}

/// What a pump queues for one step of a subscription: a frame's text,
/// the cursor after it, and whether the subscription is then at the head.
pub(super) struct Step {
    pub(super) text: Utf8Bytes,
    pub(super) next: VersionVector,
    pub(super) at_head: bool,
}

impl FollowHub {
    /// A hub on `replica`; `stop` ends every follow connection.
    pub(crate) fn new(
        replica: &NodeReplica,
        settings: FollowSettings,
        stop: CancellationToken,
    ) -> FollowHub {
        let mut watch = replica.change_watch();
        let changes = watch.receiver().clone();
        FollowHub {
            permits: Arc::new(Semaphore::new(settings.followers_max)),
            settings,
            changes,
            _watch: watch,
            stop,
            shared_frames: Mutex::new(VecDeque::with_capacity(SHARED_FRAMES_MAX)),
            head_times: Mutex::default(),
        }
    }

    /// The status frames' writer times, for one frame's build.
    pub(super) fn head_times(&self) -> std::sync::MutexGuard<'_, HeadTimes> {
        // A map of plain values, each entry written whole: one left by a
        // panicking holder is still true.
        self.head_times
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn shared_frames(&self) -> std::sync::MutexGuard<'_, VecDeque<SharedFrame>> {
        // The list holds only finished frames: one left by a panicking
        // holder is still whole.
        self.shared_frames
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The frame past `extends` on `stream`, if one was built under the
    /// current floor. It is at the head only if no change was published
    /// since its page was taken.
    pub(super) fn shared_step(
        &self,
        stream: FollowStream,
        extends: &VersionVector,
        short_tokens: bool,
    ) -> Option<Step> {
        let frames = self.shared_frames();
        let frame = frames.iter().rev().find(|frame| {
            frame.stream == stream
                && frame.extends == *extends
                && frame.short_tokens == short_tokens
        })?;
        let change = self.changes.borrow();
        if frame.floor != change.floor {
            return None;
        }
        Some(Step {
            text: frame.text.clone(),
            next: frame.next.clone(),
            at_head: frame.at_head && frame.version == change.version,
        })
    }

    /// Keeps `frame` for other followers, dropping the oldest past
    /// [`SHARED_FRAMES_MAX`].
    pub(super) fn keep_frame(&self, frame: SharedFrame) {
        if frame.text.len() > SHARED_FRAME_BYTES_MAX {
            return;
        }
        let mut frames = self.shared_frames();
        if frames.len() >= SHARED_FRAMES_MAX {
            frames.pop_front();
        }
        frames.push_back(frame);
    }

    /// The floor and the change version now: read before a page, they say
    /// what a frame built from it may be shared under.
    pub(super) fn floor_and_version(&self) -> (VersionVector, u64) {
        let change = self.changes.borrow();
        (change.floor.clone(), change.version)
    }

    pub(super) fn permit(&self, metrics: &Arc<Metrics>) -> Option<Permit> {
        let permit = Arc::clone(&self.permits).try_acquire_owned().ok()?;
        metrics.followers.inc();
        Some(Permit {
            _permit: permit,
            metrics: Arc::clone(metrics),
        })
    }
}

/// A subscription's place among the node's `followers_max`, counted in
/// the `followers` gauge while it lives.
pub(super) struct Permit {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.metrics.followers.dec();
    }
}
