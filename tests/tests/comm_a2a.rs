//! All-to-all and node groups under real mpirun (scenario binary `comm_a2a`): the
//! all-to-all at 2, 3 and 4 ranks (1 rank in the self-test of comm_collectives.rs, which
//! covers every dtype on the world, node-local and split communicators); node groups of
//! 4 ranks given 2 per node, found (one host: one node of 4), refused for 3 per node, and
//! found from Slurm's node ids (block: 2 x 2; round-robin and 3 + 1: refused on every
//! rank, nobody hanging); and the stream-ordered all-to-all, direct and host-staged, on
//! thread ranks and the simulated GPU.

use std::time::Duration;
use zero_comm::{
    on_stream, run_local, CollectiveKind, CommError, Communicator, KindStats, StagedComm,
};
use zero_kernels::device::{Buffer, Device, SimDevice};
use zero_tests::MpiJob;

fn job(ranks: usize, args: &[&str]) -> zero_tests::JobOutput {
    MpiJob::new(ranks, env!("CARGO_BIN_EXE_comm_a2a"))
        .args(args.iter().copied())
        .timeout(Duration::from_secs(120))
        .run()
}

#[test]
fn all_to_all_2_ranks() {
    job(2, &["a2a"]).assert_all_ok();
}

#[test]
fn all_to_all_3_ranks() {
    job(3, &["a2a"]).assert_all_ok();
}

#[test]
fn all_to_all_4_ranks() {
    job(4, &["a2a"]).assert_all_ok();
}

/// With the consistency check and watchdog on, the fingerprints of all-to-all agree.
#[test]
fn all_to_all_3_ranks_with_check_and_watchdog() {
    MpiJob::new(3, env!("CARGO_BIN_EXE_comm_a2a"))
        .args(["a2a"])
        .env("ZERO_COMM_CHECK", "1")
        .env("ZERO_COMM_TIMEOUT", "60")
        .timeout(Duration::from_secs(120))
        .run()
        .assert_all_ok();
}

#[test]
fn node_groups_of_4_ranks_2_per_node() {
    job(4, &["nodes", "2", "2"]).assert_all_ok();
}

#[test]
fn node_groups_of_4_ranks_found_on_one_host() {
    job(4, &["nodes", "none", "4"]).assert_all_ok();
}

#[test]
fn node_groups_refuse_3_per_node_of_4_on_every_rank() {
    let out = job(4, &["nodes-bad", "3"]);
    out.assert_all_ok();
    assert!(
        out.stdout.contains("give a positive divisor of 4"),
        "{}",
        out.transcript()
    );
}

#[test]
fn node_groups_from_slurm_node_ids() {
    job(4, &["slurm", "block"]).assert_all_ok();
    let out = job(4, &["slurm", "cyclic"]);
    out.assert_all_ok();
    assert!(
        out.stdout.contains("srun --distribution=block"),
        "{}",
        out.transcript()
    );
    job(4, &["slurm", "uneven"]).assert_all_ok();
    // Slurm variables of a step that did not start these ranks (mpirun's daemons inside
    // an allocation) are not taken for their nodes.
    job(4, &["slurm", "foreign"]).assert_all_ok();
}

/// `on_stream::all_to_all` on the simulated GPU (its copies hazard-checked like kernels):
/// this rank's output, 3 elements per block.
fn a2a_on_sim_gpu<C: Communicator>(comm: &C, seed: u64) -> Result<Vec<f32>, CommError> {
    let dev = SimDevice::gpu_twin(seed);
    if let Some(st) = comm.staging() {
        st.reserve(&dev, 3 * comm.size() * 4)
            .expect("staging allocated");
    }
    let (n, me) = (comm.size(), comm.rank());
    let side = dev.stream("comm").expect("a stream");
    let input: Vec<f32> = (0..3 * n).map(|i| (100 * me + i) as f32).collect();
    let mut send = dev.alloc::<f32>(3 * n, "send").expect("alloc");
    let mut recv = dev.alloc::<f32>(3 * n, "recv").expect("alloc");
    dev.upload(&side, &input, send.view_mut()).expect("upload");
    on_stream::all_to_all(comm, &dev, &side, send.view(), recv.view_mut())?;
    let mut out = vec![0.0; 3 * n];
    dev.download(&side, recv.view(), &mut out)
        .expect("download");
    Ok(out)
}

/// Direct (thread ranks reach the simulated GPU's memory) and host-staged
/// (`StagedComm`): both give the definition, the same network bytes, and staging copies
/// the whole send buffer down and the whole receive buffer up.
#[test]
fn all_to_all_on_a_stream_direct_and_host_staged() {
    for n in [2, 3] {
        let direct = run_local(n, Default::default(), |comm| {
            let out = a2a_on_sim_gpu(&comm, 7 + comm.rank() as u64);
            (out.map_err(|e| e.to_string()), comm.stats())
        });
        let staged = run_local(n, Default::default(), |comm| {
            let staged = StagedComm::new(&comm);
            let out = a2a_on_sim_gpu(&staged, 7 + comm.rank() as u64);
            (
                out.map_err(|e| e.to_string()),
                comm.stats(),
                staged.buffers().stats(),
            )
        });
        for (me, (d, s)) in direct.into_iter().zip(staged).enumerate() {
            let (d_out, d_stats) = d.expect("direct rank ran");
            let (s_out, s_stats, copies) = s.expect("staged rank ran");
            let want: Vec<f32> = (0..n)
                .flat_map(|q| (0..3).map(move |i| (100 * q + 3 * me + i) as f32))
                .collect();
            assert_eq!(d_out, Ok(want.clone()), "direct, {n} ranks, rank {me}");
            assert_eq!(s_out, Ok(want), "staged, {n} ranks, rank {me}");
            assert_eq!(d_stats, s_stats, "network bytes, rank {me}");
            let bytes = (n as u64 - 1) * 3 * 4;
            assert_eq!(
                d_stats.get(CollectiveKind::AllToAll),
                KindStats {
                    calls: 1,
                    bytes_sent: bytes,
                    bytes_received: bytes
                }
            );
            let whole = (3 * n * 4) as u64;
            assert_eq!(
                (copies.calls, copies.to_host, copies.to_device),
                (1, whole, whole)
            );
        }
    }
}
