//! Scenario: failure behaviour of zero-comm, one mode per run (first argument).
//! - `panic`: the last rank panics while the others wait in an all-reduce; the panic hook
//!   must abort the whole job, naming the rank.
//! - `mismatch` (run with ZERO_COMM_CHECK=1): rank 1 issues a different count, then a
//!   different collective; every rank must get `CommError::Mismatch` naming both ranks.
//! - `hang` (run with ZERO_COMM_TIMEOUT): rank 0 sleeps instead of joining an all-reduce;
//!   the others' watchdogs must print the collective and abort the job.
//! - `hang-nonblocking` (run with ZERO_COMM_TIMEOUT): the same with a non-blocking
//!   all-gather that the others overlap with "compute" 1.5 s longer than the timeout
//!   before waiting; the watchdog must fire only once they wait.
//! - `stopped` (run with ZERO_COMM_TIMEOUT): two all-reduces every rank completes, the
//!   second non-blocking and found done by `test` (never waited on); then the last rank
//!   stops itself and the one before it computes, and the watchdog's report must name both,
//!   the computing one with the second all-reduce as the last it completed.
//! - `hang-staged` (run with ZERO_COMM_TIMEOUT): the same as `hang` for a host-staged
//!   reduce-scatter of device buffers (zero-comm's StagedComm on the simulated GPU): the
//!   watchdog covers the MPI call between the staging copies.
//! - `mpi-error`: an MPI call with an invalid root must come back as `CommError::Mpi`
//!   carrying the rank, not abort inside MPI.
//! - `rank-error` (under `zero_comm::mpi_main`): the last rank's job returns an error
//!   while the others wait in an all-reduce; the job must end at once (MPI_Abort), the
//!   error printed naming the rank, without waiting for the watchdog.
//! - `agreed-error` (under `zero_comm::mpi_main`): every rank returns the same error
//!   after an all-reduce, which `agreed` accepts; every rank prints it and finalizes, and
//!   the job exits 1 without an abort.

use std::time::Duration;
use zero_comm::{
    CollectiveKind, CommError, Communicator, DType, Location, RawBuf, RawCall, ReduceOp,
};

fn main() -> std::process::ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    if let Some(agreed) = match mode.as_str() {
        "rank-error" => Some(false),
        "agreed-error" => Some(true),
        _ => None,
    } {
        return zero_comm::mpi_main(|world| job_error(world, agreed), |_| agreed);
    }
    let (_ctx, world) = match zero_comm::init() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("init failed: {e}");
            std::process::exit(1);
        }
    };
    let (me, n) = (world.rank(), world.size());
    let mut buf = vec![1.0f32; 1000];
    match mode.as_str() {
        "panic" => {
            if me == n - 1 {
                panic!("deliberate panic in comm_failures");
            }
            // Would hang forever without the abort.
            let _ = world.all_reduce(&mut buf[..], ReduceOp::Sum);
        }
        "mismatch" => {
            let count = if me == 1 { 10 } else { 12 };
            let err = world.all_reduce(&mut buf[..count], ReduceOp::Sum);
            expect_mismatch(err, "10 x f32", "12 x f32");
            let err = if me == 1 {
                world.broadcast(&mut buf[..12], 0)
            } else {
                world.all_reduce(&mut buf[..12], ReduceOp::Max)
            };
            expect_mismatch(err, "broadcast", "all_reduce(max)");
            // The communicator is still usable after a caught mismatch.
            world
                .barrier()
                .unwrap_or_else(|e| zero_comm::abort(&e.to_string(), 1));
        }
        "hang" => {
            if me == 0 {
                std::thread::sleep(Duration::from_secs(60));
            }
            let _ = world.all_reduce(&mut buf[..], ReduceOp::Sum);
        }
        "hang-staged" => {
            use zero_kernels::device::{Buffer, Device, SimDevice};
            if me == 0 {
                std::thread::sleep(Duration::from_secs(60));
            }
            let staged = zero_comm::StagedComm::new(&world);
            let dev = SimDevice::gpu_twin(1);
            let run = || -> Result<(), String> {
                staged
                    .buffers()
                    .reserve(&dev, 4 * 1000)
                    .map_err(|e| e.to_string())?;
                let side = dev.stream("comm").map_err(|e| e.to_string())?;
                let full = dev.alloc::<f32>(1000, "grads").map_err(|e| e.to_string())?;
                let mut piece = dev
                    .alloc::<f32>(1000 / n, "piece")
                    .map_err(|e| e.to_string())?;
                zero_comm::on_stream::reduce_scatter(
                    &staged,
                    &dev,
                    &side,
                    full.slice(0..1000 / n * n),
                    piece.view_mut(),
                    ReduceOp::Sum,
                )
                .map_err(|e| e.to_string())
            };
            let _ = run();
        }
        "stopped" => {
            // Two collectives everyone completes, the second one found done by a test
            // (the heartbeat must count it completed all the same); then the last rank
            // stops itself (as `kill -STOP` would) and the one before it computes for a
            // minute: the others wait in all_reduce #2, and the watchdog's report names both.
            world
                .all_reduce(&mut buf[..], ReduceOp::Sum)
                .unwrap_or_else(|e| zero_comm::abort(&e.to_string(), 1));
            world
                .scope(|s| -> zero_comm::Result<()> {
                    let mut h = s.all_reduce(&mut buf[..], ReduceOp::Sum)?;
                    while !h.test()? {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    h.wait()?;
                    Ok(())
                })
                .unwrap_or_else(|e| zero_comm::abort(&e.to_string(), 1));
            if me == n - 1 {
                // SAFETY: raising a signal on this process.
                unsafe { libc::raise(libc::SIGSTOP) };
            }
            if me == n - 2 {
                std::thread::sleep(Duration::from_secs(60));
            }
            let _ = world.all_reduce(&mut buf[..], ReduceOp::Sum);
        }
        "hang-nonblocking" => {
            if me == 0 {
                std::thread::sleep(Duration::from_secs(60));
            }
            // Longer than the timeout: a watchdog that counted it would fire during it.
            let compute = watchdog_timeout() + Duration::from_millis(1500);
            let _ = world.scope(|s| -> zero_comm::Result<()> {
                let h = s.all_gather_in_place(&mut buf[..999 / n * n])?;
                // Computing with a request outstanding is not a hang: only waiting is.
                std::thread::sleep(compute);
                zero_comm::line_to_stderr(&format!("rank {me}: now waiting"));
                h.wait()?;
                Ok(())
            });
        }
        "mpi-error" => {
            let call = RawCall {
                kind: CollectiveKind::Broadcast,
                op: None,
                dtype: DType::F32,
                send: None,
                recv: RawBuf {
                    ptr: buf.as_mut_ptr() as *mut u8,
                    len: buf.len(),
                    location: Location::Host,
                },
                root: 99 + n,
            };
            // SAFETY: `buf` is valid for the call; the root is what is wrong.
            match unsafe { world.execute(&call) } {
                Err(e @ CommError::Mpi { rank, .. }) if rank == me => {
                    zero_comm::line_to_stderr(&format!("caught: {e}"))
                }
                other => zero_comm::abort(&format!("expected an MPI error, got {other:?}"), 1),
            }
            world
                .barrier()
                .unwrap_or_else(|e| zero_comm::abort(&e.to_string(), 1));
        }
        _ => zero_comm::abort(&format!("unknown mode '{mode}'"), 2),
    }
    println!("{}", zero_tests::ok_line(me));
    std::process::ExitCode::SUCCESS
}

/// The watchdog's timeout this job runs under (ZERO_COMM_TIMEOUT, whole seconds).
fn watchdog_timeout() -> Duration {
    let secs = std::env::var("ZERO_COMM_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| zero_comm::abort("this mode needs ZERO_COMM_TIMEOUT=<seconds>", 2));
    Duration::from_secs(secs)
}

/// The job of `rank-error` (`agreed`: false) and `agreed-error` (true).
fn job_error(world: &zero_comm::MpiComm, agreed: bool) -> Result<(), String> {
    let (me, n) = (world.rank(), world.size());
    let mut buf = vec![1.0f32; 1000];
    if agreed {
        world
            .all_reduce(&mut buf[..], ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        return Err(format!("deliberate error on every rank (sum {})", buf[0]));
    }
    if me == n - 1 {
        return Err("deliberate error on the last rank".into());
    }
    // Would wait for the watchdog (30 minutes) if the job were not aborted.
    world
        .all_reduce(&mut buf[..], ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn expect_mismatch(r: zero_comm::Result<()>, a: &str, b: &str) {
    match r {
        Err(
            e @ CommError::Mismatch {
                rank_a: 0,
                rank_b: 1,
                ..
            },
        ) => {
            let msg = e.to_string();
            if !(msg.contains("rank 0 issued")
                && msg.contains("rank 1 issued")
                && msg.contains(a)
                && msg.contains(b))
            {
                zero_comm::abort(&format!("mismatch message lacks detail: {msg}"), 1);
            }
            zero_comm::line_to_stderr(&format!("caught: {msg}"));
        }
        other => zero_comm::abort(&format!("expected a mismatch, got {other:?}"), 1),
    }
}
