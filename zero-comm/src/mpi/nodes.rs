//! [`MpiComm::node_groups`]: dividing an MPI communicator into the node groups of
//! [`crate::nodes`].
//!
//! Which ranks share a node, in order: ranks per node given explicitly (emulated nodes of
//! consecutive ranks); else, inside a Slurm step, Slurm's node id (`SLURM_NODEID`; a test
//! cluster may run several Slurm nodes on one host, where shared memory would see one
//! node, so a Slurm node is the unit); else shared memory (`MPI_COMM_TYPE_SHARED`). Every
//! rank then all-gathers its node id and validates the same table, so all ranks agree
//! (the groups, or the same error) and none waits in a split the others never reach.
//! The exchanges use MPI directly: set-up is not in the accounting.

use super::MpiComm;
use crate::communicator::Communicator;
use crate::error::{CommError, Result};
use crate::nodes::{self, NodeGroups};
use mpi::ffi;
use std::rc::Rc;

/// How a rank found its node (agreed on first: a mixture would compare unlike ids).
const EXPLICIT: i64 = 1;
const SLURM: i64 = 2;
const SHARED: i64 = 3;

/// Slurm's node id of this process, when it is task `rank` of a Slurm step of `size`
/// tasks (`SLURM_STEP_ID`, `SLURM_NODEID`, `SLURM_PROCID` = rank and
/// `SLURM_STEP_NUM_TASKS` = size: srun started the ranks themselves; mpirun inside an
/// allocation starts them from its own daemons, whose step says nothing about them);
/// -1 when `SLURM_NODEID` is not a number (reported by validation as a node of its own).
fn slurm_node(rank: usize, size: usize) -> Option<i64> {
    std::env::var_os("SLURM_STEP_ID")?;
    let number = |name: &str| -> Option<usize> { std::env::var(name).ok()?.trim().parse().ok() };
    if number("SLURM_PROCID") != Some(rank) || number("SLURM_STEP_NUM_TASKS") != Some(size) {
        return None;
    }
    let id = std::env::var("SLURM_NODEID").ok()?;
    Some(id.trim().parse::<i64>().unwrap_or(-1))
}

impl MpiComm {
    /// Every rank's `mine` (same length on every rank), in rank order. Not counted.
    fn gather_i64(&self, mine: &[i64]) -> Result<Vec<i64>> {
        let k = mine.len();
        let mut all = vec![0i64; k * self.size];
        // SAFETY: `mine` holds k i64 and `all` k * size, as the counts say; collective
        // over `self.raw`, which every rank of it calls with the same k.
        let rc = self.watched_set_up(
            "MPI_Allgather",
            "exchanging node ids for the node groups",
            || unsafe {
                ffi::MPI_Allgather(
                    mine.as_ptr() as *const _,
                    k as i32,
                    ffi::RSMPI_INT64_T,
                    all.as_mut_ptr() as *mut _,
                    k as i32,
                    ffi::RSMPI_INT64_T,
                    self.raw,
                )
            },
        );
        self.check_rc("MPI_Allgather (node groups)", rc)?;
        Ok(all)
    }

    fn nodes_err(&self, detail: String) -> CommError {
        CommError::Nodes {
            rank: self.shared.world_rank,
            comm: self.name.to_string(),
            detail,
        }
    }

    /// Split, naming the result `name` (messages then say which group failed).
    fn split_named(&self, color: usize, name: &str) -> Result<MpiComm> {
        let color = u32::try_from(color).map_err(|_| self.nodes_err(format!("{color} groups")))?;
        let mut c = self
            .split(Some(color), self.rank as i32)?
            .ok_or_else(|| self.nodes_err(format!("the split into '{name}' gave no group")))?;
        c.name = Rc::from(name);
        Ok(c)
    }

    /// Divide this communicator (N ranks) into the node groups of a node-major world of
    /// M nodes of L ranks (collective: every rank must call it, with the same argument).
    ///
    /// Nodes are, in order: `Some(L)`: emulated nodes of L consecutive ranks (L must
    /// divide N); inside a Slurm step (`SLURM_STEP_ID`, `SLURM_NODEID` set): the ranks of
    /// one Slurm node; else the ranks that share memory ([`MpiComm::node_local`]). Every
    /// rank returns the same [`CommError::Nodes`] when the nodes differ in size or the
    /// ranks are not numbered node by node, saying what was found and what to do. The
    /// groups are named `node[m]` (node m) and `cross[j]` (the j-th rank of every node);
    /// [`crate::nodes`] has their ranks.
    pub fn node_groups(&self, ranks_per_node: Option<usize>) -> Result<NodeGroups<MpiComm>> {
        let n = self.size;
        let (source, node) = match (ranks_per_node, slurm_node(self.rank, self.size)) {
            // Node id r / L; L = 0 is refused below, after every rank has agreed.
            (Some(l), _) => (EXPLICIT, (self.rank / l.max(1)) as i64),
            (None, Some(id)) => (SLURM, id),
            (None, None) => (SHARED, 0),
        };
        let asked = ranks_per_node.map_or(-1, |l| l as i64);
        let how = self.gather_i64(&[source, asked, node])?;
        let row = |r: usize| &how[3 * r..3 * r + 3];
        if let Some(r) = (1..n).find(|&r| row(r)[..2] != row(0)[..2]) {
            let says = |r: usize| match row(r) {
                [EXPLICIT, l, _] => format!("{l} ranks per node"),
                [SLURM, _, _] => "Slurm's node ids".to_string(),
                _ => "shared memory".to_string(),
            };
            return Err(self.nodes_err(format!(
                "rank 0 divides by {} but rank {r} by {}: every rank must pass the same ranks per node and see the same launcher",
                says(0),
                says(r)
            )));
        }
        let node_of: Vec<i64> = match source {
            EXPLICIT => {
                let l = ranks_per_node.unwrap_or(0);
                if l == 0 || !n.is_multiple_of(l) {
                    return Err(self.nodes_err(format!(
                        "{l} ranks per node does not divide the {n} ranks into equal nodes; give a positive divisor of {n}, or none to find the nodes"
                    )));
                }
                (0..n).map(|r| row(r)[2]).collect()
            }
            SLURM => (0..n).map(|r| row(r)[2]).collect(),
            _ => {
                // The node's id: the lowest rank on it (rank 0 of the shared-memory split).
                let local = self.node_local()?;
                let mut leader = [self.rank as i64];
                // SAFETY: one i64 each side; collective over `local`, every rank calls it.
                let rc = local.watched_set_up(
                    "MPI_Bcast",
                    "naming each node by its lowest rank",
                    || unsafe {
                        ffi::MPI_Bcast(
                            leader.as_mut_ptr() as *mut _,
                            1,
                            ffi::RSMPI_INT64_T,
                            0,
                            local.raw,
                        )
                    },
                );
                local.check_rc("MPI_Bcast (node groups)", rc)?;
                self.gather_i64(&leader)?
            }
        };
        let l = nodes::ranks_per_node(&node_of).map_err(|e| {
            let by = match source {
                EXPLICIT => "",
                SLURM => "nodes by SLURM_NODEID: ",
                _ => "nodes by shared memory: ",
            };
            self.nodes_err(format!("{by}{e}"))
        })?;
        // Each group's name carries its index, so that the watchdog's question "do you
        // wait in all_gather #5 on node[1]?" is never answered for another node's group.
        let (m, j) = (self.rank / l, self.rank % l);
        let node = self.split_named(m, &format!("node[{m}]"))?;
        let cross = self.split_named(j, &format!("cross[{j}]"))?;
        debug_assert_eq!((node.rank(), cross.rank()), (self.rank % l, self.rank / l));
        Ok(NodeGroups { node, cross })
    }
}
