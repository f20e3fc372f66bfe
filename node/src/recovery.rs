//! Relearning the node's own stream before it appends again: a data
//! directory restored from an old backup holds less of its own stream
//! than its peers do, and appending from there would write seqs it
//! already wrote, a fork of its own stream (`docs/OPERATIONS.md`, "Back up
//! and restore").
//!
//! A node with configured peers (or started with `--recover-own-stream`)
//! opens its replica relearning (`Config::recover_own_stream`): its peers'
//! deltas may carry its own stream past its head, and appends wait
//! ([`NodeReplica::wait_recovered`]; `503 recovering` after
//! `recovery_wait`). The watch here ends it once every configured peer's
//! hello has arrived (its marks of the own stream, what the sync core
//! calls a claim ahead: `hello.rs`) and the node holds at least what each
//! claims. A claim ahead holds it until the node has taken the events
//! claimed, however long that takes. Without the flag, peers not heard
//! within `recovery_wait` do not hold it: the node ends the check and
//! warns, naming them.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::{NodeConfig, SyncSettings};
use crate::peers::Peers;
use crate::replica::NodeReplica;

/// How often the watch looks at the links.
const TICK: Duration = Duration::from_millis(20);

/// Whether the node opens relearning its own stream: forced by the
/// operator, or it has peers to ask and the check is on.
pub(crate) fn holds_at_start(config: &NodeConfig) -> bool {
    config.sync.recover_own_stream
        || (!config.peers.is_empty() && !config.sync.recovery_wait.is_zero())
}

/// What the links say of the own stream now.
struct Heard {
    /// The most any peer's hello or acknowledgement holds of it.
    claimed: u64,
    /// The configured peers whose hello has not arrived yet.
    unheard: Vec<String>,
    /// Whether any peer, dialed or inbound, has been heard.
    any: bool,
    /// Whether any peer is configured.
    dialed: bool,
}

fn heard(peers: &Peers, replica: &NodeReplica) -> Heard {
    let own = replica.stream();
    let (dialed, inbound) = (peers.list(), peers.inbound());
    let claims = dialed.iter().map(|peer| (peer.stream, peer.marks.get(own)));
    let claims = claims.chain(
        inbound
            .iter()
            .map(|peer| (peer.stream, peer.marks.get(own))),
    );
    let (mut claimed, mut any) = (0, false);
    for (stream, claim) in claims {
        any |= stream.is_some();
        claimed = claimed.max(claim);
    }
    Heard {
        claimed,
        unheard: dialed
            .iter()
            .filter(|peer| peer.stream.is_none())
            .map(|peer| peer.addr.clone())
            .collect(),
        any,
        dialed: !dialed.is_empty(),
    }
}

/// The watch of [`run`], for the node to spawn, with `sync`'s
/// `recover_own_stream` and `recovery_wait`.
pub(crate) fn watch(
    replica: &NodeReplica,
    peers: &Peers,
    sync: &SyncSettings,
    stop: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (replica, peers) = (replica.clone(), peers.clone());
    run(
        replica,
        peers,
        sync.recover_own_stream,
        sync.recovery_wait,
        stop,
    )
}

/// Watches the links until the own stream is relearned, then ends the
/// recovery (appends open). Returns at once when the replica is not
/// relearning; ends with `stop`.
async fn run(
    replica: NodeReplica,
    peers: Peers,
    forced: bool,
    wait: Duration,
    stop: CancellationToken,
) {
    if !replica.is_recovering() {
        return;
    }
    let own = replica.stream();
    let started = Instant::now();
    let mut told_ahead = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(TICK) => {}
        }
        let now = heard(&peers, &replica);
        let head = replica.marks().get(own);
        if now.claimed > head {
            if now.claimed > told_ahead {
                told_ahead = now.claimed;
                tracing::warn!(
                    stream = own.get(),
                    head,
                    claimed = now.claimed,
                    "peers hold this node's own stream up to {} and it holds {head} (its data \
                     directory was restored from an older copy?): relearning it from them \
                     before appending again; appends answer 503 recovering meanwhile",
                    now.claimed
                );
            }
            continue;
        }
        let all_heard = if now.dialed {
            now.unheard.is_empty()
        } else {
            now.any
        };
        let timed_out = !forced && started.elapsed() >= wait;
        if !all_heard && !timed_out {
            continue;
        }
        if all_heard {
            tracing::info!(
                stream = own.get(),
                head,
                "own stream checked against every peer: appends open"
            );
        } else {
            tracing::warn!(
                stream = own.get(),
                head,
                unheard = %now.unheard.join(","),
                "own stream not checked against every peer within recovery_wait_ms: appends \
                 open; if this data directory was restored from a backup, restart with \
                 --recover-own-stream until those peers are reachable"
            );
        }
        replica.end_recovery().await;
        return;
    }
}
