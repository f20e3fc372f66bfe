//! The hosts and the nemesis: five Linux network namespaces on one bridge,
//! a real `meshlog serve` in each, and the kernel faults applied to them.
//!
//! Everything this module creates is named with [`PREFIX`]: namespaces
//! `mlf-n1`..`mlf-n5`, host-side veths `mlf-h1`..`mlf-h5`, the bridge
//! `mlf-br0`, the scratch directory `/tmp/mlf-run-*`, the iptables chains
//! `mlf-part` and `mlf-loss` inside the namespaces. [`Mesh`]'s `Drop`
//! removes all of it, and [`cleanup_leftovers`] removes what a crashed
//! earlier run left behind. Addresses are `10.77.0.0/24` only: the bridge
//! is `10.77.0.1` (where the clients run, in the root namespace), node `i`
//! is `10.77.0.(11+i)`.
//!
//! The faults, all in the kernel:
//!
//! - loss: `iptables -m statistic --mode random -j DROP`, in and out;
//! - duplication: `iptables -t mangle ... -j TEE` to the packet's own
//!   destination, out;
//! - delay and reordering: an `htb` qdisc on the namespace's `eth0` with a
//!   slow class, and `-j CLASSIFY` sending a random share of packets
//!   through it, so they arrive late and behind later ones;
//! - partitions: `DROP` rules by peer address in chain `mlf-part`;
//! - crash: `SIGKILL`, restart on the same data directory; pause:
//!   `SIGSTOP`, `SIGCONT`.
//!
//! (This host's kernel has no `sch_netem`, hence the three mechanisms above
//! instead of one `tc qdisc ... netem`; see `docs/FAULTS.md`.)

use std::fs::{File, OpenOptions};
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::schedule::{LinkProfile, NODES};

/// The prefix of every name this harness gives to what it creates.
pub const PREFIX: &str = "mlf-";
/// The bridge.
pub const BRIDGE: &str = "mlf-br0";
/// The bridge's address: where the clients connect from.
pub const BRIDGE_ADDR: &str = "10.77.0.1";
/// The observer's address, also on the bridge: the harness's own polls
/// (marks, digests, compaction, final reads) come from it, and the link
/// impairments leave its packets alone, so that a measurement of
/// convergence measures the mesh, not the poll's own retransmits.
pub const OBSERVER_ADDR: &str = "10.77.0.2";

/// The observer's address, parsed.
pub fn observer() -> std::net::IpAddr {
    OBSERVER_ADDR.parse().expect("a literal address")
}

/// The port every node listens on, in its own namespace.
pub const PORT: u16 = 7070;
/// How long a node may take to print `listening on`.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Node `i`'s namespace.
pub fn namespace(i: usize) -> String {
    format!("mlf-n{}", i + 1)
}

/// Node `i`'s address.
pub fn node_ip(i: usize) -> String {
    format!("10.77.0.{}", 11 + i)
}

/// Node `i`'s socket address.
pub fn node_addr(i: usize) -> SocketAddr {
    format!("{}:{PORT}", node_ip(i))
        .parse()
        .expect("a literal address")
}

/// Node `i`'s URL.
pub fn node_url(i: usize) -> String {
    format!("http://{}:{PORT}", node_ip(i))
}

fn host_veth(i: usize) -> String {
    format!("mlf-h{}", i + 1)
}

/// Runs a command; an error carries its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("{program}: {error}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Runs a command inside node `i`'s namespace.
fn run_in(i: usize, program: &str, args: &[&str]) -> Result<String, String> {
    let ns = namespace(i);
    let mut all = vec!["netns", "exec", ns.as_str(), program];
    all.extend_from_slice(args);
    run("ip", &all)
}

fn iptables_in(i: usize, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["-w", "5"];
    all.extend_from_slice(args);
    run_in(i, "iptables", &all)
}

/// Checks that the tools are here and installs what is missing
/// (`iproute2`, `iptables`) with apt-get.
pub fn ensure_tools() -> Result<(), String> {
    let missing: Vec<&str> = [
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("iptables", "iptables"),
    ]
    .iter()
    .filter(|(tool, _)| run("sh", &["-c", &format!("command -v {tool}")]).is_err())
    .map(|(_, package)| *package)
    .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("installing {}", missing.join(" "));
    run("apt-get", &["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq"];
    args.extend(missing);
    run("apt-get", &args).map(|_| ())
}

/// Removes whatever an earlier run left behind, by name: processes in our
/// namespaces (killed by pid), the namespaces, links and scratch
/// directories. Returns what it removed.
pub fn cleanup_leftovers() -> Vec<String> {
    let mut removed = Vec::new();
    if let Ok(list) = run("ip", &["netns", "list"]) {
        for line in list.lines() {
            let Some(name) = line.split_whitespace().next() else {
                continue;
            };
            if !name.starts_with(PREFIX) {
                continue;
            }
            if let Ok(pids) = run("ip", &["netns", "pids", name]) {
                for pid in pids
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                {
                    // SAFETY: kill(2) with a pid read from our own namespace.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                    removed.push(format!("process {pid} in {name}"));
                }
            }
            if run("ip", &["netns", "del", name]).is_ok() {
                removed.push(format!("namespace {name}"));
            }
        }
    }
    if let Ok(links) = run("ip", &["-o", "link", "show"]) {
        for line in links.lines() {
            let Some(name) = line.split(": ").nth(1) else {
                continue;
            };
            let name = name.split('@').next().unwrap_or(name);
            if name.starts_with(PREFIX) && run("ip", &["link", "del", name]).is_ok() {
                removed.push(format!("link {name}"));
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("mlf-run-") && std::fs::remove_dir_all(entry.path()).is_ok() {
                removed.push(format!("directory {}", entry.path().display()));
            }
        }
    }
    removed
}

/// A node process and what it needs to restart.
struct NodeProcess {
    child: Option<Child>,
    paused: bool,
}

/// The nodes' writer keys and the trust configuration naming them, for a
/// mesh whose nodes seal their streams (`--hostile-node`): node `i` gets
/// `keys[i]` as its `writer.key` before its first start, and every node's
/// `node.toml` lists `writers` (`KEY@STREAM`, binding each legacy stream
/// to its writer's key, which closes membership: `docs/SIGNING.md`).
#[derive(Debug, Clone)]
pub struct Sealing {
    /// Each node's writer secret key, 32 bytes.
    pub keys: Vec<[u8; 32]>,
    /// The `writers` entries.
    pub writers: Vec<String>,
}

/// The five hosts. Dropping it removes everything it created.
pub struct Mesh {
    binary: PathBuf,
    keys: Option<Vec<[u8; 32]>>,
    scratch: PathBuf,
    logs: PathBuf,
    nodes: Vec<NodeProcess>,
    namespaces: Vec<usize>,
    veths: Vec<usize>,
    bridge: bool,
    impaired: Vec<bool>,
}

impl Mesh {
    /// Builds the network and starts the five nodes. `logs` receives each
    /// node's stdout and stderr (kept as artifacts).
    pub fn start(
        binary: &Path,
        logs: &Path,
        seed: u64,
        sealing: Option<Sealing>,
    ) -> Result<Mesh, String> {
        let scratch = std::env::temp_dir().join(format!("mlf-run-{seed}-{}", std::process::id()));
        let mut mesh = Mesh {
            binary: binary.to_owned(),
            keys: sealing.as_ref().map(|s| s.keys.clone()),
            scratch,
            logs: logs.to_owned(),
            nodes: (0..NODES)
                .map(|_| NodeProcess {
                    child: None,
                    paused: false,
                })
                .collect(),
            namespaces: Vec::new(),
            veths: Vec::new(),
            bridge: false,
            impaired: vec![false; NODES],
        };
        std::fs::create_dir_all(&mesh.scratch).map_err(|e| format!("scratch: {e}"))?;
        std::fs::create_dir_all(&mesh.logs).map_err(|e| format!("logs: {e}"))?;
        // Short heartbeats and backoff, so a healed link is redialed fast
        // (the defaults, 1 s and up to 10 s, would dominate convergence).
        let mut settings = String::from(
            "heartbeat_ms = 200\nbackoff_min_ms = 50\nbackoff_max_ms = 1000\nconnect_timeout_ms = 1000\n",
        );
        if let Some(sealing) = &sealing {
            let quoted: Vec<String> = sealing.writers.iter().map(|w| format!("{w:?}")).collect();
            settings.push_str(&format!("writers = [{}]\n", quoted.join(", ")));
        }
        std::fs::write(mesh.scratch.join("node.toml"), settings)
            .map_err(|e| format!("node.toml: {e}"))?;
        mesh.build_network()?;
        for i in 0..NODES {
            mesh.spawn(i)?;
        }
        Ok(mesh)
    }

    fn build_network(&mut self) -> Result<(), String> {
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
        self.bridge = true;
        run(
            "ip",
            &["addr", "add", &format!("{BRIDGE_ADDR}/24"), "dev", BRIDGE],
        )?;
        run(
            "ip",
            &["addr", "add", &format!("{OBSERVER_ADDR}/24"), "dev", BRIDGE],
        )?;
        run("ip", &["link", "set", BRIDGE, "up"])?;
        for i in 0..NODES {
            let ns = namespace(i);
            let host = host_veth(i);
            let inner = format!("mlf-c{}", i + 1);
            run("ip", &["netns", "add", &ns])?;
            self.namespaces.push(i);
            run(
                "ip",
                &["link", "add", &host, "type", "veth", "peer", "name", &inner],
            )?;
            self.veths.push(i);
            run("ip", &["link", "set", &inner, "netns", &ns])?;
            run("ip", &["-n", &ns, "link", "set", &inner, "name", "eth0"])?;
            run(
                "ip",
                &[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{}/24", node_ip(i)),
                    "dev",
                    "eth0",
                ],
            )?;
            run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
            run("ip", &["link", "set", &host, "master", BRIDGE])?;
            run("ip", &["link", "set", &host, "up"])?;
            // Two chains: partitions and loss, healed separately.
            for chain in ["mlf-part", "mlf-loss"] {
                iptables_in(i, &["-N", chain])?;
                iptables_in(i, &["-A", "INPUT", "!", "-i", "lo", "-j", chain])?;
                iptables_in(i, &["-A", "OUTPUT", "!", "-o", "lo", "-j", chain])?;
            }
        }
        Ok(())
    }

    fn stdout_path(&self, i: usize) -> PathBuf {
        self.logs.join(format!("n{}.stdout", i + 1))
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let stdout_path = self.stdout_path(i);
        let listening_before = count_listening(&stdout_path);
        let open = |path: PathBuf| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        let stdout: File = open(stdout_path.clone())?;
        let stderr: File = open(self.logs.join(format!("n{}.log", i + 1)))?;
        let data = self.scratch.join(format!("n{}", i + 1));
        // The histories name node i's stream `i + 1`: the data directory
        // records it before the first start (a legacy directory, which
        // keeps its id; a new one would write the stream its key derives
        // and refuse `--stream-id`: docs/SIGNING.md, the upgrade policy).
        let recorded = data.join("stream-id");
        if !recorded.exists() {
            std::fs::create_dir_all(&data)
                .and_then(|()| std::fs::write(&recorded, format!("{}\n", i + 1)))
                .map_err(|e| format!("{}: {e}", recorded.display()))?;
            // A sealing mesh's key, bound to the legacy stream by the
            // trust configuration (the node refuses a key file others may
            // read).
            if let Some(key) = self.keys.as_ref().map(|keys| keys[i]) {
                let path = data.join("writer.key");
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .and_then(|mut file| std::io::Write::write_all(&mut file, &key))
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &namespace(i)])
            .arg(&self.binary)
            .arg("serve")
            .arg("--data")
            .arg(&data)
            .args(["--listen", &format!("{}:{PORT}", node_ip(i))])
            .args(["--stream-id", &(i + 1).to_string()])
            .arg("--config")
            .arg(self.scratch.join("node.toml"));
        for peer in (0..NODES).filter(|&p| p != i) {
            command.args(["--peer", &node_url(peer)]);
        }
        // `ip netns exec` execs the binary in place: the child's pid is the
        // node's, so signals reach the node itself.
        let child = command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .env("RUST_LOG", "info")
            .env("MESHLOG_ADMIN_SECRETS", crate::http::ADMIN_SECRET)
            .env("MESHLOG_PEER_SECRETS", crate::http::PEER_SECRET)
            .spawn()
            .map_err(|e| format!("spawn node {}: {e}", i + 1))?;
        self.nodes[i] = NodeProcess {
            child: Some(child),
            paused: false,
        };
        let started = Instant::now();
        while count_listening(&stdout_path) <= listening_before {
            if let Some(child) = self.nodes[i].child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!(
                        "node {} exited at start with {status}; see {}",
                        i + 1,
                        self.logs.display()
                    ));
                }
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(format!("node {} did not start within 15 s", i + 1));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// `kill -9` node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.nodes[i].paused = false;
    }

    /// Starts node `i` again on its data directory (after [`Mesh::kill`]).
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.nodes[i].child.is_some() {
            return Ok(());
        }
        self.spawn(i)
    }

    /// `SIGSTOP` or `SIGCONT` node `i`.
    pub fn pause(&mut self, i: usize, paused: bool) {
        if let Some(child) = &self.nodes[i].child {
            let signal = if paused { libc::SIGSTOP } else { libc::SIGCONT };
            // SAFETY: kill(2) on our own child's pid, which we have not
            // reaped (it is still in `self.nodes`).
            unsafe {
                libc::kill(child.id() as i32, signal);
            }
            self.nodes[i].paused = paused;
        }
    }

    /// Whether node `i` is running (not killed) and not paused.
    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].child.is_some() && !self.nodes[i].paused
    }

    /// Drops every packet between `a` and each of `others`, both ways
    /// (rules in `a`'s namespace).
    pub fn cut(&self, a: usize, others: &[usize]) -> Result<(), String> {
        for &other in others {
            let ip = node_ip(other);
            iptables_in(a, &["-A", "mlf-part", "-s", &ip, "-j", "DROP"])?;
            iptables_in(a, &["-A", "mlf-part", "-d", &ip, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Drops packets from `source` arriving at `target`; the other way
    /// passes.
    pub fn cut_one_way(&self, source: usize, target: usize) -> Result<(), String> {
        iptables_in(
            target,
            &["-A", "mlf-part", "-s", &node_ip(source), "-j", "DROP"],
        )
        .map(|_| ())
    }

    /// Lifts every partition.
    pub fn heal_partitions(&self) -> Result<(), String> {
        for i in 0..NODES {
            iptables_in(i, &["-F", "mlf-part"])?;
        }
        Ok(())
    }

    /// Impairs node `i`'s link: loss both ways, duplication and slow
    /// (delayed, reordered) packets outward.
    pub fn impair(&mut self, i: usize, link: &LinkProfile) -> Result<(), String> {
        if self.impaired[i] {
            return Ok(());
        }
        self.impaired[i] = true;
        if link.loss_pct > 0 {
            let p = format!("{:.3}", f64::from(link.loss_pct) / 100.0);
            iptables_in(i, &["-A", "mlf-loss", "-s", OBSERVER_ADDR, "-j", "RETURN"])?;
            iptables_in(i, &["-A", "mlf-loss", "-d", OBSERVER_ADDR, "-j", "RETURN"])?;
            iptables_in(
                i,
                &[
                    "-A",
                    "mlf-loss",
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    &p,
                    "-j",
                    "DROP",
                ],
            )?;
        }
        if link.duplicate_pct > 0 {
            let p = format!("{:.3}", f64::from(link.duplicate_pct) / 100.0);
            let targets: Vec<String> = (0..NODES)
                .filter(|&n| n != i)
                .map(node_ip)
                .chain([BRIDGE_ADDR.to_owned()])
                .collect();
            for ip in &targets {
                iptables_in(
                    i,
                    &[
                        "-t",
                        "mangle",
                        "-A",
                        "OUTPUT",
                        "-d",
                        ip,
                        "-m",
                        "statistic",
                        "--mode",
                        "random",
                        "--probability",
                        &p,
                        "-j",
                        "TEE",
                        "--gateway",
                        ip,
                    ],
                )?;
            }
        }
        if link.slow_pct > 0 {
            let rate = format!("{}kbit", link.slow_kbit);
            run_in(
                i,
                "tc",
                &[
                    "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10",
                ],
            )?;
            run_in(
                i,
                "tc",
                &[
                    "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb",
                    "rate", "1gbit",
                ],
            )?;
            run_in(
                i,
                "tc",
                &[
                    "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb",
                    "rate", &rate, "ceil", &rate,
                ],
            )?;
            run_in(
                i,
                "tc",
                &[
                    "qdisc", "add", "dev", "eth0", "parent", "1:20", "handle", "20:", "pfifo",
                    "limit", "1000",
                ],
            )?;
            let p = format!("{:.3}", f64::from(link.slow_pct) / 100.0);
            iptables_in(
                i,
                &[
                    "-t",
                    "mangle",
                    "-A",
                    "POSTROUTING",
                    "-o",
                    "eth0",
                    "!",
                    "-d",
                    OBSERVER_ADDR,
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    &p,
                    "-j",
                    "CLASSIFY",
                    "--set-class",
                    "1:20",
                ],
            )?;
        }
        Ok(())
    }

    /// Whether any link is impaired now.
    pub fn any_impaired(&self) -> bool {
        self.impaired.iter().any(|&i| i)
    }

    /// Removes every link impairment.
    pub fn clear_impairments(&mut self) -> Result<(), String> {
        for i in 0..NODES {
            if !self.impaired[i] {
                continue;
            }
            iptables_in(i, &["-F", "mlf-loss"])?;
            iptables_in(i, &["-t", "mangle", "-F"])?;
            // Absent when the profile had no slow share.
            let _ = run_in(i, "tc", &["qdisc", "del", "dev", "eth0", "root"]);
            self.impaired[i] = false;
        }
        Ok(())
    }
}

fn count_listening(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|text| {
            text.lines()
                .filter(|l| l.starts_with("listening on"))
                .count()
        })
        .unwrap_or(0)
}

impl Drop for Mesh {
    fn drop(&mut self) {
        for i in 0..NODES {
            if self.nodes[i].paused {
                self.pause(i, false);
            }
            self.kill(i);
        }
        for &i in &self.namespaces {
            // Deleting a namespace deletes its end of the veth, and with it
            // the pair.
            let _ = run("ip", &["netns", "del", &namespace(i)]);
        }
        for &i in &self.veths {
            let _ = run("ip", &["link", "del", &host_veth(i)]);
        }
        if self.bridge {
            let _ = run("ip", &["link", "del", BRIDGE]);
        }
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}
