//! The NCCL unique id handed over real MPI with a stand-in id (scenario `nccl_id`):
//! every rank gets rank 0's bytes; a failure on rank 0 reaches every rank as an error.

use std::time::Duration;
use zero_tests::MpiJob;

fn job(ranks: usize, mode: &str) -> zero_tests::JobOutput {
    MpiJob::new(ranks, env!("CARGO_BIN_EXE_nccl_id"))
        .args([mode])
        .timeout(Duration::from_secs(30))
        .run()
}

#[test]
fn every_rank_gets_rank_0s_id_over_mpi() {
    let out = job(3, "ok");
    out.assert_all_ok();
    let ids: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_once(" id ").map(|(_, id)| id))
        .collect();
    assert_eq!(ids.len(), 3, "{}", out.transcript());
    assert_eq!(ids[0].len(), 256);
    assert!(ids.iter().all(|id| *id == ids[0]), "{}", out.transcript());
}

#[test]
fn rank_0_failing_to_make_the_id_is_an_error_everywhere() {
    let out = job(2, "fail");
    out.assert_all_ok();
    assert!(
        out.stdout
            .contains("rank 0 error rank 0: the NCCL unique id: stand-in: libnccl.so.2 not found"),
        "{}",
        out.transcript()
    );
    assert!(
        out.stdout
            .contains("rank 1 error rank 1: the NCCL unique id: rank 0 could not make it"),
        "{}",
        out.transcript()
    );
}
