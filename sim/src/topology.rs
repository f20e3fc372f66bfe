//! A random connected graph over the replicas, and its diameter.

use std::collections::{BTreeSet, VecDeque};

use meshlog_testkit::SplitMix64;

/// A random connected graph on `nodes` vertices: a random spanning tree
/// (each node after the first joins one before it) plus `extra` random
/// edges, no self-loop, no edge twice. Edges as `(dialer, listener)`.
pub fn random_connected(nodes: usize, extra: usize, rng: &mut SplitMix64) -> Vec<(usize, usize)> {
    let mut edges = BTreeSet::new();
    let mut order: Vec<usize> = (0..nodes).collect();
    rng.shuffle(&mut order);
    for i in 1..nodes {
        let parent = order[rng.below(i as u64) as usize];
        edges.insert(ordered(order[i], parent));
    }
    let mut tries = 0;
    while edges.len() < nodes - 1 + extra && tries < extra * 20 + 100 && nodes > 2 {
        tries += 1;
        let a = rng.below(nodes as u64) as usize;
        let b = rng.below(nodes as u64) as usize;
        if a != b {
            edges.insert(ordered(a, b));
        }
    }
    // Who dials is drawn, so neither end of the id order always dials.
    edges
        .into_iter()
        .map(|(a, b)| if rng.chance(0.5) { (a, b) } else { (b, a) })
        .collect()
}

fn ordered(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
}

/// The longest shortest path (in hops) between two nodes of a connected
/// graph: a breadth-first search from every node.
pub fn diameter(nodes: usize, edges: &[(usize, usize)]) -> usize {
    let mut adjacent = vec![Vec::new(); nodes];
    for &(a, b) in edges {
        adjacent[a].push(b);
        adjacent[b].push(a);
    }
    let mut longest = 0;
    let mut hops = vec![usize::MAX; nodes];
    let mut queue = VecDeque::new();
    for source in 0..nodes {
        hops.iter_mut().for_each(|h| *h = usize::MAX);
        hops[source] = 0;
        queue.push_back(source);
        while let Some(node) = queue.pop_front() {
            for &next in &adjacent[node] {
                if hops[next] == usize::MAX {
                    hops[next] = hops[node] + 1;
                    longest = longest.max(hops[next]);
                    queue.push_back(next);
                }
            }
        }
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_graph_is_connected_with_the_edges_asked() {
        let mut rng = SplitMix64::new(7);
        let edges = random_connected(50, 30, &mut rng);
        assert_eq!(edges.len(), 49 + 30);
        assert!(diameter(50, &edges) < 50);
        // A path of four nodes has diameter three.
        assert_eq!(diameter(4, &[(0, 1), (1, 2), (3, 2)]), 3);
    }
}
