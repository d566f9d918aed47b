//! The world `train` and `ckpt bench` run in, whichever way this binary was built:
//!
//! - with feature `mpi` (default): MPI's world, one process per rank under mpirun or
//!   srun (a singleton world of 1 when started directly);
//! - without it (the carried GPU build, which must not need libmpi): the processes of
//!   the launch joined over TCP when `ZERO_RENDEZVOUS` says where rank 0 is
//!   (zero-comm's `SocketComm`), else one process alone. Started by a launcher as one of
//!   several ranks without `ZERO_RENDEZVOUS`, it stops and says what to set instead of
//!   training N unrelated copies.
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

/// Whether this process was started by an MPI launcher, or is told to join a TCP world
/// (`ZERO_RENDEZVOUS`): either way it is one rank of a world it must form.
pub fn under_launcher() -> bool {
    LAUNCHER_VARS
        .iter()
        .chain([&zero_comm::socket::RENDEZVOUS_VAR])
        .any(|v| std::env::var_os(v).is_some())
}

pub use backend::{
    device_pointers, host_transport, init, node_groups, node_rank, ranks_on_this_node, WorldComm,
};

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

    /// Bring MPI up (a singleton world of 1 when not launched by mpirun/srun). A
    /// singleton told by `ZERO_RENDEZVOUS` that it is one of several stops: this build
    /// joins ranks through MPI only, and would otherwise train alone.
    pub fn init(command: &str) -> anyhow::Result<World> {
        // (An Init error's own text begins "MPI initialisation failed": not said twice.)
        let (ctx, comm) = zero_comm::init().map_err(|e| match e {
            zero_comm::CommError::Init(why) => anyhow!("cannot initialise MPI: {why}"),
            e => anyhow!("cannot initialise MPI: {e}"),
        })?;
        if let Ok(Some(rv)) = zero_comm::socket::Rendezvous::from_env() {
            if comm.size() == 1 && rv.size > 1 {
                return Err(anyhow!(
                    "{} is set for a world of {} ranks, but this zero-bench joins ranks through MPI and MPI started it alone: launch `{command}` with mpirun or srun --mpi=pmix (and unset {0}), or run the build without MPI (scripts/carry-check.sh) for the TCP world",
                    zero_comm::socket::RENDEZVOUS_VAR,
                    rv.size
                ));
            }
            if comm.rank() == 0 {
                log::warn!(
                    "{} is ignored: this zero-bench joins its {} ranks through MPI",
                    zero_comm::socket::RENDEZVOUS_VAR,
                    comm.size()
                );
            }
        }
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

    /// What carries `backend`'s host collectives, when it is not what its name says
    /// (nothing to add here: MPI's are MPI).
    pub fn host_transport(_comm: &WorldComm, _backend: zero_comm::Backend) -> Option<String> {
        None
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
    use zero_comm::socket::{Address, Rendezvous, DEFAULT_RENDEZVOUS_TIMEOUT, RENDEZVOUS_VAR};
    use zero_comm::{CommConfig, Communicator, SocketComm};

    /// The world communicator: the processes of the launch joined by TCP
    /// (`ZERO_RENDEZVOUS`), or this process alone.
    pub type WorldComm = SocketComm;

    /// The world of this process.
    pub struct World {
        /// The world communicator.
        pub comm: WorldComm,
    }

    /// The TCP world `ZERO_RENDEZVOUS` describes, else a world of one; started by a
    /// launcher as one of several ranks without `ZERO_RENDEZVOUS`, it stops and says what
    /// to set instead of training N unrelated copies (`command` names what was run).
    pub fn init(command: &str) -> anyhow::Result<World> {
        let config = CommConfig::from_env().map_err(|e| match e {
            // (Its text says MPI: this build has none.)
            zero_comm::CommError::Init(why) => anyhow!("{why}"),
            e => anyhow!("{e}"),
        })?;
        let rv = Rendezvous::from_env().map_err(|e| anyhow!("{e}"))?;
        let rv = match rv {
            Some(rv) => rv,
            None => {
                if let Some(why) = one_of_several() {
                    return Err(anyhow!(
                        "`{command}` was started as one of several ranks ({why}), and this build has no MPI to join them: set {RENDEZVOUS_VAR}=file:PATH (a path every rank sees, e.g. {RENDEZVOUS_VAR}=file:$PWD/.zero-rendezvous) to join them over TCP, or build zero-bench with MPI (the default features)"
                    ));
                }
                alone()
            }
        };
        if rv.size > 1 {
            log::info!(
                "rank {}: joining a TCP world of {} at {} (this build has no MPI)",
                rv.rank,
                rv.size,
                rv.address
            );
        }
        let comm = SocketComm::connect(&rv, &config).map_err(|e| anyhow!("{e}"))?;
        Ok(World { comm })
    }

    /// The ranks of this job on this node (collective).
    pub fn ranks_on_this_node(comm: &WorldComm) -> anyhow::Result<usize> {
        Ok(node_rank(comm)?.1)
    }

    /// (this rank's rank among the ranks on its host, how many there are), from every
    /// rank's host name (collective).
    pub fn node_rank(comm: &WorldComm) -> anyhow::Result<(usize, usize)> {
        comm.host_local()
            .map_err(|e| anyhow!("finding the ranks on this node: {e}"))
    }

    /// The node and cross-node groups of the TCP world (collective): nodes of
    /// `ranks_per_node` consecutive ranks, or (`None`) the ranks that share a host name.
    pub fn node_groups(
        comm: &WorldComm,
        ranks_per_node: Option<usize>,
    ) -> anyhow::Result<zero_comm::NodeGroups<WorldComm>> {
        comm.node_groups(ranks_per_node)
            .map_err(|e| anyhow!("finding the nodes of the world: {e}"))
    }

    /// A world of this process alone.
    fn alone() -> Rendezvous {
        Rendezvous {
            rank: 0,
            size: 1,
            address: Address::File(std::path::PathBuf::new()),
            token: String::new(),
            timeout: DEFAULT_RENDEZVOUS_TIMEOUT,
        }
    }

    /// What carries `backend`'s host collectives, when it is not what its name says:
    /// this build has no MPI, so `mpi` and `mpi-staged` run over the TCP world.
    pub fn host_transport(comm: &WorldComm, backend: zero_comm::Backend) -> Option<String> {
        use zero_comm::Backend;
        (comm.size() > 1 && matches!(backend, Backend::Mpi | Backend::MpiStaged)).then(|| {
            format!(
                "this build has no MPI: the host collectives go over the TCP world of {} ranks ({}), a star through rank 0",
                comm.size(),
                zero_comm::socket::RENDEZVOUS_VAR
            )
        })
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
        // srun sets the SLURM_ ones with or without PMI (`--mpi=none`).
        const SIZES: &[&str] = &[
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
            "MPI_LOCALNRANKS",
            "SLURM_STEP_NUM_TASKS",
        ];
        const RANKS: &[&str] = &[
            "OMPI_COMM_WORLD_RANK",
            "PMIX_RANK",
            "PMI_RANK",
            "SLURM_PROCID",
        ];
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
