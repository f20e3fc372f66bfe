//! Shared by the CLI, demo and end-to-end tests: `meshlog serve` as a child
//! process that is killed when its guard drops (a failing test leaves no
//! node behind), the `meshlog` CLI run as a child with a deadline, and a
//! TCP proxy that can cut and heal one peer link.
//!
//! The raw HTTP helpers (`get`, `walk`, `marks`, `wait_until`) are the
//! server tests' own, from `support/`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// How long one CLI call may take before the test fails.
pub const CLI_DEADLINE: Duration = Duration::from_secs(60);

/// A `meshlog serve` child process, killed (SIGKILL) when dropped.
pub struct Served {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Served {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `kill -9`: no shutdown, no flush beyond what each commit made durable.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Starts `meshlog serve` on `data` on a free loopback port, with fast sync
/// timings (a `--config` file written beside the data directory), dialing
/// `peers`; returns once it prints `listening on ADDR`.
///
/// The data directory records `stream_id` (a legacy directory, which runs
/// unsealed: `docs/SIGNING.md`), so that assertions can name the stream.
pub fn serve(data: &Path, stream_id: u64, peers: &[String]) -> Served {
    std::fs::create_dir_all(data).expect("the data directory");
    let recorded = data.join("stream-id");
    if !recorded.exists() {
        std::fs::write(recorded, format!("{stream_id}\n")).expect("the stream-id file");
    }
    let config = data.with_extension("toml");
    std::fs::write(
        &config,
        "heartbeat_ms = 100\nbackoff_min_ms = 20\nbackoff_max_ms = 300\nconnect_timeout_ms = 2000\n",
    )
    .expect("the config file");
    let mut command = Command::new(env!("CARGO_BIN_EXE_meshlog"));
    command
        .args(["serve", "--data"])
        .arg(data)
        .args(["--listen", "127.0.0.1:0", "--stream-id"])
        .arg(stream_id.to_string())
        .arg("--config")
        .arg(&config)
        .env_remove("MESHLOG_PEERS")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for peer in peers {
        command.args(["--peer", peer]);
    }
    let mut child = command.spawn().expect("the meshlog binary runs");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    // The guard exists before the first read, so a node that never prints
    // is still killed.
    let mut served = Served {
        child,
        addr: "127.0.0.1:1".parse().unwrap(),
    };
    let mut line = String::new();
    stdout.read_line(&mut line).expect("a first line");
    served.addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line is not `listening on ADDR`: {line:?}"))
        .parse()
        .expect("an address");
    std::thread::spawn(move || {
        let mut sink = String::new();
        while stdout.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
            sink.clear();
        }
    });
    served
}

/// What a CLI run printed and how it ended.
#[derive(Debug)]
pub struct CliRun {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CliRun {
    /// The token of the last `next: TOKEN` line.
    pub fn next(&self) -> String {
        self.stdout
            .lines()
            .rev()
            .find_map(|line| line.strip_prefix("next: "))
            .unwrap_or_else(|| panic!("no `next:` line in {:?}", self.stdout))
            .to_owned()
    }

    /// The stdout lines, parsed as JSON (for `--json`).
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
            .collect()
    }
}

/// Runs `meshlog ARGS` with `stdin` as its input, within [`CLI_DEADLINE`]
/// (the child is killed if it takes longer).
pub async fn cli(args: &[&str], stdin: &str) -> CliRun {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_meshlog"))
        .args(args)
        .env_remove("MESHLOG_NODE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the meshlog binary runs");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.as_bytes())
        .await
        .expect("stdin written");
    drop(input);
    let output = tokio::time::timeout(CLI_DEADLINE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("meshlog {args:?} did not finish within {CLI_DEADLINE:?}"))
        .expect("the CLI's output");
    CliRun {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A TCP proxy in front of one node, for one peer link: point a node's
/// `--peer` at [`Proxy::url`]. [`Proxy::cut`] drops every connection and
/// refuses new ones until [`Proxy::heal`]; the target can be moved (a node
/// restarted on another port).
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
    accept: AbortHandle,
}

struct ProxyState {
    target: SocketAddr,
    cut: bool,
    links: Vec<AbortHandle>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a proxy port");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ProxyState {
            target,
            cut: false,
            links: Vec::new(),
        }));
        let shared = Arc::clone(&state);
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (target, cut) = {
                    let state = shared.lock().unwrap();
                    (state.target, state.cut)
                };
                if cut {
                    drop(inbound);
                    continue;
                }
                let link = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let mut inbound = inbound;
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                let mut state = shared.lock().unwrap();
                state.links.retain(|link| !link.is_finished());
                state.links.push(link.abort_handle());
            }
        })
        .abort_handle();
        Proxy {
            addr,
            state,
            accept,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cuts the link: open connections are dropped, new ones closed at once.
    pub fn cut(&self) {
        let mut state = self.state.lock().unwrap();
        state.cut = true;
        for link in state.links.drain(..) {
            link.abort();
        }
    }

    pub fn heal(&self) {
        self.state.lock().unwrap().cut = false;
    }

    pub fn set_target(&self, target: SocketAddr) {
        self.state.lock().unwrap().target = target;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
