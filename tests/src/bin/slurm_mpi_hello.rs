//! Slurm scenario: MPI started by `srun --mpi=pmix` across the two emulated nodes of
//! scripts/slurm-cluster, checking that MPI's view of the job agrees with Slurm's.
//!
//! Rank, size, local rank and local size come from MPI (world communicator and its
//! MPI_COMM_TYPE_SHARED split), as zero-rs takes them. The Slurm node name
//! (`SLURMD_NODENAME`), `SLURM_NTASKS` and `SLURM_PROCID` are read only to check them:
//! the ranks MPI groups on one node must be exactly the ranks Slurm placed on that node,
//! in world-rank order. Each rank prints one
//! `rank=.. size=.. node=.. local_rank=.. local_size=..` line for the test to read, then
//! `OK rank=<r>` as its last act when every check passed. Command-line arguments are
//! ignored, so the binary can stand in for zero-bench when a test exercises an sbatch
//! script's launch plumbing.

use mpi::traits::*;

/// Fixed width of a node name on the wire (all-gather needs equal counts).
const NAME_BYTES: usize = 64;

/// What MPI and Slurm say about one rank, gathered across the job.
struct View<'a> {
    /// World rank and size (MPI).
    rank: i32,
    size: i32,
    /// Rank and size in the MPI_COMM_TYPE_SHARED communicator (MPI).
    local_rank: i32,
    local_size: i32,
    /// World ranks in this rank's shared communicator, in local-rank order (MPI).
    local_members: &'a [i32],
    /// This rank's node name and every rank's, NAME_BYTES each, zero-padded (Slurm).
    node: &'a str,
    names: &'a [u8],
    /// SLURM_NTASKS and SLURM_PROCID, when set.
    slurm_ntasks: Option<i64>,
    slurm_procid: Option<i64>,
}

fn main() {
    let Some(universe) = mpi::initialize() else {
        eprintln!("slurm_mpi_hello: MPI was already initialised");
        std::process::exit(2);
    };
    let world = universe.world();
    let rank = world.rank();
    let size = world.size();

    // A missing or over-long name is reported after the collectives (it gathers as
    // empty), so that no rank leaves the others blocked in one.
    let node = std::env::var("SLURMD_NODENAME").unwrap_or_default();
    let mut my_name = [0u8; NAME_BYTES];
    if node.len() <= NAME_BYTES {
        my_name[..node.len()].copy_from_slice(node.as_bytes());
    }
    let mut names = vec![0u8; NAME_BYTES * size as usize];
    world.all_gather_into(&my_name[..], &mut names[..]);

    // Key = world rank, so local ranks follow world-rank order on each node.
    let local = world.split_shared(rank);
    let local_rank = local.rank();
    let local_size = local.size();
    let mut local_members = vec![0i32; local_size as usize];
    local.all_gather_into(&rank, &mut local_members[..]);

    let view = View {
        rank,
        size,
        local_rank,
        local_size,
        local_members: &local_members,
        node: &node,
        names: &names,
        slurm_ntasks: env_number("SLURM_NTASKS"),
        slurm_procid: env_number("SLURM_PROCID"),
    };
    let errors = check(&view);
    println!("rank={rank} size={size} node={node} local_rank={local_rank} local_size={local_size}");
    if errors.is_empty() {
        println!("{}", zero_tests::ok_line(rank as usize));
    } else {
        for e in &errors {
            eprintln!("rank {rank}: {e}");
        }
        drop(universe);
        std::process::exit(1);
    }
}

/// Every disagreement between MPI's view and Slurm's, as messages with the numbers.
fn check(v: &View) -> Vec<String> {
    let mut errors = Vec::new();
    if v.node.is_empty() {
        errors.push("SLURMD_NODENAME is not set: run this under srun".to_string());
        return errors;
    }
    if v.node.len() > NAME_BYTES {
        errors.push(format!(
            "node name '{}' is {} bytes, over {NAME_BYTES}",
            v.node,
            v.node.len()
        ));
        return errors;
    }
    // The world ranks Slurm put on this rank's node, ascending.
    let same_node: Vec<i32> = v
        .names
        .chunks_exact(NAME_BYTES)
        .enumerate()
        .filter(|(_, n)| n.split(|&b| b == 0).next() == Some(v.node.as_bytes()))
        .map(|(r, _)| r as i32)
        .collect();
    if v.local_members != same_node.as_slice() {
        errors.push(format!(
            "shared-memory communicator holds world ranks {:?}, but Slurm placed ranks \
             {same_node:?} on node {}",
            v.local_members, v.node
        ));
    }
    let expected_local = same_node.iter().position(|&r| r == v.rank);
    if expected_local != Some(v.local_rank as usize) || same_node.len() != v.local_size as usize {
        errors.push(format!(
            "local rank {} of {}, but world rank {} is number {expected_local:?} of {} on \
             node {}",
            v.local_rank,
            v.local_size,
            v.rank,
            same_node.len(),
            v.node
        ));
    }
    if let Some(ntasks) = v.slurm_ntasks {
        if ntasks != i64::from(v.size) {
            errors.push(format!(
                "MPI world size {} but SLURM_NTASKS={ntasks}",
                v.size
            ));
        }
    }
    if let Some(procid) = v.slurm_procid {
        if procid != i64::from(v.rank) {
            errors.push(format!(
                "MPI world rank {} but SLURM_PROCID={procid}",
                v.rank
            ));
        }
    }
    errors
}

fn env_number(key: &str) -> Option<i64> {
    std::env::var(key).ok().and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node names of a 4-rank job, two ranks per node, as the all-gather lays them out.
    fn names(nodes: &[&str]) -> Vec<u8> {
        let mut out = vec![0u8; NAME_BYTES * nodes.len()];
        for (r, n) in nodes.iter().enumerate() {
            out[r * NAME_BYTES..r * NAME_BYTES + n.len()].copy_from_slice(n.as_bytes());
        }
        out
    }

    fn view<'a>(rank: i32, local_rank: i32, members: &'a [i32], names: &'a [u8]) -> View<'a> {
        View {
            rank,
            size: 4,
            local_rank,
            local_size: members.len() as i32,
            local_members: members,
            node: "n2",
            names,
            slurm_ntasks: Some(4),
            slurm_procid: Some(i64::from(rank)),
        }
    }

    #[test]
    fn consistent_layout_passes() {
        let all = names(&["n1", "n1", "n2", "n2"]);
        assert_eq!(check(&view(3, 1, &[2, 3], &all)), Vec::<String>::new());
    }

    #[test]
    fn shared_communicator_spanning_both_nodes_is_caught() {
        // What happens when MPI sees one host where Slurm placed two nodes.
        let all = names(&["n1", "n1", "n2", "n2"]);
        let errors = check(&view(3, 3, &[0, 1, 2, 3], &all));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("[0, 1, 2, 3]"), "{errors:?}");
    }

    #[test]
    fn node_names_sharing_a_prefix_are_distinct() {
        // "n1" must not match "n10" (names are zero-padded, compared whole).
        let all = names(&["n1", "n10", "n1", "n10"]);
        let mut v = view(2, 1, &[0, 2], &all);
        v.node = "n1";
        assert_eq!(check(&v), Vec::<String>::new());
    }

    #[test]
    fn slurm_and_mpi_rank_disagreeing_is_caught() {
        let all = names(&["n1", "n1", "n2", "n2"]);
        let mut v = view(3, 1, &[2, 3], &all);
        v.slurm_procid = Some(0);
        assert_eq!(
            check(&v),
            vec!["MPI world rank 3 but SLURM_PROCID=0".to_string()]
        );
    }

    #[test]
    fn missing_node_name_is_reported() {
        let all = names(&["", "", "", ""]);
        let mut v = view(0, 0, &[0, 1, 2, 3], &all);
        v.node = "";
        assert!(check(&v)[0].contains("SLURMD_NODENAME is not set"));
    }
}
