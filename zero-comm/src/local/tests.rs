use super::*;
use crate::selftest;
use crate::stats::KindStats;
use std::time::{Duration, Instant};

fn cfg() -> CommConfig {
    CommConfig::default()
}

/// Every rank's value, panicking with the rank on a panicked rank.
fn values<T>(results: Vec<std::result::Result<T, RankPanic>>) -> Vec<T> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|p| panic!("{p}")))
        .collect()
}

#[test]
fn local_comm_is_send() {
    fn send<T: Send>() {}
    send::<LocalComm>();
}

#[test]
fn every_collective_small() {
    // Blocking and non-blocking, in place and not, on 3 ranks (small enough for Miri).
    let out = values(run_local(3, cfg(), |c| -> Result<_> {
        let me = c.rank();
        let v = |k: usize| (10 * me + k) as i32;
        let mut ar = [v(0), v(1)];
        c.all_reduce(&mut ar[..], ReduceOp::Sum)?;
        let mut ar_max = [0i32; 2];
        c.all_reduce_into(&[v(0), v(1)][..], &mut ar_max[..], ReduceOp::Max)?;
        let mut rs = [0i32; 2];
        c.reduce_scatter(
            &[v(0), v(1), v(2), v(3), v(4), v(5)][..],
            &mut rs[..],
            ReduceOp::Sum,
        )?;
        let mut ag = [0i32; 3];
        c.all_gather(&[v(7)][..], &mut ag[..])?;
        let mut agi = [0i32; 6];
        agi[2 * me] = v(8);
        agi[2 * me + 1] = v(9);
        c.all_gather_in_place(&mut agi[..])?;
        let mut bc = [v(3); 3];
        c.broadcast(&mut bc[..], 2)?;
        let mut nb = [v(0); 2];
        let mut nb_ag = [0i32; 3];
        let nb_send = [v(5)];
        c.scope(|s| -> Result<()> {
            let a = s.all_reduce(&mut nb[..], ReduceOp::Sum)?;
            let g = s.all_gather(&nb_send[..], &mut nb_ag[..])?;
            let b = s.barrier()?;
            b.wait()?;
            g.wait()?;
            a.wait()?;
            Ok(())
        })?;
        Ok((ar, ar_max, rs, ag, agi, bc, nb, nb_ag))
    }));
    for (r, o) in out.into_iter().enumerate() {
        let (ar, ar_max, rs, ag, agi, bc, nb, nb_ag) = o.unwrap_or_else(|e| panic!("{e}"));
        let r32 = r as i32;
        assert_eq!(ar, [30, 33]);
        assert_eq!(ar_max, [20, 21]);
        assert_eq!(rs, [30 + 6 * r32, 33 + 6 * r32]);
        assert_eq!(ag, [7, 17, 27]);
        assert_eq!(agi, [8, 9, 18, 19, 28, 29]);
        assert_eq!(bc, [23; 3]);
        assert_eq!(nb, [30, 30]);
        assert_eq!(nb_ag, [5, 15, 25]);
    }
}

#[test]
fn world_needs_a_rank() {
    assert!(matches!(
        LocalComm::world(0, cfg()),
        Err(CommError::Size { .. })
    ));
    assert!(run_local(0, cfg(), |_| ()).is_empty());
    let w = LocalComm::world(3, cfg()).expect("3 ranks");
    for (r, c) in w.iter().enumerate() {
        assert_eq!(
            (c.rank(), c.world_rank(), c.size(), c.name()),
            (r, r, 3, "local")
        );
    }
}

#[test]
fn selftest_passes_at_1_to_4_ranks() {
    for n in 1..=4 {
        let out = values(run_local(n, cfg(), |c| {
            let res = selftest::run(&c)?;
            let total = selftest::failures_everywhere(&c, &res)?;
            Ok::<_, CommError>((res, total, c.sequence()))
        }));
        let seq0 = out[0].as_ref().map(|o| o.2).ok();
        for (r, o) in out.into_iter().enumerate() {
            let (res, total, seq) = o.unwrap_or_else(|e| panic!("n={n} rank {r}: {e}"));
            let bad: Vec<_> = res.iter().filter(|c| !c.ok).collect();
            assert!(bad.is_empty(), "n={n} rank {r}: {bad:#?}");
            assert_eq!(total, 0);
            assert!(res.len() > 300, "n={n}: only {} cases", res.len());
            assert_eq!(Some(seq), seq0, "every rank issued the same calls");
        }
    }
}

/// A small LCG: seeded, no dependency.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    /// Non-integer values of mixed sign and magnitude (2^-6 .. 2^6).
    fn f32(&mut self) -> f32 {
        let m = (self.next() % (1 << 24)) as f32 / (1u32 << 24) as f32 - 0.5;
        // 2^-6 .. 2^6, exactly (not `powi`, which Miri perturbs on purpose).
        let scale = (1u32 << (self.next() % 13)) as f32 / 64.0;
        m * scale * 1.37
    }
}

fn inputs_f32(rank: usize, n: usize) -> Vec<f32> {
    let mut g = Lcg(0x5eed + rank as u64 * 7919);
    (0..n).map(|_| g.f32()).collect()
}

fn serial_f32(ranks: usize, n: usize) -> Vec<f32> {
    let xs: Vec<Vec<f32>> = (0..ranks).map(|r| inputs_f32(r, n)).collect();
    (0..n)
        .map(|i| (1..ranks).fold(xs[0][i], |acc, r| acc + xs[r][i]))
        .collect()
}

fn bits32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn bits16(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn reductions_are_rank_order_serial_sums_bitwise() {
    for ranks in [3, 4] {
        // Small under Miri (which checks the cross-thread reads), larger otherwise.
        let (n, block) = if cfg!(miri) { (37, 5) } else { (3001, 257) };
        let want = serial_f32(ranks, n);
        // The check is meaningful: another order gives other bits somewhere.
        let xs: Vec<Vec<f32>> = (0..ranks).map(|r| inputs_f32(r, n)).collect();
        let reversed: Vec<f32> = (0..n)
            .map(|i| {
                (0..ranks - 1)
                    .rev()
                    .fold(xs[ranks - 1][i], |a, r| a + xs[r][i])
            })
            .collect();
        assert_ne!(bits32(&want), bits32(&reversed));
        let want_rs = serial_f32(ranks, block * ranks);

        let out = values(run_local(ranks, cfg(), |c| -> Result<_> {
            let me = c.rank();
            let mut inplace = inputs_f32(me, n);
            c.all_reduce(&mut inplace[..], ReduceOp::Sum)?;
            let send = inputs_f32(me, n);
            let mut into = vec![0f32; n];
            c.all_reduce_into(&send[..], &mut into[..], ReduceOp::Sum)?;
            let rs_send = inputs_f32(me, block * ranks);
            let mut rs = vec![0f32; block];
            c.reduce_scatter(&rs_send[..], &mut rs[..], ReduceOp::Sum)?;
            Ok((inplace, into, rs))
        }));
        for (r, o) in out.into_iter().enumerate() {
            let (inplace, into, rs) = o.unwrap_or_else(|e| panic!("rank {r}: {e}"));
            assert_eq!(bits32(&inplace), bits32(&want), "{ranks} ranks, rank {r}");
            assert_eq!(bits32(&into), bits32(&want), "{ranks} ranks, rank {r}");
            assert_eq!(
                bits32(&rs),
                bits32(&want_rs[r * block..(r + 1) * block]),
                "{ranks} ranks, rank {r}"
            );
        }
    }
}

#[test]
fn half_sums_op_rounds_each_step_upcast_once() {
    for ranks in [3, 4] {
        let (n, block) = if cfg!(miri) { (40, 5) } else { (2000, 100) };
        let half_in = |r: usize, len: usize| -> Vec<bf16> {
            inputs_f32(r, len).into_iter().map(bf16::from_f32).collect()
        };
        let xs: Vec<Vec<bf16>> = (0..ranks).map(|r| half_in(r, n)).collect();
        // Op: ((x0 + x1) rounded + x2) rounded ...; Upcast: f32 sum in rank order, rounded once.
        let want_op: Vec<bf16> = (0..n)
            .map(|i| {
                (1..ranks).fold(xs[0][i], |a, r| {
                    bf16::from_f32(a.to_f32() + xs[r][i].to_f32())
                })
            })
            .collect();
        let want_up: Vec<bf16> = (0..n)
            .map(|i| {
                let s = (1..ranks).fold(xs[0][i].to_f32(), |a, r| a + xs[r][i].to_f32());
                bf16::from_f32(s)
            })
            .collect();
        let diff = (0..n).filter(|&i| want_op[i] != want_up[i]).count();
        assert!(diff > 0, "the two modes must differ on these inputs");

        let out = values(run_local(ranks, cfg(), |c| -> Result<_> {
            let me = c.rank();
            let mut got = Vec::new();
            for mode in [HalfSum::Op, HalfSum::Upcast] {
                c.set_half_sum(mode);
                let mut inplace = half_in(me, n);
                c.all_reduce(&mut inplace[..], ReduceOp::Sum)?;
                let send = half_in(me, n);
                let mut into = vec![bf16::ZERO; n];
                c.all_reduce_into(&send[..], &mut into[..], ReduceOp::Sum)?;
                // Reduce-scatter: the first block * ranks inputs, block `me` of the sum.
                let rs_send = half_in(me, block * ranks);
                let mut rs = vec![bf16::ZERO; block];
                c.reduce_scatter(&rs_send[..], &mut rs[..], ReduceOp::Sum)?;
                got.push((inplace, into, rs));
            }
            Ok(got)
        }));
        let rs_in: Vec<Vec<bf16>> = (0..ranks).map(|r| half_in(r, block * ranks)).collect();
        for (r, o) in out.into_iter().enumerate() {
            let got = o.unwrap_or_else(|e| panic!("rank {r}: {e}"));
            for ((inplace, into, rs), (want, upcast)) in
                got.iter().zip([(&want_op, false), (&want_up, true)])
            {
                assert_eq!(bits16(inplace), bits16(want), "rank {r} upcast={upcast}");
                assert_eq!(bits16(into), bits16(want), "rank {r} upcast={upcast}");
                let want_rs: Vec<bf16> = (r * block..(r + 1) * block)
                    .map(|i| {
                        if upcast {
                            let s = (1..ranks)
                                .fold(rs_in[0][i].to_f32(), |a, q| a + rs_in[q][i].to_f32());
                            bf16::from_f32(s)
                        } else {
                            (1..ranks).fold(rs_in[0][i], |a, q| {
                                bf16::from_f32(a.to_f32() + rs_in[q][i].to_f32())
                            })
                        }
                    })
                    .collect();
                assert_eq!(bits16(rs), bits16(&want_rs), "rank {r} upcast={upcast}");
            }
        }
    }
}

#[test]
fn mismatch_is_reported_on_every_rank_and_the_group_stays_usable() {
    let out = values(run_local(3, cfg(), |c| {
        let me = c.rank();
        let mut x = vec![1.0f32; if me == 1 { 5 } else { 4 }];
        let first = c.all_reduce(&mut x[..], ReduceOp::Sum);
        // A different collective on rank 2 only.
        let second = if me == 2 {
            c.barrier()
        } else {
            c.broadcast(&mut [0f32; 4][..], 0)
        };
        let after = c.all_reduce(&mut [1i32][..], ReduceOp::Sum);
        (first, second, after)
    }));
    for (r, (first, second, after)) in out.into_iter().enumerate() {
        match first {
            Err(CommError::Mismatch {
                rank,
                seq: 0,
                rank_a: 0,
                rank_b: 1,
                ref call_a,
                ref call_b,
                ..
            }) if rank == r => {
                assert_eq!(call_a, "#0 all_reduce(sum) of 4 x f32", "rank {r}");
                assert_eq!(call_b, "#0 all_reduce(sum) of 5 x f32", "rank {r}");
            }
            other => panic!("rank {r}: expected a mismatch naming ranks 0 and 1, got {other:?}"),
        }
        match second {
            Err(
                e @ CommError::Mismatch {
                    rank_a: 0,
                    rank_b: 2,
                    ..
                },
            ) => assert!(e.to_string().contains("rank 2 issued #1 barrier"), "{e}"),
            other => panic!("rank {r}: expected a mismatch naming ranks 0 and 2, got {other:?}"),
        }
        after.unwrap_or_else(|e| panic!("rank {r}: group unusable after a mismatch: {e}"));
    }
}

#[test]
fn mixed_in_place_all_gather_blocks_are_a_mismatch() {
    // Same fingerprint (count 2) but blocks of 2 and 1: caught by the input length.
    let out = values(run_local(2, cfg(), |c| {
        if c.rank() == 0 {
            let mut full = [0u8; 4];
            c.all_gather(&[1u8, 2][..], &mut full[..])
        } else {
            let mut buf = [0u8; 2];
            c.all_gather_in_place(&mut buf[..])
        }
    }));
    for (r, o) in out.into_iter().enumerate() {
        match o {
            Err(e @ CommError::Mismatch { rank_b: 1, .. }) => {
                assert!(e.to_string().contains("1-element input"), "{e}")
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn timeout_names_the_missing_rank() {
    let config = CommConfig {
        timeout: Some(Duration::from_secs(2)),
        ..CommConfig::default()
    };
    // Rank 2 joins only after ranks 0 and 1 have their answer. Ranks 0 and 1 must both
    // enter before the timeout (else the later one finds the group poisoned): 2 s is
    // ample for two threads past one barrier, on a loaded machine too.
    let (started, answered) = (std::sync::Barrier::new(3), std::sync::Barrier::new(3));
    let out = values(run_local(3, config, |c| {
        started.wait(); // every thread is running (not on `c`: its timeout is short)
        let mut full = [0f32; 3];
        if c.rank() == 2 {
            answered.wait();
            return c.all_gather(&[1.0f32][..], &mut full[..]);
        }
        let r = c.all_gather(&[1.0f32][..], &mut full[..]);
        answered.wait();
        r
    }));
    let mut longest = 0f64;
    for (r, o) in out.into_iter().enumerate() {
        match o {
            Err(
                ref e @ CommError::Timeout {
                    rank,
                    seq: 0,
                    op: "all_gather",
                    waited_s,
                    ref missing,
                    ..
                },
            ) if r < 2 => {
                assert_eq!(rank, r);
                assert_eq!(missing, &[2]);
                longest = longest.max(waited_s);
                let msg = e.to_string();
                assert!(
                    msg.contains("all_gather #0 on 'local' timed out after")
                        && msg.contains("waiting for rank 2 (it never arrived)"),
                    "{msg}"
                );
            }
            Err(ref e @ CommError::Poisoned { rank: 2, by, .. }) if r == 2 => {
                assert!(by < 2, "{e}");
                assert!(e.to_string().contains("timed out"), "{e}");
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
    // The rank whose watchdog fired waited the whole timeout (the other may have been
    // told a little earlier).
    assert!(longest >= 2.0, "{longest}");
}

#[test]
fn a_panicking_rank_is_reported_and_its_peers_get_peer_gone() {
    // No timeout is set: without PeerGone the peers would wait forever.
    let out = run_local(3, cfg(), |c| {
        if c.rank() == 1 {
            panic!("boom on purpose");
        }
        let mut x = [1.0f64; 8];
        c.all_reduce(&mut x[..], ReduceOp::Sum)
    });
    assert_eq!(
        out[1].as_ref().err(),
        Some(&RankPanic {
            rank: 1,
            message: "boom on purpose".into()
        })
    );
    for r in [0, 2] {
        match &out[r] {
            Ok(Err(e @ CommError::PeerGone { peer: 1, .. })) => {
                assert!(
                    e.to_string().contains(
                        "all_reduce #0 on 'local': rank 1 left the group (its thread ended or panicked)"
                    ),
                    "{e}"
                );
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
    assert_eq!(
        format!("{}", out[1].as_ref().expect_err("rank 1 panicked")),
        "rank 1 panicked: boom on purpose"
    );
}

#[test]
fn a_rank_that_returns_early_is_gone_for_later_collectives() {
    let out = values(run_local(2, cfg(), |c| {
        c.barrier()?;
        if c.rank() == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
        c.barrier()
    }));
    assert!(out[0].is_ok());
    assert!(
        matches!(
            out[1],
            Err(CommError::PeerGone {
                rank: 1,
                peer: 0,
                seq: 1,
                op: "barrier",
                ..
            })
        ),
        "{:?}",
        out[1]
    );
}

/// An all-reduce on "device" memory (`x` is never accessed: the call is refused).
fn cuda_call(dtype: DType, x: &mut [u64; 2]) -> RawCall {
    RawCall {
        kind: CollectiveKind::AllReduce,
        op: Some(ReduceOp::Sum),
        dtype,
        send: None,
        recv: RawBuf {
            ptr: x.as_mut_ptr() as *mut u8,
            len: 2,
            location: Location::Cuda(0),
        },
        root: 0,
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn device_buffers_are_refused_and_poison_the_group() {
    let w = LocalComm::world(1, cfg()).expect("1 rank");
    // SAFETY: refused before any access.
    let mut x = [0u64; 2];
    let r = unsafe { w[0].execute(&cuda_call(DType::F32, &mut x)) };
    match r {
        Err(CommError::Location {
            rank: 0,
            op: "all_reduce",
            location: Location::Cuda(0),
            backend: "local",
        }) => {}
        other => panic!("{other:?}"),
    }
    // Two ranks: the peer does not wait for a call that will never come.
    let out = values(run_local(2, cfg(), |c| {
        if c.rank() == 0 {
            // SAFETY: refused before any access.
            let mut x = [0u64; 2];
            unsafe { c.execute(&cuda_call(DType::BF16, &mut x)) }
        } else {
            c.all_reduce(&mut [bf16::ONE; 2][..], ReduceOp::Sum)
        }
    }));
    assert!(
        matches!(out[0], Err(CommError::Location { .. })),
        "{:?}",
        out[0]
    );
    match &out[1] {
        Err(e @ CommError::Poisoned { rank: 1, by: 0, .. }) => {
            assert!(
                e.to_string().contains("not supported by the local backend"),
                "{e}"
            )
        }
        other => panic!("{other:?}"),
    }
}

/// With the `cuda` feature but no driver (this project's build machines): a clear error
/// on the rank, the group poisoned, no panic. (Skipped with a driver: `cuda_call`'s
/// "device" buffer is host memory.)
#[cfg(feature = "cuda")]
#[test]
fn device_buffers_without_a_driver_are_a_device_error() {
    if zero_kernels::cuda::CudaDevice::driver_present() {
        return;
    }
    let out = values(run_local(2, cfg(), |c| {
        if c.rank() == 0 {
            // SAFETY: refused before any access (opening the GPU fails).
            let mut x = [0u64; 2];
            unsafe { c.execute(&cuda_call(DType::F32, &mut x)) }
        } else {
            c.all_reduce(&mut [1f32; 2][..], ReduceOp::Sum)
        }
    }));
    match &out[0] {
        Err(
            e @ CommError::Device {
                rank: 0,
                op: "all_reduce",
                ..
            },
        ) => {
            let msg = e.to_string();
            assert!(
                msg.contains("cuda:0") && msg.contains("no CUDA driver"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(out[1], Err(CommError::Poisoned { rank: 1, by: 0, .. })),
        "{:?}",
        out[1]
    );
}

/// Host and device buffers in one call: refused on that rank, naming both places,
/// whatever the build (nothing is touched).
#[test]
fn mixed_host_and_device_buffers_are_refused() {
    let w = LocalComm::world(1, cfg()).expect("1 rank");
    let send = [1f32; 2];
    let mut recv = [0u64; 1];
    let call = RawCall {
        kind: CollectiveKind::AllReduce,
        op: Some(ReduceOp::Sum),
        dtype: DType::F32,
        send: Some(RawBuf {
            ptr: send.as_ptr() as *mut u8,
            len: 2,
            location: Location::Host,
        }),
        recv: RawBuf {
            ptr: recv.as_mut_ptr() as *mut u8,
            len: 2,
            location: Location::Cuda(0),
        },
        root: 0,
    };
    // SAFETY: refused before any access.
    match unsafe { w[0].execute(&call) } {
        Err(
            e @ CommError::MixedLocations {
                rank: 0,
                op: "all_reduce",
                first: Location::Host,
                other: Location::Cuda(0),
                ..
            },
        ) => {
            let msg = e.to_string();
            assert!(msg.contains("Host") && msg.contains("Cuda(0)"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // The group is poisoned, as after any refused call.
    assert!(matches!(
        w[0].barrier(),
        Err(CommError::Poisoned { by: 0, .. })
    ));
}

/// Ranks whose buffers are in different places (host on one, a GPU on another) cannot
/// read each other's: the check reports it on every rank, before any data moves.
#[test]
fn ranks_with_buffers_in_different_places_mismatch() {
    let w = LocalComm::world(2, cfg()).expect("2 ranks");
    let mut x = [0u64; 2];
    let call = cuda_call(DType::F32, &mut x);
    let fp = fingerprint(0, &call, false);
    let slot = |location| Slot {
        fp,
        ptr: std::ptr::null(),
        len: 2,
        location,
    };
    let here = Here {
        rank: 1,
        world_rank: 1,
        comm: "local",
        seq: 0,
        op: "all_reduce",
    };
    let peers = [slot(Location::Host), slot(Location::Cuda(0))];
    match w[1].check(&here, &peers) {
        Err(
            e @ CommError::Mismatch {
                rank_a: 0,
                rank_b: 1,
                ..
            },
        ) => {
            let msg = e.to_string();
            assert!(
                msg.contains("on Host memory") && msg.contains("on Cuda(0) memory"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    let same = [slot(Location::Cuda(0)), slot(Location::Cuda(0))];
    assert!(w[1].check(&here, &same).is_ok());
}

/// Sums with NaNs have defined bits (the lowest rank's NaN, quieted; inf - inf the
/// canonical NaN), whatever order the compiler gives the additions.
#[test]
fn nan_sums_are_defined() {
    let (qa, sb) = (f32::from_bits(0xffc0_1234), f32::from_bits(0x7f80_0001));
    let out = values(run_local(3, cfg(), |c| {
        let mine = [
            [1.0, qa, f32::INFINITY][c.rank()],
            [1.0, sb, qa][c.rank()],
            [1.0, f32::INFINITY, 2.0][c.rank()],
        ];
        let mut x = [mine[0], mine[1], mine[2], -f32::INFINITY];
        if c.rank() == 2 {
            x[3] = f32::INFINITY;
        }
        c.all_reduce(&mut x[..], ReduceOp::Sum)
            .map(|()| x.map(f32::to_bits))
    }));
    for r in out {
        let x = r.expect("all-reduce");
        assert_eq!(x, [0xffc0_1234, 0x7fc0_0001, 0x7f80_0000, 0x7fc0_0000]);
    }
}

/// Timing, run by hand: `cargo test -p zero-comm --release -- --ignored --nocapture perf`.
#[test]
#[ignore]
fn perf_all_reduce_1m_f32_4_ranks() {
    let n = 1 << 20;
    let times = values(run_local(4, cfg(), |c| -> Result<Vec<f64>> {
        let mut x = vec![c.rank() as f32; n];
        let send = x.clone();
        let mut t = Vec::new();
        for _ in 0..5 {
            c.barrier()?;
            let s = Instant::now();
            c.all_reduce(&mut x[..], ReduceOp::Sum)?;
            t.push(s.elapsed().as_secs_f64());
        }
        for _ in 0..5 {
            c.barrier()?;
            let s = Instant::now();
            c.all_reduce_into(&send[..], &mut x[..], ReduceOp::Sum)?;
            t.push(s.elapsed().as_secs_f64());
        }
        Ok(t)
    }));
    for (r, t) in times.into_iter().enumerate() {
        let t = t.unwrap_or_else(|e| panic!("{e}"));
        println!(
            "rank {r}: in place {:?} ms; into {:?} ms",
            t[..5]
                .iter()
                .map(|x| (x * 1e4).round() / 10.0)
                .collect::<Vec<_>>(),
            t[5..]
                .iter()
                .map(|x| (x * 1e4).round() / 10.0)
                .collect::<Vec<_>>()
        );
    }
}

/// Element i of rank r's all-to-all input: distinct small integers, exact in bf16 and u8.
fn a2a_value(r: usize, i: usize) -> i64 {
    ((61 * r + 7 * i + 3) % 251) as i64
}

/// All-to-all on `n` thread ranks against its definition (block q of rank me's output is
/// block me of rank q's input), bit for bit, blocking and non-blocking, with the
/// accounting formula (N-1) B / N per call, B the send buffer's bytes.
fn a2a_case<T: selftest::TestElem>(n: usize, block: usize) {
    let es = std::mem::size_of::<T>() as u64;
    let out = values(run_local(n, cfg(), |c| -> Result<_> {
        let me = c.rank();
        let send: Vec<T> = (0..n * block)
            .map(|i| T::from_small(a2a_value(me, i)))
            .collect();
        let mut blocking = vec![T::default(); n * block];
        c.all_to_all(&send[..], &mut blocking[..])?;
        let mut nonblocking = vec![T::default(); n * block];
        c.scope(|s| -> Result<()> {
            let h = s.all_to_all(&send[..], &mut nonblocking[..])?;
            h.wait()?;
            Ok(())
        })?;
        Ok((
            blocking,
            nonblocking,
            c.stats().get(CollectiveKind::AllToAll),
        ))
    }));
    for (me, o) in out.into_iter().enumerate() {
        let (blocking, nonblocking, stats) =
            o.unwrap_or_else(|e| panic!("n={n} block={block} rank {me}: {e}"));
        let want: Vec<T> = (0..n)
            .flat_map(|q| (0..block).map(move |i| T::from_small(a2a_value(q, me * block + i))))
            .collect();
        assert_eq!(blocking, want, "{} n={n} block={block} rank {me}", T::DTYPE);
        assert_eq!(
            nonblocking,
            want,
            "nonblocking {} n={n} rank {me}",
            T::DTYPE
        );
        let bytes = (n as u64 - 1) * block as u64 * es;
        assert_eq!(
            stats,
            KindStats {
                calls: 2,
                bytes_sent: 2 * bytes,
                bytes_received: 2 * bytes
            },
            "{} n={n} block={block} rank {me}",
            T::DTYPE
        );
    }
}

#[test]
fn all_to_all_matches_its_definition() {
    for n in 1..=4 {
        for block in [0, 1, 3, 17] {
            a2a_case::<f32>(n, block);
            a2a_case::<bf16>(n, block);
            a2a_case::<u8>(n, block);
        }
    }
}

#[test]
fn all_to_all_length_errors_name_the_numbers() {
    let out = values(run_local(2, cfg(), |c| {
        let mut recv = [0f32; 7];
        let odd = c.all_to_all(&[1f32; 7][..], &mut recv[..]);
        let mut short = [0f32; 6];
        let unequal = c.all_to_all(&[1f32; 4][..], &mut short[..]);
        let nb = c.scope(|s| s.all_to_all(&[1f32; 4][..], &mut short[..]).map(|_| ()));
        // The group is still usable: the typed layer refused before any rank arrived.
        let mut ok = [0f32; 4];
        let after = c.all_to_all(&[1f32; 4][..], &mut ok[..]);
        (odd, unequal, nb, after)
    }));
    for (r, (odd, unequal, nb, after)) in out.into_iter().enumerate() {
        let msg = |e: Result<()>| match e {
            Err(e @ CommError::Size { .. }) => e.to_string(),
            other => panic!("rank {r}: {other:?}"),
        };
        assert_eq!(
            msg(odd),
            format!("rank {r}: all_to_all on 'local': buffer of 7 elements is not divisible into 2 equal blocks")
        );
        assert_eq!(
            msg(unequal),
            format!("rank {r}: all_to_all on 'local': send has 4 elements but recv has 6")
        );
        assert!(msg(nb).contains("send has 4 elements but recv has 6"));
        assert!(after.is_ok(), "rank {r}: {after:?}");
    }
}
