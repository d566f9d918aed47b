//! Node groups: a world of N = M x L ranks on M nodes of L ranks each, node-major (world
//! rank r = m L + j is local rank j of node m), divided into the two sub-communicators a
//! hierarchical (two-level) data-parallel engine uses: `node`, the L ranks of this rank's
//! node (communicator rank j), and `cross`, the M ranks with this rank's local index, one
//! per node (communicator rank m).
//!
//! Node-major with equal nodes is what makes the two levels compose: an all-gather over
//! `node` then over `cross` reproduces the world's all-gather in world-rank order, and
//! block r of a world-sized buffer is rank r's on both levels. So a layout that is not
//! (unequal nodes, ranks dealt round-robin) is an error on every rank, naming what was
//! found and how to launch instead, never a silent reordering.
//!
//! Where the nodes come from: `MpiComm::node_groups` (emulated, Slurm's node id, or shared
//! memory), [`crate::SocketComm::node_groups`] (emulated, or host names) and
//! [`crate::LocalComm::world_on_nodes`] (thread ranks, emulated).

use crate::communicator::Communicator;

/// The two sub-communicators of a node-major world.
#[derive(Debug)]
pub struct NodeGroups<C> {
    /// The L ranks of this rank's node, in world-rank order (rank = local index j).
    pub node: C,
    /// The M ranks with this rank's local index, one per node, in node order
    /// (rank = node m).
    pub cross: C,
}

impl<C: Communicator> NodeGroups<C> {
    /// L: ranks on each node.
    pub fn ranks_per_node(&self) -> usize {
        self.node.size()
    }

    /// M: nodes.
    pub fn nodes(&self) -> usize {
        self.cross.size()
    }
}

/// What to do about a layout that is not node-major with equal nodes (for messages).
pub(crate) const TODO: &str = "launch the same number of ranks on every node, numbered node by node (srun --distribution=block, mpirun --map-by slot or --map-by core), or give the ranks per node explicitly";

/// The ranks per node L of a world where rank r is on the node identified by `node_of[r]`
/// (any id, equal for the ranks of one node; nodes are numbered in order of their lowest
/// rank), when the world is node-major with equal nodes; else what was found and what to
/// do. Pure, so every rank given the same table reaches the same verdict. MPI and the TCP
/// world need it: thread ranks are node-major by construction.
pub(crate) fn ranks_per_node(node_of: &[i64]) -> Result<usize, String> {
    let mut ids: Vec<i64> = Vec::new();
    let mut index = Vec::with_capacity(node_of.len());
    let mut sizes: Vec<usize> = Vec::new();
    for &id in node_of {
        let m = match ids.iter().position(|&x| x == id) {
            Some(m) => m,
            None => {
                ids.push(id);
                sizes.push(0);
                ids.len() - 1
            }
        };
        sizes[m] += 1;
        index.push(m);
    }
    let Some(&l) = sizes.first() else {
        return Err("no ranks".to_string());
    };
    if sizes.iter().any(|&s| s != l) {
        let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
        return Err(format!(
            "{} nodes with unequal numbers of ranks: node sizes {}; {TODO}",
            sizes.len(),
            list.join(", ")
        ));
    }
    // Nodes are numbered by first appearance, so a node whose ranks are not consecutive
    // shows as a rank on a lower-numbered node than the rank before it.
    if let Some(r) = (1..index.len()).find(|&r| index[r] < index[r - 1]) {
        return Err(format!(
            "rank {} is on node {} but rank {r} on node {}: ranks are not node-major; {TODO}",
            r - 1,
            index[r - 1],
            index[r]
        ));
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_major_layouts_give_their_ranks_per_node() {
        assert_eq!(ranks_per_node(&[0, 0, 1, 1]), Ok(2));
        assert_eq!(ranks_per_node(&[7, 7, 7, 3, 3, 3]), Ok(3));
        assert_eq!(ranks_per_node(&[5, 6, 7]), Ok(1));
        assert_eq!(ranks_per_node(&[4, 4, 4, 4]), Ok(4));
    }

    #[test]
    fn unequal_nodes_are_named_with_their_sizes() {
        let e = ranks_per_node(&[0, 0, 0, 1]).unwrap_err();
        assert!(e.contains("node sizes 3, 1"), "{e}");
        assert!(e.contains("--distribution=block"), "{e}");
    }

    #[test]
    fn round_robin_is_not_node_major() {
        let e = ranks_per_node(&[0, 1, 0, 1]).unwrap_err();
        assert!(
            e.contains("rank 1 is on node 1 but rank 2 on node 0: ranks are not node-major"),
            "{e}"
        );
        let e = ranks_per_node(&[0, 0, 1, 1, 0, 0, 1, 1]).unwrap_err();
        assert!(
            e.contains("rank 3 is on node 1 but rank 4 on node 0"),
            "{e}"
        );
    }
}
