//! The dialer's hello against a checkpoint over real sessions (issue 27,
//! writer churn; `docs/PROTOCOL.md`, "The dialer's hello"): a link's
//! first session to a peer sends a whole hello, and the next, the link
//! remembering that the peer read one, a hello against a checkpoint (kind
//! 9); a peer lacking that checkpoint (another replica at the address)
//! asks for it by name and the session converges; a peer that stops
//! reading kind 9 (a build before it, which ends the session on it) gets
//! a whole hello on the redial, and after; a peer whose hello never had
//! the flag gets a whole hello, first and after. A link started from a
//! memory kept past a restart (`PeerLink::with_peer_memory`, the bytes
//! read back) sends a hello against a checkpoint in its first session,
//! and so does a link to a peer it never met (`PeerMemory::unmet`).
//!
//! How: a `PeerLink` dials through a relay in memory that records the
//! kinds of the frames each way on each connection and runs the
//! acceptor's session behind it (`PeerDirection::Inbound`, as the node's
//! and the manager's are); it can play a build before kind 9 (it ends a
//! connection whose first frame is one). The test ends a connection to
//! make the link redial. Under tokio's paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshlog_cursor::StreamId;
use meshlog_sync::frame::{self, FrameReader};
use meshlog_sync::proto::PeerMemory;
use meshlog_sync::testkit::{run_paused, wait_for};
use meshlog_sync::{
    Backoff, CheckpointWants, Dial, LinkSessions, PeerDirection, PeerLink, Redial, Routes, Session,
    SessionConfig, SharedReplica,
};
use meshlog_testkit::churn::churned;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::task::AbortHandle;

/// How long any wait here may take, in paused time.
const WAIT: Duration = Duration::from_secs(30);

fn config() -> SessionConfig {
    SessionConfig::with_heartbeat(Duration::from_millis(20))
}

/// A peer whose hello does not have the flag: checkpoints off (as a build
/// before kind 9 has none).
fn flagless() -> SessionConfig {
    SessionConfig {
        checkpoints: false,
        ..config()
    }
}

/// The replica behind the relay, and how it plays.
#[derive(Clone)]
struct Acceptor {
    replica: SharedReplica,
    config: SessionConfig,
    /// Plays a build before kind 9: a connection whose first frame from
    /// the dialer is one ends there (`UnknownKind` before a hello).
    before_kind_9: bool,
}

impl Acceptor {
    /// This build, checkpoints on: it reads a hello against a checkpoint.
    fn current(replica: &SharedReplica) -> Self {
        Acceptor::new(replica, config(), false)
    }

    /// A hello without the flag (checkpoints off): it skips kind 9.
    fn flagless(replica: &SharedReplica) -> Self {
        Acceptor::new(replica, flagless(), false)
    }

    /// A build before kind 9: it ends a session that opens with one.
    fn before_kind_9(replica: &SharedReplica) -> Self {
        Acceptor::new(replica, flagless(), true)
    }

    fn new(replica: &SharedReplica, config: SessionConfig, before_kind_9: bool) -> Self {
        Acceptor {
            replica: replica.clone(),
            config,
            before_kind_9,
        }
    }
}

/// Per connection, the kinds of the frames each way: (dialer to acceptor,
/// acceptor to dialer).
type Kinds = Arc<Mutex<Vec<(Vec<&'static str>, Vec<&'static str>)>>>;

/// The link's dial step: a relay to the acceptor's session.
#[derive(Clone)]
struct Relay {
    acceptor: Arc<Mutex<Acceptor>>,
    kinds: Kinds,
    running: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Relay {
    fn new(acceptor: Acceptor) -> Self {
        Relay {
            acceptor: Arc::new(Mutex::new(acceptor)),
            kinds: Kinds::default(),
            running: Arc::default(),
        }
    }

    /// Who answers the next dial.
    fn set(&self, acceptor: Acceptor) {
        *self.acceptor.lock().unwrap() = acceptor;
    }

    /// Ends the connection (the acceptor's session and the relay's
    /// pumps): the link redials.
    fn cut(&self) {
        for task in self.running.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    fn connections(&self) -> usize {
        self.kinds.lock().unwrap().len()
    }

    /// The kinds of connection `index`'s frames, each way.
    fn kinds(&self, index: usize) -> (Vec<&'static str>, Vec<&'static str>) {
        self.kinds.lock().unwrap()[index].clone()
    }
}

impl Dial for Relay {
    type Io = DuplexStream;

    async fn dial(&self) -> Result<DuplexStream, String> {
        let acceptor = self.acceptor.lock().unwrap().clone();
        let index = {
            let mut kinds = self.kinds.lock().unwrap();
            kinds.push((Vec::new(), Vec::new()));
            kinds.len() - 1
        };
        let (dialer_side, relay_in) = tokio::io::duplex(1 << 20);
        let (relay_out, acceptor_side) = tokio::io::duplex(1 << 20);
        let (in_read, in_write) = tokio::io::split(relay_in);
        let (out_read, out_write) = tokio::io::split(relay_out);
        let session = Session::new(acceptor.replica, acceptor.config)
            .with_routes(Routes::new(), PeerDirection::Inbound);
        let to_acceptor = Pump {
            kinds: Arc::clone(&self.kinds),
            index,
            to_acceptor: true,
            before_kind_9: acceptor.before_kind_9,
        };
        let to_dialer = Pump {
            to_acceptor: false,
            before_kind_9: false,
            ..to_acceptor.clone()
        };
        let mut running = self.running.lock().unwrap();
        running.push(tokio::spawn(session.run(acceptor_side)).abort_handle());
        running.push(tokio::spawn(to_acceptor.run(in_read, out_write)).abort_handle());
        running.push(tokio::spawn(to_dialer.run(out_read, in_write)).abort_handle());
        Ok(dialer_side)
    }
}

/// One way of a relayed connection: frames passed on whole, their kinds
/// recorded.
#[derive(Clone)]
struct Pump {
    kinds: Kinds,
    index: usize,
    to_acceptor: bool,
    before_kind_9: bool,
}

impl Pump {
    async fn run(self, mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin) {
        let mut reader = FrameReader::with_limit(config().receive_limit());
        while let Ok(Some(raw)) = reader.read_raw(&mut from).await {
            let kind = frame::decode(&raw).map_or("undecodable", |frame| frame.kind());
            let first = {
                let mut kinds = self.kinds.lock().unwrap();
                let (to_acceptor, to_dialer) = &mut kinds[self.index];
                let way = if self.to_acceptor {
                    to_acceptor
                } else {
                    to_dialer
                };
                way.push(kind);
                way.len() == 1
            };
            if self.before_kind_9 && first && kind == "hello against" {
                // Closing this way closes the acceptor's session, and so
                // the other way.
                break;
            }
            if to.write_all(&raw).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    }
}

/// A's link to the relay, starting from `memory`, dialing and redialing
/// until the test ends.
fn dial_through(a: &SharedReplica, relay: &Relay, memory: PeerMemory) -> Arc<PeerLink<String>> {
    let link =
        Arc::new(PeerLink::new("b".to_owned(), PeerDirection::Outbound).with_peer_memory(memory));
    let sessions = LinkSessions {
        shared: a.clone(),
        config: config(),
        routes: Routes::new(),
        wants: CheckpointWants::new(),
    };
    let (min, max) = (Duration::from_millis(100), Duration::from_secs(1));
    let redial = Redial {
        backoff: Backoff::for_link(min, max, 7, a.stream(), 1),
        connect_timeout: Duration::from_secs(1),
    };
    let (link_task, relay) = (Arc::clone(&link), relay.clone());
    tokio::spawn(async move {
        link_task
            .dial_loop(sessions, relay, redial, std::future::pending::<()>)
            .await;
    });
    link
}

/// Waits for connection `n` (from 1) to come up, its peer's hello heard.
async fn connected(link: &PeerLink<String>, a: &SharedReplica, relay: &Relay, n: usize) {
    wait_for(&format!("connection {n}"), WAIT, || {
        relay.connections() == n && link.status(&a.marks()).connected
    })
    .await;
}

/// Appends on `from` and waits for `to` to hold it: the session syncs.
async fn crosses(from: &SharedReplica, to: &SharedReplica) {
    let event = from.append(&b"new"[..]).unwrap();
    wait_for("the event to cross", WAIT, || {
        to.marks().get(event.stream) >= event.seq
    })
    .await;
}

#[test]
fn a_redialed_peer_gets_a_hello_against_a_checkpoint_until_it_stops_reading_one() {
    run_paused(async {
        let a = churned(1, 20, 300);
        let b = churned(2, 20, 300);
        let base = a.checkpoint_names()[0];
        assert_eq!(b.checkpoint_names(), vec![base], "both mint the same");
        let relay = Relay::new(Acceptor::current(&b));
        let link = dial_through(&a, &relay, PeerMemory::default());
        // The first session knows nothing of B: a whole hello.
        connected(&link, &a, &relay, 1).await;
        crosses(&a, &b).await;
        assert_eq!(relay.kinds(0).0[0], "hello", "{:?}", relay.kinds(0));
        relay.cut();
        // The second: B read one, A's hello goes against the checkpoint.
        connected(&link, &a, &relay, 2).await;
        let memory = link.peer_memory();
        assert!(memory.reads_hello_against, "{memory:?}");
        assert!(memory.checkpoints.contains(&base), "{memory:?}");
        assert_eq!(relay.kinds(1).0[0], "hello against", "{:?}", relay.kinds(1));
        crosses(&a, &b).await;
        crosses(&b, &a).await;

        // Another replica at B's address, which keeps no checkpoint: it
        // asks for the one A's hello was written against, by name, before
        // it answers; A answers; the session converges.
        let c = SharedReplica::in_memory(StreamId::new(3));
        c.append(&b"from c"[..]).unwrap();
        relay.set(Acceptor::current(&c));
        relay.cut();
        connected(&link, &a, &relay, 3).await;
        let (from_a, from_c) = relay.kinds(2);
        assert_eq!(from_a[..2], ["hello against", "checkpoint"], "{from_a:?}");
        assert_eq!(from_c[0], "checkpoint want", "{from_c:?}");
        assert!(c.checkpoint(base).is_some());
        wait_for("c to converge with a", WAIT, || c.digest() == a.digest()).await;
        assert_eq!(c.floor(), a.floor());

        // C downgraded to a build before kind 9: it ends the session on
        // A's hello against a checkpoint; A redials whole, and stays so.
        relay.set(Acceptor::before_kind_9(&c));
        relay.cut();
        connected(&link, &a, &relay, 5).await;
        assert_eq!(relay.kinds(3).0, ["hello against"], "{:?}", relay.kinds(3));
        assert_eq!(relay.kinds(4).0[0], "hello", "{:?}", relay.kinds(4));
        crosses(&a, &c).await;
        assert!(!link.peer_memory().reads_hello_against);
        relay.cut();
        connected(&link, &a, &relay, 6).await;
        assert_eq!(relay.kinds(5).0[0], "hello", "{:?}", relay.kinds(5));
        crosses(&a, &c).await;
    });
}

#[test]
fn a_peer_whose_hello_lacks_the_flag_gets_a_whole_hello_first_and_after() {
    run_paused(async {
        let a = churned(1, 20, 300);
        let b = churned(2, 20, 300);
        let relay = Relay::new(Acceptor::flagless(&b));
        let link = dial_through(&a, &relay, PeerMemory::default());
        for n in 1..=3 {
            connected(&link, &a, &relay, n).await;
            crosses(&a, &b).await;
            crosses(&b, &a).await;
            let (from_a, _) = relay.kinds(n - 1);
            assert_eq!(from_a[0], "hello", "{n}: {from_a:?}");
            assert!(!from_a.contains(&"hello against"), "{n}: {from_a:?}");
            relay.cut();
        }
        assert!(!link.peer_memory().reads_hello_against);
    });
}

/// A link started from what an earlier link learned, kept as bytes (as
/// the node keeps it in its data directory across a restart): its very
/// first session's hello goes against the checkpoint. Started from
/// nothing, as before `PeerLink::with_peer_memory`, it goes whole.
#[test]
fn a_link_started_from_a_kept_memory_sends_its_first_hello_against_a_checkpoint() {
    run_paused(async {
        let a = churned(1, 20, 300);
        let b = churned(2, 20, 300);
        let base = a.checkpoint_names()[0];
        let acceptor = Acceptor::current(&b);
        // What a first link to B learned, as a node would write it.
        let learned = Relay::new(acceptor.clone());
        let first = dial_through(&a, &learned, PeerMemory::default());
        connected(&first, &a, &learned, 1).await;
        crosses(&a, &b).await;
        assert_eq!(learned.kinds(0).0[0], "hello", "{:?}", learned.kinds(0));
        // A session leaves its memory to the link as it ends.
        learned.cut();
        wait_for("the first session's memory", WAIT, || {
            first.peer_memory().reads_hello_against
        })
        .await;
        let kept = first.peer_memory().to_bytes();

        // A new link (a restarted process) started from those bytes.
        let memory = PeerMemory::from_bytes(&kept).expect("the bytes written");
        assert!(memory.reads_hello_against, "{memory:?}");
        assert!(memory.checkpoints.contains(&base), "{memory:?}");
        let relay = Relay::new(acceptor);
        let link = dial_through(&a, &relay, memory.clone());
        connected(&link, &a, &relay, 1).await;
        let (from_a, _) = relay.kinds(0);
        assert_eq!(from_a[0], "hello against", "{from_a:?}");
        assert!(
            !from_a.contains(&"checkpoint"),
            "B holds the base: {from_a:?}"
        );
        assert!(link.status(&a.marks()).session.first_hello_against);
        crosses(&a, &b).await;
        crosses(&b, &a).await;
        assert_eq!(link.peer_memory(), memory);
    });
}

/// A link to a peer it never met (`PeerLink::new`, no memory) assumes the
/// peer reads a hello against a checkpoint: in a mesh the peer most
/// likely holds the newest one (here both minted the same), so even the
/// link's first session costs nothing per retired writer. A peer built
/// before kind 9 ends that first session on it; the redial's hello goes
/// whole, and stays so. Before `PeerMemory::unmet`, a link's first
/// session always sent a whole hello (22 bytes a retired writer).
#[test]
fn a_link_to_a_peer_it_never_met_sends_its_first_hello_against_a_checkpoint() {
    run_paused(async {
        let a = churned(1, 20, 300);
        let b = churned(2, 20, 300);
        let relay = Relay::new(Acceptor::current(&b));
        let never_met = PeerLink::new("b".to_owned(), PeerDirection::Outbound);
        assert_eq!(never_met.peer_memory(), PeerMemory::unmet());
        let link = dial_through(&a, &relay, never_met.peer_memory());
        connected(&link, &a, &relay, 1).await;
        let (from_a, _) = relay.kinds(0);
        assert_eq!(from_a[0], "hello against", "{from_a:?}");
        assert!(!from_a.contains(&"hello"), "{from_a:?}");
        crosses(&a, &b).await;
        crosses(&b, &a).await;

        // A build before kind 9 at another address: its first session
        // ends on the hello against; the redials go whole.
        let old = Relay::new(Acceptor::before_kind_9(&b));
        let link = dial_through(&a, &old, PeerMemory::unmet());
        connected(&link, &a, &old, 2).await;
        assert_eq!(old.kinds(0).0, ["hello against"], "{:?}", old.kinds(0));
        assert_eq!(old.kinds(1).0[0], "hello", "{:?}", old.kinds(1));
        crosses(&a, &b).await;
        old.cut();
        connected(&link, &a, &old, 3).await;
        assert_eq!(old.kinds(2).0[0], "hello", "{:?}", old.kinds(2));
    });
}
