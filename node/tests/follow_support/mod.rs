//! The follow tests' kit: a frame-level WebSocket fault proxy between a
//! follower and its node, and a follower whose state a test can compare
//! with a fresh snapshot read over HTTP.
//!
//! The proxy forwards the client's bytes untouched. From the node it
//! forwards the HTTP upgrade answer as bytes, then parses WebSocket frames
//! (RFC 6455: the 2-byte head, the 16- or 64-bit length, the mask) and, per
//! data frame, drops, delays, duplicates or reorders it as the current
//! `Faults` and its seeded generator say. Control frames (close, ping,
//! pong) pass untouched. `cut` ends every connection and refuses new ones
//! until `heal`; `sever` ends the connections only. The generator is
//! seeded, so a seed replays the same fault decisions (timing on real
//! sockets may still differ). A connection whose answer is not `101` (a
//! follower's refetch over `GET /events`) is relayed as bytes.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshlog_testkit::SplitMix64;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Fault rates for the node-to-follower direction, each per data frame.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub drop: f64,
    pub duplicate: f64,
    pub delay: f64,
    pub reorder: f64,
    pub delay_ms_max: u64,
}

impl Faults {
    pub fn none() -> Faults {
        Faults::default()
    }
}

struct Control {
    target: SocketAddr,
    faults: Mutex<Faults>,
    rng: Mutex<SplitMix64>,
    refusing: AtomicBool,
    /// Cancelled to end every open connection; replaced after.
    generation: Mutex<CancellationToken>,
    stop: CancellationToken,
}

/// A WebSocket fault proxy in front of one node.
pub struct WsProxy {
    pub addr: SocketAddr,
    control: Arc<Control>,
}

impl Drop for WsProxy {
    fn drop(&mut self) {
        self.control.stop.cancel();
        self.control.generation.lock().unwrap().cancel();
    }
}

impl WsProxy {
    pub async fn start(target: SocketAddr, seed: u64) -> WsProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let control = Arc::new(Control {
            target,
            faults: Mutex::new(Faults::none()),
            rng: Mutex::new(SplitMix64::new(seed)),
            refusing: AtomicBool::new(false),
            generation: Mutex::new(CancellationToken::new()),
            stop: CancellationToken::new(),
        });
        let accepting = Arc::clone(&control);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = accepting.stop.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((client, _)) = accepted else { continue };
                if accepting.refusing.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let ended = accepting.generation.lock().unwrap().clone();
                tokio::spawn(relay(Arc::clone(&accepting), client, ended));
            }
        });
        WsProxy { addr, control }
    }

    /// The node's URL through the proxy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_faults(&self, faults: Faults) {
        *self.control.faults.lock().unwrap() = faults;
    }

    /// Ends every connection now.
    pub fn sever(&self) {
        let mut generation = self.control.generation.lock().unwrap();
        generation.cancel();
        *generation = CancellationToken::new();
    }

    /// Ends every connection and refuses new ones until `heal`.
    pub fn cut(&self) {
        self.control.refusing.store(true, Ordering::SeqCst);
        self.sever();
    }

    /// No faults, connections accepted.
    pub fn heal(&self) {
        self.set_faults(Faults::none());
        self.control.refusing.store(false, Ordering::SeqCst);
    }
}

async fn relay(control: Arc<Control>, mut client: TcpStream, ended: CancellationToken) {
    let Ok(mut node) = TcpStream::connect(control.target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = node.set_nodelay(true);
    let (mut client_read, mut client_write) = client.split();
    let (mut node_read, mut node_write) = node.split();
    let upstream = tokio::io::copy(&mut client_read, &mut node_write);
    let downstream = async {
        // The upgrade answer, as bytes.
        let mut buffer = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let n = node_read.read(&mut chunk).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            buffer.extend_from_slice(&chunk[..n]);
        };
        client_write.write_all(&buffer[..head_end]).await?;
        if !buffer.starts_with(b"HTTP/1.1 101") {
            // Not an upgrade (a refetch over `GET /events`): bytes as they
            // come.
            client_write.write_all(&buffer[head_end..]).await?;
            tokio::io::copy(&mut node_read, &mut client_write).await?;
            return Ok(());
        }
        buffer.drain(..head_end);
        let mut held: Option<Vec<u8>> = None;
        loop {
            let frame = loop {
                if let Some(len) = frame_len(&buffer) {
                    break buffer.drain(..len).collect::<Vec<u8>>();
                }
                let n = node_read.read(&mut chunk).await?;
                if n == 0 {
                    if let Some(frame) = held.take() {
                        client_write.write_all(&frame).await?;
                    }
                    return Ok(());
                }
                buffer.extend_from_slice(&chunk[..n]);
            };
            let opcode = frame[0] & 0x0f;
            if opcode >= 8 {
                client_write.write_all(&frame).await?;
                continue;
            }
            let faults = *control.faults.lock().unwrap();
            let (drop, duplicate, delay_ms, reorder) = {
                let mut rng = control.rng.lock().unwrap();
                let drop = rng.chance(faults.drop);
                let duplicate = rng.chance(faults.duplicate);
                let delay_ms = if rng.chance(faults.delay) {
                    rng.below(faults.delay_ms_max + 1)
                } else {
                    0
                };
                let reorder = rng.chance(faults.reorder);
                (drop, duplicate, delay_ms, reorder)
            };
            if drop {
                continue;
            }
            if delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            }
            if reorder && held.is_none() {
                held = Some(frame);
                continue;
            }
            client_write.write_all(&frame).await?;
            if duplicate {
                client_write.write_all(&frame).await?;
            }
            if let Some(frame) = held.take() {
                client_write.write_all(&frame).await?;
            }
        }
    };
    tokio::select! {
        _ = ended.cancelled() => {}
        _ = upstream => {}
        _ = downstream => {}
    }
}

/// The length of the whole frame at the start of `buffer`, once it is all
/// there.
fn frame_len(buffer: &[u8]) -> Option<usize> {
    if buffer.len() < 2 {
        return None;
    }
    let masked = buffer[1] & 0x80 != 0;
    let (payload, mut head) = match buffer[1] & 0x7f {
        126 => (
            u16::from_be_bytes(buffer.get(2..4)?.try_into().ok()?) as usize,
            4,
        ),
        127 => (
            u64::from_be_bytes(buffer.get(2..10)?.try_into().ok()?) as usize,
            10,
        ),
        n => (n as usize, 2),
    };
    if masked {
        head += 4;
    }
    let total = head + payload;
    (buffer.len() >= total).then_some(total)
}

/// A follower run in the background, its state readable at any time: the
/// events it yielded (in order), its cursor, and what else it reported.
pub struct Tracked {
    pub name: String,
    pub start: meshlog_cursor::VersionVector,
    pub state: Arc<Mutex<TrackedState>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Default)]
pub struct TrackedState {
    pub events: Vec<meshlog_node::http::json::EventJson>,
    pub cursor: meshlog_cursor::VersionVector,
    pub status: Option<meshlog_node::follow::StatusJson>,
    /// `(lost ranges, resume)` per stale report.
    pub stale: Vec<(
        Vec<meshlog_node::http::json::LostJson>,
        meshlog_cursor::VersionVector,
    )>,
    pub lagged: usize,
    pub refetched: usize,
    pub connected: usize,
    pub ended: bool,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Tracked {
    pub fn start(name: &str, config: meshlog_node::follow::FollowerConfig) -> Tracked {
        use futures_util::StreamExt;
        use meshlog_node::follow::{FollowItem, Follower};
        let start = config.after.clone();
        let state = Arc::new(Mutex::new(TrackedState {
            cursor: start.clone(),
            ..TrackedState::default()
        }));
        let mut follower = Follower::start(config).expect("the follower starts");
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Some(item) = follower.next().await {
                let mut state = shared.lock().unwrap();
                match item {
                    FollowItem::Event(event) => state.events.push(event),
                    FollowItem::Status(status) => state.status = Some(status),
                    FollowItem::Connected { .. } => state.connected += 1,
                    FollowItem::Refetched { .. } => state.refetched += 1,
                    FollowItem::Lagged { .. } => state.lagged += 1,
                    FollowItem::Stale { lost, resume, .. } => state.stale.push((lost, resume)),
                }
                state.cursor = follower.cursor().clone();
            }
            shared.lock().unwrap().ended = true;
        });
        Tracked {
            name: name.to_owned(),
            start,
            state,
            task,
        }
    }
}
