//! Scenario: every collective x every dtype against serial answers on the world, on the
//! node-local communicator and on a split (zero_comm::selftest), plus exact accounting,
//! half sums of non-integer values in both modes, and non-blocking collectives overlapped
//! with compute. Any rank count; prints `OK rank=r` when all checks passed.

use half::bf16;
use zero_comm::selftest;
use zero_comm::{Communicator, HalfSum, MpiComm, ReduceOp};

fn check_selftest(comm: &MpiComm) -> zero_comm::Result<()> {
    let results = selftest::run(comm)?;
    for r in results.iter().filter(|r| !r.ok) {
        zero_comm::line_to_stderr(&format!(
            "rank {}: FAIL {} on {}: {}",
            comm.world_rank(),
            r.name,
            comm.name(),
            r.detail
        ));
    }
    let failed = selftest::failures_everywhere(comm, &results)?;
    assert!(results.len() > 300, "only {} cases ran", results.len());
    assert_eq!(
        failed,
        0,
        "{failed} self-test cases failed on {}",
        comm.name()
    );
    Ok(())
}

/// bf16 sums of values that are not small integers. Upcast: the f32 sum of <= 4 bf16
/// values in [1, 2) is exact (each has 8 significant bits, the sum < 8 needs <= 11), so
/// one rounding gives exactly bf16(exact sum). Op: every pairwise step rounds, so after
/// N-1 steps the error is at most (N-1) half-ulps of a value < 8, i.e. (N-1) * 2^-6.
fn check_half_rounding(comm: &MpiComm) -> zero_comm::Result<()> {
    let n = 257;
    let val = |r: usize, i: usize| bf16::from_f32(1.0 + ((r * 37 + i * 11) % 128) as f32 / 128.0);
    let exact: Vec<f32> = (0..n)
        .map(|i| (0..comm.size()).map(|r| val(r, i).to_f32()).sum())
        .collect();
    let mine: Vec<bf16> = (0..n).map(|i| val(comm.rank(), i)).collect();
    for mode in [HalfSum::Upcast, HalfSum::Op] {
        comm.set_half_sum(mode);
        let mut buf = mine.clone();
        comm.all_reduce(&mut buf[..], ReduceOp::Sum)?;
        for i in 0..n {
            let got = buf[i].to_f32();
            match mode {
                HalfSum::Upcast => {
                    assert_eq!(buf[i], bf16::from_f32(exact[i]), "upcast element {i}")
                }
                HalfSum::Op => {
                    let tol = (comm.size() as f32 - 1.0) * 2f32.powi(-6) + 1e-6;
                    assert!(
                        (got - exact[i]).abs() <= tol,
                        "op element {i}: {got} vs {}",
                        exact[i]
                    );
                }
            }
        }
    }
    comm.set_half_sum(HalfSum::Op);
    Ok(())
}

/// Non-blocking collectives outstanding while this rank computes, with progress calls.
fn check_overlap(comm: &MpiComm) -> zero_comm::Result<()> {
    let size = comm.size();
    let len = 1 << 16;
    let grads: Vec<f32> = (0..len * size).map(|i| (i % 5) as f32).collect();
    let mut shard = vec![0f32; len];
    let mut work = vec![1.0f64; 1 << 15];
    let mut checksum = 0.0;
    comm.scope(|s| -> zero_comm::Result<()> {
        let mut h = s.reduce_scatter(&grads[..], &mut shard[..], ReduceOp::Sum)?;
        // "Backward of the next unit": compute while the reduce-scatter is in flight.
        for round in 0..20 {
            for w in work.iter_mut() {
                *w = (*w * 1.000001 + round as f64).sqrt();
            }
            checksum += work[0];
            h.test()?;
        }
        // The buffer comes back from wait; the borrow ends with the scope.
        let back = h.wait()?;
        assert_eq!(back.len(), len);
        Ok(())
    })?;
    assert!(checksum.is_finite());
    let me = comm.rank();
    for (i, v) in shard.iter().enumerate() {
        let want = (((me * len + i) % 5) * size) as f32;
        assert_eq!(*v, want, "overlapped reduce_scatter element {i}");
    }
    Ok(())
}

fn main() {
    let (_ctx, world) = match zero_comm::init() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("init failed: {e}");
            std::process::exit(1);
        }
    };
    let run = || -> zero_comm::Result<()> {
        check_selftest(&world)?;
        let node = world.node_local()?;
        // One host: the node-local communicator is the whole world.
        assert_eq!((node.size(), node.rank()), (world.size(), world.rank()));
        check_selftest(&node)?;
        // Split: even and odd ranks; ranks ordered by descending key.
        let color = (world.rank() % 2) as u32;
        let sub = world
            .split(Some(color), -(world.rank() as i32))?
            .expect("every rank passed a colour");
        let members: Vec<usize> = (0..world.size())
            .filter(|r| r % 2 == color as usize)
            .collect();
        assert_eq!(sub.size(), members.len());
        assert_eq!(
            sub.rank(),
            members.len() - 1 - members.iter().position(|&r| r == world.rank()).unwrap_or(0)
        );
        check_selftest(&sub)?;
        // Opting out of a split.
        let none = world.split(if world.rank() == 0 { None } else { Some(0) }, 0)?;
        assert_eq!(none.is_none(), world.rank() == 0);
        zero_tests::accounting::check_accounting(&world)?;
        check_half_rounding(&world)?;
        check_overlap(&world)?;
        world.barrier()
    };
    if let Err(e) = run() {
        zero_comm::abort(&format!("{e}"), 1);
    }
    println!("{}", zero_tests::ok_line(world.rank()));
}
