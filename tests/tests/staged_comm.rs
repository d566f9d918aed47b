//! Host-staged collectives (zero-comm's `StagedComm`, issue 14) on thread ranks and the
//! simulated GPU, whose every copy is hazard-checked like a kernel:
//!
//! - each stream-ordered collective gives what the direct path gives, counts the same
//!   network bytes, and counts its copies apart;
//! - a collective larger than the staging buffers is a typed error, not an allocation;
//! - the engine trains every stage, fp32 and bf16, through staging with the losses of the
//!   direct path bit for bit (2 ranks), and the same comm ledger;
//! - `micro overlap` runs every mode under mpirun with its sums checked.
//!
//! The same backend under real mpirun: train_cli.rs
//! (`host_staged_mpi_on_the_simulated_gpu_trains_every_stage_like_direct_mpi`).

use zero_comm::{on_stream, run_local, CommError, Communicator, ReduceOp, StagedComm};
use zero_kernels::device::{Buffer, Device, SimDevice};
use zero_tests::scenario::{corpus, train_losses_sim_gpu, transport_cases};

/// Every collective on `comm` (staged or not) on a simulated GPU: the outputs.
/// `staging`: bytes the staging (if `comm` has one) is reserved for, on this device.
fn collectives<C: Communicator>(
    comm: &C,
    seed: u64,
    staging: usize,
) -> Result<Vec<Vec<f32>>, CommError> {
    let dev = SimDevice::gpu_twin(seed);
    if let Some(st) = comm.staging() {
        st.reserve(&dev, staging).expect("staging allocated");
    }
    let n = comm.size();
    let r = comm.rank() as f32;
    let (compute, side) = (dev.stream("compute").unwrap(), dev.stream("comm").unwrap());
    let mut full = dev.alloc::<f32>(4 * n, "full").unwrap();
    let mut block = dev.alloc::<f32>(4, "block").unwrap();
    let mut gathered = dev.alloc::<f32>(4 * n, "gathered").unwrap();
    let input: Vec<f32> = (0..4 * n).map(|i| i as f32 + 10.0 * r).collect();
    dev.upload(&compute, &input, full.view_mut()).unwrap();
    // The comm stream waits for what compute wrote, as the engine does.
    let ready = dev.record(&compute).unwrap();
    dev.wait_event(&side, &ready).unwrap();
    let mut out = Vec::new();
    let mut read = |dev: &SimDevice, b: &<SimDevice as Device>::Buf<f32>| {
        let mut v = vec![0.0; b.len()];
        dev.download(&side, b.view(), &mut v).unwrap();
        out.push(v);
    };
    on_stream::reduce_scatter(
        comm,
        &dev,
        &side,
        full.view(),
        block.view_mut(),
        ReduceOp::Sum,
    )?;
    read(&dev, &block);
    on_stream::all_gather(comm, &dev, &side, block.view(), gathered.view_mut())?;
    read(&dev, &gathered);
    on_stream::all_reduce(comm, &dev, &side, full.view_mut(), ReduceOp::Max)?;
    read(&dev, &full);
    on_stream::all_gather_in_place(comm, &dev, &side, full.view_mut())?;
    read(&dev, &full);
    on_stream::broadcast(comm, &dev, &side, gathered.view_mut(), 1)?;
    read(&dev, &gathered);
    Ok(out)
}

#[test]
fn every_staged_collective_gives_the_direct_result_and_the_same_ledger() {
    let direct = run_local(2, Default::default(), |comm| {
        let out = collectives(&comm, 3 + comm.rank() as u64, 0);
        (out.map_err(|e| e.to_string()), comm.stats())
    });
    let staged = run_local(2, Default::default(), |comm| {
        let staged = StagedComm::new(&comm);
        let out = collectives(&staged, 3 + comm.rank() as u64, 4 * 2 * 4);
        let copies = staged.buffers().stats();
        (
            out.map_err(|e| e.to_string()),
            comm.stats(),
            copies,
            staged.buffers().held_bytes(),
        )
    });
    for (rank, (d, s)) in direct.into_iter().zip(staged).enumerate() {
        let (d_out, d_stats) = d.expect("direct rank ran");
        let (s_out, s_stats, copies, held) = s.expect("staged rank ran");
        let (d_out, s_out) = (d_out.unwrap(), s_out.unwrap());
        assert_eq!(d_out, s_out, "rank {rank}: staged vs direct");
        assert_eq!(d_stats, s_stats, "rank {rank}: network bytes");
        // 2 slots x (send + receive) of 32 bytes.
        assert_eq!(held, 4 * 32);
        assert_eq!(copies.calls, 5);
        // Down: full (32 B), block (16), full (32), own block (16), root's buffer (32 on
        // rank 1 only). Up: block 16, gathered 32, full 32, full 32, gathered 32.
        let root = if rank == 1 { 32 } else { 0 };
        assert_eq!(copies.to_host, 32 + 16 + 32 + 16 + root, "rank {rank}");
        assert_eq!(copies.to_device, 16 + 32 + 32 + 32 + 32, "rank {rank}");
    }
}

#[test]
fn a_collective_larger_than_the_staging_is_a_typed_error() {
    let out = run_local(2, Default::default(), |comm| {
        let staged = StagedComm::new(&comm);
        collectives(&staged, 1, 16).map(|_| ())
    });
    for r in out {
        match r.expect("rank ran") {
            Err(
                e @ CommError::Staging {
                    need: 32, have: 16, ..
                },
            ) => {
                assert!(e.to_string().contains("reserve"), "{e}");
            }
            other => panic!("expected a staging error, got {other:?}"),
        }
    }
}

#[test]
fn the_engine_trains_every_stage_through_staging_like_the_direct_path_on_thread_ranks() {
    let tokens = corpus().unwrap();
    let mut compared = 0;
    for (name, cfg) in transport_cases() {
        let direct = run_local(2, Default::default(), |comm| {
            let losses = train_losses_sim_gpu(&comm, &cfg, &tokens, 11 + comm.rank() as u64);
            (losses, comm.stats())
        });
        let staged = run_local(2, Default::default(), |comm| {
            let staged = StagedComm::new(&comm);
            let losses = train_losses_sim_gpu(&staged, &cfg, &tokens, 11 + comm.rank() as u64);
            (losses, comm.stats(), staged.buffers().stats().calls)
        });
        for (rank, (d, s)) in direct.into_iter().zip(staged).enumerate() {
            let (d_losses, d_stats) = d.expect("direct rank ran");
            let (s_losses, s_stats, calls) = s.expect("staged rank ran");
            let (d_losses, s_losses) = (d_losses.unwrap(), s_losses.unwrap());
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&d_losses),
                bits(&s_losses),
                "{name} rank {rank}: direct {d_losses:?} vs staged {s_losses:?}"
            );
            assert_eq!(d_stats, s_stats, "{name} rank {rank}: the comm ledger");
            assert!(calls > 0, "{name}: nothing went through staging");
        }
        compared += 1;
    }
    assert_eq!(compared, 8);
}

/// `micro overlap` (the staged path's overlap on the CPU) under real mpirun, small: every
/// mode runs, its sums are checked (a wrong sum exits non-zero), and the JSON has a
/// hidden fraction in [0, 1] per mode.
#[test]
fn micro_overlap_runs_every_mode_under_mpirun() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("micro-overlap");
    // Empty: an earlier run's report must not stand in for this one's.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("overlap.json");
    let out = zero_tests::MpiJob::new(2, zero_tests::zero_bench_bin())
        .args([
            "micro",
            "overlap",
            "--layers",
            "3",
            "--bucket",
            "64KiB",
            "--compute-ms",
            "2",
            "--reps",
            "1",
            "--json",
            json.to_str().unwrap(),
        ])
        .timeout(std::time::Duration::from_secs(120))
        .run();
    assert_eq!(out.code, Some(0), "{}", out.transcript());
    for mode in ["serial", "nonblocking", "thread", "thread-poll"] {
        assert!(out.stdout.contains(mode), "{mode}\n{}", out.transcript());
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for mode in ["serial", "nonblocking", "thread", "thread_poll"] {
        let h = v["hidden"][mode].as_f64().expect("a fraction");
        assert!((0.0..=1.0).contains(&h), "{mode}: {h}");
    }
}

/// `micro comm --device sim-gpu` (device buffers through host staging, issue 14) under
/// real mpirun: every collective at every size runs through `on_stream` and the table
/// has a row each, the raw column being MPI on host buffers; a backend the simulated GPU
/// cannot run is refused with a reason and exit 1.
#[test]
fn micro_comm_runs_device_buffers_through_staging_under_mpirun() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("micro-comm-device");
    // Empty: an earlier run's report must not stand in for this one's.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("comm.json");
    let out = zero_tests::MpiJob::new(2, zero_tests::zero_bench_bin())
        .args([
            "micro",
            "comm",
            "--device",
            "sim-gpu",
            "--comm",
            "mpi-staged",
            "--dtype",
            "bf16",
            "--min-size",
            "4KiB",
            "--max-size",
            "16KiB",
            "--iters",
            "2",
            "--min-pairs",
            "2",
            "--json",
            json.to_str().unwrap(),
        ])
        .timeout(std::time::Duration::from_secs(120))
        .run();
    assert_eq!(out.code, Some(0), "{}", out.transcript());
    assert!(
        out.stdout.contains("raw = MPI on host buffers"),
        "{}",
        out.transcript()
    );
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // 4, 8, 16 KiB x three collectives.
    assert_eq!(rows.len(), 9, "{rows:?}");
    for r in &rows {
        assert_eq!(r["dtype"], "bf16");
        assert!(r["ours_us"].as_f64().unwrap() > 0.0, "{r}");
    }

    let out = zero_tests::MpiJob::new(2, zero_tests::zero_bench_bin())
        .args(["micro", "comm", "--device", "sim-gpu", "--comm", "nccl"])
        .timeout(std::time::Duration::from_secs(60))
        .run();
    assert_eq!(out.code, Some(1), "{}", out.transcript());
    assert!(
        out.stderr
            .contains("the simulated GPU runs mpi-staged only"),
        "{}",
        out.transcript()
    );
}

#[test]
fn a_slot_last_used_through_another_device_is_an_error_not_a_race() {
    let out = run_local(1, Default::default(), |comm| {
        let staged = StagedComm::new(&comm);
        let (a, b) = (SimDevice::gpu_twin(1), SimDevice::gpu_twin(2));
        staged.buffers().reserve(&a, 16).expect("staging allocated");
        let on = |dev: &SimDevice| -> Result<(), CommError> {
            let s = dev.stream("comm").expect("a stream");
            let mut buf = dev.alloc::<f32>(4, "buf").expect("a buffer");
            on_stream::all_reduce(&staged, dev, &s, buf.view_mut(), ReduceOp::Sum)
        };
        // Slots 0 and 1 through `a`; slot 0 again through `b`, whose waits cannot see
        // `a`'s queue.
        (on(&a), on(&a), on(&b))
    });
    let (first, second, third) = out.into_iter().next().expect("one rank").expect("rank ran");
    assert!(first.is_ok() && second.is_ok(), "{first:?} {second:?}");
    let e = third.expect_err("another device's slot");
    assert!(e.to_string().contains("another device"), "{e}");
}

#[test]
fn a_slot_whose_collective_failed_part_way_is_not_reused_blindly() {
    let out = run_local(1, Default::default(), |comm| {
        let staged = StagedComm::new(&comm);
        let dev = SimDevice::gpu_twin(3);
        staged
            .buffers()
            .reserve(&dev, 16)
            .expect("staging allocated");
        let (compute, side) = (dev.stream("compute").unwrap(), dev.stream("comm").unwrap());
        let mut buf = dev.alloc::<f32>(4, "buf").unwrap();
        // Compute writes the buffer and comm's collective reads it with no event between:
        // the staging download is refused (a hazard) after the slot was leased.
        dev.fill(&compute, buf.view_mut(), 1.0).unwrap();
        let first = on_stream::all_reduce(&staged, &dev, &side, buf.view_mut(), ReduceOp::Sum);
        let mut other = dev.alloc::<f32>(4, "other").unwrap();
        let second = on_stream::all_reduce(&staged, &dev, &side, other.view_mut(), ReduceOp::Sum);
        // Slot 0 again: its last use never settled.
        let third = on_stream::all_reduce(&staged, &dev, &side, other.view_mut(), ReduceOp::Sum);
        (first, second, third)
    });
    let (first, _, third) = out.into_iter().next().expect("one rank").expect("rank ran");
    let e = first.expect_err("the hazard");
    assert!(e.to_string().contains("hazard"), "{e}");
    let e = third.expect_err("the unsettled slot");
    assert!(e.to_string().contains("after an earlier failure"), "{e}");
}
