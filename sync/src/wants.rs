//! [`CheckpointWants`]: how whoever drives a replica's sessions asks their
//! peers for a checkpoint by name, and hears when one arrives. The node's
//! reads use it for a version-2 token relative to a checkpoint it does not
//! keep (`docs/TOKEN.md`, "An unknown checkpoint").
//!
//! Each running session that was given it registers a slot: a small
//! bounded queue of names it hands to its protocol core
//! ([`Protocol::want_checkpoint`](crate::proto::Protocol::want_checkpoint),
//! the core's one want/answer path), and whether its peer takes
//! checkpoint frames. An ask goes to every slot whose peer does, without
//! waiting; what the peers send back is checked against its name by the
//! core and kept by the session, which then bumps [`CheckpointWants::kept`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use meshlog_cursor::CheckpointName;
use tokio::sync::{mpsc, watch};

use crate::lock;

/// The names one session holds before it hands them to its core: as many
/// as the core queues.
const SLOT_ASKS_MAX: usize = 16;

/// Asks for checkpoints by name through a replica's running sessions, and
/// says when a session kept one its peer sent. Shared by every session of
/// the replica (give it to [`LinkSessions`](crate::LinkSessions) or
/// [`Session::with_checkpoint_wants`](crate::Session::with_checkpoint_wants));
/// cheap to clone.
#[derive(Debug, Clone)]
pub struct CheckpointWants {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    slots: Mutex<Vec<Arc<Slot>>>,
    /// Bumped each time a session keeps a checkpoint received.
    kept: watch::Sender<u64>,
}

#[derive(Debug)]
struct Slot {
    asks: mpsc::Sender<CheckpointName>,
    /// The peer's hello arrived and says it takes checkpoint frames.
    takes: AtomicBool,
}

impl Default for CheckpointWants {
    fn default() -> Self {
        CheckpointWants::new()
    }
}

impl CheckpointWants {
    /// No session yet.
    pub fn new() -> Self {
        CheckpointWants {
            inner: Arc::new(Inner {
                slots: Mutex::default(),
                kept: watch::Sender::new(0),
            }),
        }
    }

    /// Asks every running session whose peer takes checkpoint frames for
    /// the checkpoint `name`; how many were asked (a session whose queue
    /// of asks is full is not). Never waits: watch [`CheckpointWants::kept`]
    /// (subscribed before asking) for what comes back.
    pub fn ask(&self, name: CheckpointName) -> usize {
        let slots: Vec<Arc<Slot>> = lock(&self.inner.slots).clone();
        slots
            .iter()
            .filter(|slot| slot.takes.load(Ordering::Acquire))
            .filter(|slot| slot.asks.try_send(name).is_ok())
            .count()
    }

    /// How many running sessions' peers take checkpoint frames now.
    pub fn sessions(&self) -> usize {
        lock(&self.inner.slots)
            .iter()
            .filter(|slot| slot.takes.load(Ordering::Acquire))
            .count()
    }

    /// A receiver that changes each time a session keeps a checkpoint its
    /// peer sent (asked for or gossiped): check the replica again then.
    pub fn kept(&self) -> watch::Receiver<u64> {
        self.inner.kept.subscribe()
    }

    /// A session kept a checkpoint its peer sent.
    pub(crate) fn received(&self) {
        self.inner.kept.send_modify(|count| *count += 1);
    }

    /// A slot for a session starting, removed when the registration drops.
    pub(crate) fn register(&self) -> Registration {
        let (sender, asks) = mpsc::channel(SLOT_ASKS_MAX);
        let slot = Arc::new(Slot {
            asks: sender,
            takes: AtomicBool::new(false),
        });
        lock(&self.inner.slots).push(Arc::clone(&slot));
        Registration {
            wants: self.clone(),
            slot,
            asks,
        }
    }
}

/// One running session's slot in [`CheckpointWants`].
#[derive(Debug)]
pub(crate) struct Registration {
    wants: CheckpointWants,
    slot: Arc<Slot>,
    asks: mpsc::Receiver<CheckpointName>,
}

impl Registration {
    /// Records whether the session's peer takes checkpoint frames.
    pub(crate) fn set_takes(&self, takes: bool) {
        self.slot.takes.store(takes, Ordering::Release);
    }

    /// The next name asked for (never ends while registered: the slot
    /// holds the sender).
    pub(crate) async fn next(&mut self) -> Option<CheckpointName> {
        self.asks.recv().await
    }

    /// The wants it belongs to.
    pub(crate) fn wants(&self) -> &CheckpointWants {
        &self.wants
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.wants.inner.slots).retain(|slot| !Arc::ptr_eq(slot, &self.slot));
    }
}
