//! The world `train` and `ckpt bench` run in, whichever way this binary was built:
//!
//! - with feature `mpi` (default): MPI's world, one process per rank under mpirun or
//!   srun (a singleton world of 1 when started directly);
//! - without it (the carried GPU build, which must not need libmpi): one process alone,
//!   over an in-process communicator of one rank. Started by a launcher as one of
//!   several ranks, it stops and says how to build for that instead of training N
//!   unrelated copies.
//!
//! [`WorldComm`] names the communicator of either, so the callers carry no `cfg`.

/// Environment variables set by the launchers we know for every rank they start:
/// Open MPI's mpirun, PMIx (srun --mpi=pmix, prterun), PMI-1/2 (MPICH hydra, srun
/// --mpi=pmi2) and MPICH's `MPI_LOCALNRANKS`.
const LAUNCHER_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALNRANKS",
];

/// Whether this process was started by an MPI launcher.
pub fn under_launcher() -> bool {
    LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some())
}

pub use backend::{device_pointers, init, node_groups, node_rank, ranks_on_this_node, WorldComm};

#[cfg(feature = "mpi")]
mod backend {
    use anyhow::anyhow;
    use zero_comm::{Communicator, MpiComm, MpiContext};

    /// The world communicator: MPI's.
    pub type WorldComm = MpiComm;

    /// MPI, up: keep it alive for as long as `comm` is used.
    pub struct World {
        /// The world communicator.
        pub comm: WorldComm,
        /// Finalises MPI when dropped (after `comm`: fields drop in declaration order).
        pub _ctx: MpiContext,
    }

    /// Bring MPI up (a singleton world of 1 when not launched by mpirun/srun).
    pub fn init(_command: &str) -> anyhow::Result<World> {
        let (ctx, comm) = zero_comm::init().map_err(|e| anyhow!("cannot initialise MPI: {e}"))?;
        Ok(World { comm, _ctx: ctx })
    }

    /// The ranks of this job on this node (collective).
    pub fn ranks_on_this_node(comm: &WorldComm) -> anyhow::Result<usize> {
        Ok(node_rank(comm)?.1)
    }

    /// (this rank's rank among the ranks on its node, how many there are): the shared
    /// memory split (collective).
    pub fn node_rank(comm: &WorldComm) -> anyhow::Result<(usize, usize)> {
        let node = comm
            .node_local()
            .map_err(|e| anyhow!("finding the ranks on this node: {e}"))?;
        Ok((node.rank(), node.size()))
    }

    /// `--comm mpi-cuda`: MPI takes device pointers (the probe said it can).
    pub fn device_pointers(comm: &WorldComm) -> anyhow::Result<()> {
        comm.set_device_pointers(true);
        Ok(())
    }

    /// The node and cross-node groups of the world (collective): nodes of
    /// `ranks_per_node` consecutive ranks, or (`None`) the Slurm nodes of an srun step,
    /// else the shared-memory split.
    pub fn node_groups(
        comm: &WorldComm,
        ranks_per_node: Option<usize>,
    ) -> anyhow::Result<zero_comm::NodeGroups<WorldComm>> {
        comm.node_groups(ranks_per_node)
            .map_err(|e| anyhow!("finding the nodes of the world: {e}"))
    }
}

#[cfg(not(feature = "mpi"))]
mod backend {
    use anyhow::anyhow;
    use zero_comm::{CommConfig, LocalComm};

    /// The world communicator: one rank, in this process.
    pub type WorldComm = LocalComm;

    /// A world of one process.
    pub struct World {
        /// The world communicator (rank 0 of 1).
        pub comm: WorldComm,
    }

    /// A world of one, unless a launcher started this process as one of several ranks
    /// (`command` names what was run, for the error).
    pub fn init(command: &str) -> anyhow::Result<World> {
        if let Some(why) = one_of_several() {
            return Err(crate::features::missing(
                "mpi",
                &format!("`{command}` as one of several ranks under mpirun/srun ({why}; this build runs one process alone)"),
            ));
        }
        let config = CommConfig::from_env().map_err(|e| anyhow!("{e}"))?;
        let comm = LocalComm::world(1, config)
            .map_err(|e| anyhow!("creating the one-rank world: {e}"))?
            .pop()
            .ok_or_else(|| anyhow!("creating the one-rank world: no communicator"))?;
        Ok(World { comm })
    }

    /// One process: all of this node is its own.
    pub fn ranks_on_this_node(_comm: &WorldComm) -> anyhow::Result<usize> {
        Ok(1)
    }

    /// One process: rank 0 of 1 on its node.
    pub fn node_rank(_comm: &WorldComm) -> anyhow::Result<(usize, usize)> {
        Ok((0, 1))
    }

    /// One process: one node of one rank (`ranks_per_node` must be 1 or unset).
    pub fn node_groups(
        comm: &WorldComm,
        ranks_per_node: Option<usize>,
    ) -> anyhow::Result<zero_comm::NodeGroups<WorldComm>> {
        if let Some(l) = ranks_per_node.filter(|&l| l != zero_comm::Communicator::size(comm)) {
            return Err(anyhow!(
                "zero.ranks_per_node = {l}, but this build runs one process alone (a node of 1 rank); remove the key or build with MPI"
            ));
        }
        let config = CommConfig::from_env().map_err(|e| anyhow!("{e}"))?;
        zero_comm::LocalComm::world_on_nodes(1, 1, config)
            .map_err(|e| anyhow!("creating the node groups of one rank: {e}"))?
            .pop()
            .map(|(_, groups)| groups)
            .ok_or_else(|| anyhow!("creating the node groups of one rank: none"))
    }

    /// There is no MPI in this build to take device pointers.
    pub fn device_pointers(_comm: &WorldComm) -> anyhow::Result<()> {
        Err(crate::features::missing(
            "mpi",
            "--comm mpi-cuda (CUDA-aware MPI)",
        ))
    }

    /// The launcher's variable that says this process is not alone (a world size above 1
    /// or a rank above 0), as `NAME=value`.
    fn one_of_several() -> Option<String> {
        const SIZES: &[&str] = &["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"];
        const RANKS: &[&str] = &["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"];
        let value = |name: &str| -> Option<(String, u64)> {
            let v = std::env::var(name).ok()?;
            let n = v.trim().parse().ok()?;
            Some((format!("{name}={v}"), n))
        };
        SIZES
            .iter()
            .filter_map(|n| value(n).filter(|(_, size)| *size > 1))
            .chain(
                RANKS
                    .iter()
                    .filter_map(|n| value(n).filter(|(_, rank)| *rank > 0)),
            )
            .map(|(what, _)| what)
            .next()
    }
}
