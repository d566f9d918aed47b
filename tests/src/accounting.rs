//! The communicators' accounting against the ring formulas of zero-comm's `stats.rs`,
//! written out here independently of zero-comm, for any backend: the MPI scenario
//! (`comm_collectives`) and the thread ranks (tests/tests/local_comm.rs) run the same
//! check. A failed check panics with the kind, the rank and both numbers.

use half::bf16;
use zero_comm::{CollectiveKind, CommStats, Communicator, HalfSum, KindStats, ReduceOp};

/// Accounting against the ring formulas, written out here independently of zero-comm.
pub fn check_accounting<C: Communicator>(comm: &C) -> zero_comm::Result<()> {
    let (n, me) = (comm.size() as u64, comm.rank());
    comm.reset_stats();
    assert_eq!(comm.stats(), CommStats::default());
    let mut a = vec![1.0f32; 1000];
    comm.all_reduce(&mut a[..], ReduceOp::Sum)?; // 4000 bytes
    let mut b = vec![bf16::ONE; 12 * n as usize];
    comm.set_half_sum(HalfSum::Upcast);
    comm.all_reduce(&mut b[..], ReduceOp::Sum)?; // wire: f32, 48n bytes
    comm.set_half_sum(HalfSum::Op);
    comm.all_reduce(&mut b[..], ReduceOp::Sum)?; // wire: bf16, 24n bytes
    let send = vec![1i64; 6 * n as usize];
    let mut recv = [0i64; 6];
    comm.reduce_scatter(&send[..], &mut recv[..], ReduceOp::Max)?; // input 48n bytes
    let mut full = vec![0u8; 10 * n as usize];
    comm.all_gather(&vec![1u8; 10][..], &mut full[..])?; // output 10n bytes
    let mut bc = [0f64; 5];
    let root = comm.size() - 1;
    comm.broadcast(&mut bc[..], root)?; // 40 bytes
    comm.barrier()?;
    comm.barrier()?;
    let s = comm.stats();
    let ar = 2 * (n - 1) * 4000 / n + 2 * (n - 1) * (48 * n) / n + 2 * (n - 1) * (24 * n) / n;
    let expect = |kind, calls, sent, received| {
        assert_eq!(
            s.get(kind),
            KindStats {
                calls,
                bytes_sent: sent,
                bytes_received: received
            },
            "{kind} on rank {me} of {n}"
        );
    };
    expect(CollectiveKind::AllReduce, 3, ar, ar);
    expect(CollectiveKind::ReduceScatter, 1, (n - 1) * 48, (n - 1) * 48);
    expect(CollectiveKind::AllGather, 1, (n - 1) * 10, (n - 1) * 10);
    // Chain root -> root+1 -> ... : the root receives nothing, the last rank sends nothing.
    let last = (root + comm.size() - 1) % comm.size();
    let (bs, br) = if n == 1 {
        (0, 0)
    } else {
        ((me != last) as u64 * 40, (me != root) as u64 * 40)
    };
    expect(CollectiveKind::Broadcast, 1, bs, br);
    expect(CollectiveKind::Barrier, 2, 0, 0);
    // Per-step diff of snapshots.
    let before = comm.stats();
    comm.all_reduce(&mut a[..], ReduceOp::Max)?;
    // Non-blocking calls are counted too.
    comm.scope(|sc| -> zero_comm::Result<()> {
        sc.all_reduce(&mut a[..], ReduceOp::Max)?.wait()?;
        Ok(())
    })?;
    let step = comm.stats() - before;
    assert_eq!(step.total().calls, 2);
    assert_eq!(
        step.get(CollectiveKind::AllReduce).bytes_sent,
        2 * 2 * (n - 1) * 4000 / n
    );
    Ok(())
}
