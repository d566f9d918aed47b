//! Scenario: what the ZeRO++ engine needs of zero-comm beyond the classic collectives,
//! under real mpirun (tests/tests/comm_a2a.rs launches it):
//!
//! - `a2a`: all-to-all on f32, bf16 and u8 against its definition, bit for bit (no
//!   arithmetic), blocking and non-blocking (outstanding beside other collectives), the
//!   accounting formula exactly, and length errors that name the numbers;
//! - `nodes L|none EXPECTED_L`: `MpiComm::node_groups` with L ranks per node given, or
//!   found (one host: shared memory sees one node), expecting EXPECTED_L: sizes and ranks
//!   of `node` and `cross`, and an all-gather over `node` then `cross` equal to the
//!   world's;
//! - `nodes-bad L`: L ranks per node that do not divide the world: the same error on
//!   every rank, and the world still usable afterwards (nobody hung in a split);
//! - `slurm LAYOUT`: each rank poses as a task of a Slurm step (`SLURM_STEP_ID`, its own
//!   `SLURM_NODEID` set from Open MPI's rank variable before MPI starts, so no thread
//!   reads the environment meanwhile): `block` (2 ranks a node) must give 2 x 2 groups,
//!   `cyclic` (round-robin) and `uneven` (3 + 1) the errors that say so, on every rank.
//!
//! Prints `OK rank=r` when every check passed; an error or failed assertion fails the job.

use half::bf16;
use zero_comm::selftest::TestElem;
use zero_comm::{CollectiveKind, CommError, Communicator, KindStats, MpiComm, ReduceOp};

/// Element i of rank r's all-to-all input: distinct small integers, exact in every type.
fn value(r: usize, i: usize) -> i64 {
    ((61 * r + 7 * i + 3) % 251) as i64
}

fn a2a_typed<T: TestElem>(comm: &MpiComm) -> zero_comm::Result<()> {
    let (n, me) = (comm.size(), comm.rank());
    let es = std::mem::size_of::<T>() as u64;
    for block in [0, 1, 5, 129] {
        let send: Vec<T> = (0..n * block)
            .map(|i| T::from_small(value(me, i)))
            .collect();
        let want: Vec<T> = (0..n)
            .flat_map(|q| (0..block).map(move |i| T::from_small(value(q, me * block + i))))
            .collect();
        comm.reset_stats();
        let mut blocking = vec![T::default(); n * block];
        comm.all_to_all(&send[..], &mut blocking[..])?;
        assert_eq!(blocking, want, "{} block={block} rank {me}", T::DTYPE);
        // Non-blocking, outstanding together with an all-reduce, waited in reverse order.
        let mut nonblocking = vec![T::default(); n * block];
        let mut sum = [1i64; 3];
        comm.scope(|s| -> zero_comm::Result<()> {
            let a = s.all_to_all(&send[..], &mut nonblocking[..])?;
            let r = s.all_reduce(&mut sum[..], ReduceOp::Sum)?;
            s.progress()?;
            r.wait()?;
            a.wait()?;
            Ok(())
        })?;
        assert_eq!(nonblocking, want, "non-blocking {} block={block}", T::DTYPE);
        assert_eq!(sum, [n as i64; 3]);
        // B = the send buffer's bytes; each call sends and receives (N-1) B / N.
        let bytes = (n as u64 - 1) * (n * block) as u64 * es / n as u64;
        assert_eq!(
            comm.stats().get(CollectiveKind::AllToAll),
            KindStats {
                calls: 2,
                bytes_sent: 2 * bytes,
                bytes_received: 2 * bytes
            },
            "{} block={block} rank {me} of {n}",
            T::DTYPE
        );
    }
    Ok(())
}

fn a2a(comm: &MpiComm) -> zero_comm::Result<()> {
    a2a_typed::<f32>(comm)?;
    a2a_typed::<bf16>(comm)?;
    a2a_typed::<u8>(comm)?;
    // Length errors, on every rank alike (refused before MPI is called: nobody waits).
    let (n, me) = (comm.size(), comm.rank());
    let mut recv = vec![0f32; 2 * n + 1];
    let e = comm
        .all_to_all(&vec![0f32; 2 * n + 1][..], &mut recv[..])
        .err();
    if n > 1 {
        let msg = e.map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            msg,
            format!(
                "rank {me}: all_to_all on 'world': buffer of {} elements is not divisible into {n} equal blocks",
                2 * n + 1
            )
        );
    }
    let mut short = vec![0u8; n];
    let e = comm.all_to_all(&vec![0u8; 2 * n][..], &mut short[..]);
    assert!(
        matches!(
            &e,
            Err(CommError::Size {
                op: "all_to_all",
                ..
            })
        ),
        "{e:?}"
    );
    let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        msg.contains(&format!("send has {} elements but recv has {n}", 2 * n)),
        "{msg}"
    );
    let long = vec![0u8; 2 * n];
    let e = comm.scope(|s| s.all_to_all(&long[..], &mut short[..]).map(|_| ()));
    assert!(matches!(e, Err(CommError::Size { .. })), "{e:?}");
    comm.barrier()
}

/// Node groups with L ranks per node: sizes, ranks, and the two-level all-gather.
fn check_groups(world: &MpiComm, arg: Option<usize>, l: usize) -> zero_comm::Result<()> {
    let (n, r) = (world.size(), world.rank());
    let g = world.node_groups(arg)?;
    assert_eq!((g.ranks_per_node(), g.nodes()), (l, n / l), "rank {r}");
    assert_eq!(
        (g.node.rank(), g.node.size()),
        (r % l, l),
        "node of rank {r}"
    );
    assert_eq!(
        (g.cross.rank(), g.cross.size()),
        (r / l, n / l),
        "cross of rank {r}"
    );
    let names = (format!("node[{}]", r / l), format!("cross[{}]", r % l));
    assert_eq!((g.node.name(), g.cross.name()), (&*names.0, &*names.1));
    assert_eq!(g.node.world_rank(), r);
    let mine: Vec<f32> = (0..5).map(|i| (100 * r + i) as f32).collect();
    let mut flat = vec![0f32; 5 * n];
    world.all_gather(&mine[..], &mut flat[..])?;
    let mut on_node = vec![0f32; 5 * l];
    g.node.all_gather(&mine[..], &mut on_node[..])?;
    let mut two_level = vec![0f32; 5 * n];
    g.cross.all_gather(&on_node[..], &mut two_level[..])?;
    assert_eq!(two_level, flat, "node-then-cross all-gather on rank {r}");
    // Members: the node's world ranks, and the cross group's.
    let mut node_ranks = vec![0u32; l];
    g.node.all_gather(&[r as u32][..], &mut node_ranks[..])?;
    let want: Vec<u32> = (0..l).map(|j| ((r / l) * l + j) as u32).collect();
    assert_eq!(node_ranks, want);
    let mut cross_ranks = vec![0u32; n / l];
    g.cross.all_gather(&[r as u32][..], &mut cross_ranks[..])?;
    let want: Vec<u32> = (0..n / l).map(|m| (m * l + r % l) as u32).collect();
    assert_eq!(cross_ranks, want);
    Ok(())
}

/// `node_groups` fails on every rank with a message containing `expect`; the world is
/// still usable afterwards.
fn check_refused(world: &MpiComm, arg: Option<usize>, expect: &str) -> zero_comm::Result<()> {
    match world.node_groups(arg) {
        Err(e @ CommError::Nodes { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(expect), "rank {}: {msg}", world.rank());
            if world.rank() == 0 {
                println!("refused: {msg}");
            }
        }
        Err(e) => panic!("rank {}: wrong error {e}", world.rank()),
        Ok(_) => panic!("rank {}: node groups should be refused", world.rank()),
    }
    world.barrier()
}

fn usage() -> ! {
    eprintln!(
        "usage: comm_a2a a2a | nodes L|none EXPECTED_L | nodes-bad L | slurm block|cyclic|uneven|foreign"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or_else(|| usage());
    let num = |i: usize| arg(i).parse::<usize>().unwrap_or_else(|_| usage());
    if arg(0) == "slurm" {
        // Before MPI starts (no other thread): pose as task r of a Slurm step.
        let r: usize = std::env::var("OMPI_COMM_WORLD_RANK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| usage());
        let node = match arg(1) {
            "block" | "foreign" => r / 2,
            "cyclic" => r % 2,
            "uneven" => usize::from(r >= 3),
            _ => usage(),
        };
        let mut size = std::env::var("OMPI_COMM_WORLD_SIZE").unwrap_or_else(|_| usage());
        if arg(1) == "foreign" {
            // mpirun inside an allocation: its daemons' step, one task, not these ranks.
            size = "1".into();
        }
        std::env::set_var("SLURM_STEP_ID", "0");
        std::env::set_var("SLURM_NODEID", node.to_string());
        std::env::set_var("SLURM_PROCID", r.to_string());
        std::env::set_var("SLURM_STEP_NUM_TASKS", size);
    }
    let (_ctx, world) = match zero_comm::init() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("init failed: {e}");
            std::process::exit(1);
        }
    };
    let run = || -> zero_comm::Result<()> {
        match arg(0) {
            "a2a" => a2a(&world),
            "nodes" => {
                let given = match arg(1) {
                    "none" => None,
                    _ => Some(num(1)),
                };
                check_groups(&world, given, num(2))
            }
            "nodes-bad" => {
                let l = num(1);
                let expect = format!(
                    "{l} ranks per node does not divide the {} ranks into equal nodes",
                    world.size()
                );
                check_refused(&world, Some(l), &expect)
            }
            "slurm" => match arg(1) {
                "block" => check_groups(&world, None, 2),
                // The step's ids say nothing about these ranks: shared memory, one node.
                "foreign" => check_groups(&world, None, world.size()),
                "cyclic" => check_refused(
                    &world,
                    None,
                    "rank 1 is on node 1 but rank 2 on node 0: ranks are not node-major",
                ),
                _ => check_refused(&world, None, "node sizes 3, 1"),
            },
            _ => usage(),
        }
    };
    if let Err(e) = run() {
        zero_comm::abort(&format!("{e}"), 1);
    }
    println!("{}", zero_tests::ok_line(world.rank()));
}
