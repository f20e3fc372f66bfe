//! Seeded schedules: what the nemesis does to the mesh, drawn from one seed
//! so that `--seed` replays it.
//!
//! In the manner of TigerBeetle's VOPR, a schedule first draws its link
//! profile (how lossy, duplicating and slow the impaired links are), then
//! a sequence of steps; each step applies one fault, holds it, heals it,
//! and waits a little. Link impairments, once applied to a node, stay until
//! the final heal, so the partitions, kills and pauses that follow happen
//! on a bad network and the final convergence is measured on it too.

use meshlog_testkit::SplitMix64;

/// How many hosts the mesh has.
pub const NODES: usize = 5;

/// A link's impairments, all from the kernel (see `docs/FAULTS.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkProfile {
    /// Percent of packets dropped, each way.
    pub loss_pct: u32,
    /// Percent of outgoing packets sent twice.
    pub duplicate_pct: u32,
    /// Percent of outgoing packets sent through a slow, rate-limited queue:
    /// they are delayed and overtaken by the others (reordering).
    pub slow_pct: u32,
    /// The slow queue's rate, kbit/s.
    pub slow_kbit: u32,
}

impl std::fmt::Display for LinkProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "loss {}%, duplicate {}%, slow {}% at {} kbit/s",
            self.loss_pct, self.duplicate_pct, self.slow_pct, self.slow_kbit
        )
    }
}

/// One fault the nemesis applies and later heals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Impair the links of these nodes (kept until the final heal).
    Impair {
        /// Node indices.
        nodes: Vec<usize>,
    },
    /// Cut one node off from every other node (clients still reach it).
    Isolate {
        /// The node.
        node: usize,
    },
    /// A clean split: `minority` on one side, the rest on the other.
    Split {
        /// The two nodes on the small side.
        minority: Vec<usize>,
    },
    /// Packets from `source` to `target` are dropped; the other way passes.
    OneWay {
        /// Whose packets are dropped.
        source: usize,
        /// Where they are dropped.
        target: usize,
    },
    /// `kill -9` the node; the heal restarts it on its data directory.
    Kill {
        /// The node.
        node: usize,
    },
    /// `SIGSTOP` the node; the heal sends `SIGCONT`.
    Pause {
        /// The node.
        node: usize,
    },
    /// `POST /compact {"keep_last": N}` on every node (floors never pass
    /// what a peer acknowledged). Nothing to heal; after the final heal
    /// every node compacts again with the schedule's smallest `keep_last`,
    /// so that the nodes can agree on one floor.
    Compact {
        /// Events kept per stream.
        keep_last: u64,
    },
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |node: &usize| format!("n{}", node + 1);
        match self {
            Fault::Impair { nodes } => {
                let nodes: Vec<_> = nodes.iter().map(name).collect();
                write!(f, "impair {}", nodes.join(","))
            }
            Fault::Isolate { node } => write!(f, "isolate {}", name(node)),
            Fault::Split { minority } => {
                let small: Vec<_> = minority.iter().map(name).collect();
                let large: Vec<_> = (0..NODES)
                    .filter(|n| !minority.contains(n))
                    .map(|n| name(&n))
                    .collect();
                write!(f, "split {} | {}", small.join(","), large.join(","))
            }
            Fault::OneWay { source, target } => {
                write!(f, "one-way cut {} -> {}", name(source), name(target))
            }
            Fault::Kill { node } => write!(f, "kill -9 {}", name(node)),
            Fault::Pause { node } => write!(f, "pause {}", name(node)),
            Fault::Compact { keep_last } => {
                write!(f, "compact every node, keep_last {keep_last}")
            }
        }
    }
}

/// One step: apply, hold, heal, then rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The fault.
    pub fault: Fault,
    /// How long it holds, ms.
    pub hold_ms: u64,
    /// How long the mesh runs healed before the next step, ms.
    pub rest_ms: u64,
}

/// A whole schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The seed it was drawn from.
    pub seed: u64,
    /// The impaired links' profile.
    pub link: LinkProfile,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

impl Schedule {
    /// Draws a schedule of `steps` steps from `seed`.
    pub fn draw(seed: u64, steps: usize) -> Schedule {
        let mut rng = SplitMix64::new(seed);
        // Up to 20% loss each way: the goal's bound (docs/FAULTS.md).
        let link = LinkProfile {
            loss_pct: rng.between(0, 20) as u32,
            duplicate_pct: rng.between(0, 5) as u32,
            slow_pct: rng.between(0, 30) as u32,
            slow_kbit: rng.between(256, 2048) as u32,
        };
        let mut nodes: Vec<usize> = (0..NODES).collect();
        let mut drawn = Vec::with_capacity(steps);
        for index in 0..steps {
            rng.shuffle(&mut nodes);
            // The first step impairs links half the time, so most schedules
            // run their partitions and crashes on a bad network.
            let kind = if index == 0 && rng.chance(0.5) {
                0
            } else {
                rng.below(7)
            };
            let fault = match kind {
                0 => {
                    let count = rng.between(1, NODES as u64) as usize;
                    let mut chosen = nodes[..count].to_vec();
                    chosen.sort_unstable();
                    Fault::Impair { nodes: chosen }
                }
                1 => Fault::Isolate { node: nodes[0] },
                2 => {
                    let mut minority = nodes[..2].to_vec();
                    minority.sort_unstable();
                    Fault::Split { minority }
                }
                3 => Fault::OneWay {
                    source: nodes[0],
                    target: nodes[1],
                },
                4 => Fault::Kill { node: nodes[0] },
                5 => Fault::Pause { node: nodes[0] },
                _ => Fault::Compact {
                    keep_last: rng.between(5, 100),
                },
            };
            drawn.push(Step {
                fault,
                hold_ms: rng.between(1_000, 3_000),
                rest_ms: rng.between(200, 1_000),
            });
        }
        Schedule {
            seed,
            link,
            steps: drawn,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_schedule_and_stays_in_bounds() {
        for seed in 0..200 {
            let schedule = Schedule::draw(seed, 8);
            assert_eq!(schedule, Schedule::draw(seed, 8));
            assert!(schedule.link.loss_pct <= 20);
            for step in &schedule.steps {
                assert!((1_000..=3_000).contains(&step.hold_ms));
                match &step.fault {
                    Fault::Split { minority } => assert_eq!(minority.len(), 2),
                    Fault::OneWay { source, target } => assert_ne!(source, target),
                    Fault::Impair { nodes } => assert!(!nodes.is_empty()),
                    _ => {}
                }
            }
        }
        assert_ne!(Schedule::draw(1, 8), Schedule::draw(2, 8));
    }

    #[test]
    fn faults_print_with_node_names() {
        let split = Fault::Split {
            minority: vec![0, 3],
        };
        assert_eq!(split.to_string(), "split n1,n4 | n2,n3,n5");
        let cut = Fault::OneWay {
            source: 1,
            target: 4,
        };
        assert_eq!(cut.to_string(), "one-way cut n2 -> n5");
    }
}
