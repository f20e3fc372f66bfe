//! `ChangeWatch`: a replica handle's change notification as a
//! `tokio::sync::watch`, which async code can await in a `select!`.

use meshlog_replica::{Change, ChangeHook, SharedReplica, Store};
use tokio::sync::watch;

/// The changes a [`SharedReplica`] publishes (marks and floor after each
/// round that moved them), as a `tokio::sync::watch`: a receiver always
/// sees the latest change, never an older one after a newer.
///
/// ```
/// use meshlog_cursor::StreamId;
/// use meshlog_sync::{ChangeWatch, SharedReplica};
///
/// let shared = SharedReplica::in_memory(StreamId::new(1));
/// let mut changes = ChangeWatch::new(&shared);
/// shared.append(&b"hello"[..])?;
/// assert!(changes.receiver().has_changed()?);
/// assert_eq!(changes.receiver().borrow_and_update().marks.get(StreamId::new(1)), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ChangeWatch {
    receiver: watch::Receiver<Change>,
    _hook: ChangeHook,
}

impl ChangeWatch {
    /// Watches `shared`'s changes from now on, starting at its latest.
    pub fn new<S: Store>(shared: &SharedReplica<S>) -> Self {
        let (sender, receiver) = watch::channel(shared.latest_change());
        let sender = std::sync::Arc::new(sender);
        let hook = {
            let sender = std::sync::Arc::clone(&sender);
            shared.on_change(move |change| publish(&sender, change))
        };
        // Again now the hook is in place, so that no change published in
        // between is missed; versions keep the watch monotone whichever of
        // the two comes last.
        publish(&sender, &shared.latest_change());
        let mut receiver = receiver;
        receiver.mark_unchanged();
        ChangeWatch {
            receiver,
            _hook: hook,
        }
    }

    /// The receiver, to await (`changed`) or read (`borrow_and_update`).
    /// Its sender lives as long as this watch and the replica.
    pub fn receiver(&mut self) -> &mut watch::Receiver<Change> {
        &mut self.receiver
    }
}

fn publish(sender: &watch::Sender<Change>, change: &Change) {
    sender.send_if_modified(|published| {
        if change.version > published.version {
            *published = change.clone();
            true
        } else {
            false
        }
    });
}
