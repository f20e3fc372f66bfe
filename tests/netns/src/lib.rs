//! meshlog under real network faults: five `meshlog serve` processes, each
//! in its own Linux network namespace with its own address and data
//! directory, meshed over a bridge; a nemesis that drops, duplicates and
//! delays packets in the kernel, partitions the mesh with iptables, kills
//! nodes with `SIGKILL` and pauses them with `SIGSTOP`; clients that append
//! and page through it all, recording a history; and a checker that judges
//! the history afterwards. `docs/FAULTS.md` says how to run it and what it
//! found.
//!
//! # Layout
//!
//! - [`history`]: the records of a run, one JSON object per line.
//! - [`check`]: the checker, a pure function of a history, and its
//!   [`check::Violation`]s. Unit-tested on synthetic histories with planted
//!   bugs.
//! - [`schedule`]: seeded schedules of faults.
//! - [`http`]: a small blocking HTTP/1.1 client with timeouts.
//! - [`net`]: the namespaces, bridge, nodes and kernel faults, and the
//!   guard that removes them.
//! - [`hostile`]: the hostile node (`--hostile-node`): a peer holding the
//!   peer secret but no writer key, which syncs honestly with the nodes
//!   and between sessions sends them forged events and floors.
//! - [`run`]: one schedule end to end: clients, nemesis, final heal,
//!   convergence, final reads.
//!
//! **Architecture Invariant:** the checker knows nothing of namespaces,
//! processes or sockets; it reads records. So it can be tested on
//! synthetic histories, and a recorded history can be re-judged later
//! (`meshlog-faults --check FILE`).

pub mod check;
pub mod history;
pub mod hostile;
pub mod http;
pub mod net;
pub mod run;
pub mod schedule;
