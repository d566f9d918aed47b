//! The device layer: HostDevice and SimDevice compute the same bits; SimDevice finds
//! every kind of missing ordering (and none where the order is right), runs only what is
//! asked for, in seeded interleavings; ops refuse bad views with errors.

use super::*;
use crate::adamw::{AdamWHyper, AdamWSegment};
use half::bf16;

/// A small program over two streams, correctly ordered: upload, cast down and up,
/// accumulate, a matmul, a layer norm, AdamW, grad stats. Returns every result.
fn program<D: Device>(dev: &D) -> Result<Vec<Vec<f64>>> {
    let (compute, comm) = (dev.stream("compute")?, dev.stream("comm")?);
    let n = 48;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173)
        .collect();
    let mut a = dev.alloc::<f32>(n, "a")?;
    let mut h = dev.alloc::<bf16>(n, "h")?;
    let mut acc = dev.alloc::<f32>(n, "acc")?;
    dev.upload(&compute, &x, a.view_mut())?;
    dev.cast(&compute, a.view(), h.view_mut())?;
    let cast_done = dev.record(&compute)?;
    dev.wait_event(&comm, &cast_done)?;
    dev.cast(&comm, h.view(), acc.view_mut())?;
    dev.accumulate(&comm, acc.view_mut(), h.view())?;
    let acc_done = dev.record(&comm)?;
    // matmul: C [6x6] = acc [6x8] x a [6x8]^T
    let mut c = dev.alloc::<f32>(36, "c")?;
    dev.wait_event(&compute, &acc_done)?;
    let l = |r, k| MatLayout::rm(r, k, k);
    let mm = MatMul {
        alpha: 1.0f32,
        beta: 0.0,
        a: l(6, 8),
        b: l(6, 8).t(),
        c: l(6, 6),
    };
    dev.matmul(&compute, mm, acc.view(), a.view(), c.view_mut())?;
    // layer norm over rows of 6
    let (mut out, mut mean, mut rstd) = (
        dev.alloc::<f32>(36, "ln out")?,
        dev.alloc::<f32>(6, "ln mean")?,
        dev.alloc::<f32>(6, "ln rstd")?,
    );
    let mut wb = dev.alloc::<f32>(12, "ln w|b")?;
    let w: Vec<f32> = (0..12).map(|i| 1.0 + i as f32 * 0.01).collect();
    dev.upload(&compute, &w, wb.view_mut())?;
    dev.layernorm_forward(
        &compute,
        LayerNormOut {
            out: out.view_mut(),
            mean: mean.view_mut(),
            rstd: rstd.view_mut(),
        },
        c.view(),
        wb.slice(0..6),
        wb.slice(6..12),
        6,
    )?;
    // AdamW on `acc` as the master, `out` as the gradient, writing a bf16 copy into h.
    let (mut m, mut v) = (dev.alloc::<f32>(n, "m")?, dev.alloc::<f32>(n, "v")?);
    let groups = [AdamWHyper::default()];
    let segments = [AdamWSegment {
        range: 0..n,
        group: 0,
        decay: true,
    }];
    let step = AdamWStep {
        groups: &groups,
        segments: &segments,
        t: 1,
        grad_scale: 0.5,
    };
    dev.wait_event(&compute, &dev.record(&comm)?)?;
    dev.adamw(
        &compute,
        &step,
        a.view(),
        AdamWViews {
            master: acc.view_mut(),
            m: m.view_mut(),
            v: v.view_mut(),
        },
        Some(h.view_mut()),
    )?;
    let mut stats = dev.alloc::<f64>(2, "stats")?;
    dev.grad_stats(&compute, out.view(), 2.0, stats.view_mut())?;
    let mut results = Vec::new();
    let get32 = |b: &D::Buf<f32>| -> Result<Vec<f64>> {
        let mut o = vec![0.0f32; b.len()];
        dev.download(&compute, b.view(), &mut o)?;
        Ok(o.into_iter().map(f64::from).collect())
    };
    for b in [&a, &acc, &c, &out, &mean, &rstd, &m, &v] {
        results.push(get32(b)?);
    }
    let mut hb = vec![bf16::ZERO; n];
    dev.download(&compute, h.view(), &mut hb)?;
    results.push(hb.iter().map(|x| x.to_f64()).collect());
    let mut s = [0.0f64; 2];
    dev.download(&compute, stats.view(), &mut s)?;
    results.push(s.to_vec());
    Ok(results)
}

#[test]
fn sim_and_host_compute_the_same_bits_for_any_seed() {
    let want = program(&HostDevice::new()).unwrap();
    for seed in 0..16 {
        let sim = SimDevice::new(seed);
        let got = program(&sim).unwrap();
        for (g, w) in got.iter().zip(&want) {
            let gb: Vec<u64> = g.iter().map(|x| x.to_bits()).collect();
            let wb: Vec<u64> = w.iter().map(|x| x.to_bits()).collect();
            assert_eq!(gb, wb, "seed {seed}");
        }
        assert!(sim.ops_run() >= 9, "{} ops ran", sim.ops_run());
        assert_eq!(sim.ops_pending(), 0);
    }
}

/// Producer on one stream, consumer on another.
fn produce_consume<D: Device>(dev: &D, wait: bool) -> Result<()> {
    let (s1, s2) = (dev.stream("compute")?, dev.stream("comm")?);
    let mut a = dev.alloc::<f32>(8, "bucket")?;
    let mut b = dev.alloc::<f32>(8, "piece")?;
    dev.fill(&s1, a.view_mut(), 1.0)?;
    if wait {
        let e = dev.record(&s1)?;
        dev.wait_event(&s2, &e)?;
    }
    dev.copy(&s2, a.view(), b.view_mut())
}

#[test]
fn a_missing_wait_is_a_hazard_naming_buffer_ops_and_streams() {
    produce_consume(&HostDevice::new(), false).unwrap(); // eager: hidden
    produce_consume(&SimDevice::new(1), true).unwrap();
    let err = produce_consume(&SimDevice::new(1), false)
        .unwrap_err()
        .to_string();
    for part in [
        "read-after-write",
        "'bucket'",
        "'copy'",
        "'fill'",
        "stream 'comm'",
        "stream 'compute'",
        "wait for it",
    ] {
        assert!(err.contains(part), "{part} missing from: {err}");
    }
}

#[test]
fn write_after_read_and_write_after_write_are_hazards_too() {
    // WAR: comm reads `a` (ordered after compute's fill), then compute overwrites it
    // without waiting for comm's read.
    let war = |wait: bool| -> Result<()> {
        let dev = SimDevice::new(3);
        let (s1, s2) = (dev.stream("compute")?, dev.stream("comm")?);
        let mut a = dev.alloc::<f32>(8, "a")?;
        let mut b = dev.alloc::<f32>(8, "b")?;
        dev.fill(&s1, a.view_mut(), 1.0)?;
        dev.wait_event(&s2, &dev.record(&s1)?)?;
        dev.copy(&s2, a.view(), b.view_mut())?;
        if wait {
            dev.wait_event(&s1, &dev.record(&s2)?)?;
        }
        dev.fill(&s1, a.view_mut(), 2.0)
    };
    war(true).unwrap();
    assert!(war(false)
        .unwrap_err()
        .to_string()
        .contains("write-after-read"));
    // WAW on disjoint ranges is fine; on overlapping ranges it is not.
    let dev = SimDevice::new(4);
    let (s1, s2) = (dev.stream("x").unwrap(), dev.stream("y").unwrap());
    let mut a = dev.alloc::<f32>(8, "a").unwrap();
    dev.fill(&s1, a.slice_mut(0..4), 1.0).unwrap();
    dev.fill(&s2, a.slice_mut(4..8), 2.0).unwrap();
    let e = dev.fill(&s2, a.slice_mut(3..5), 3.0).unwrap_err();
    assert!(e.to_string().contains("write-after-write"), "{e}");
}

#[test]
fn the_host_must_wait_before_it_reads() {
    let dev = SimDevice::new(5);
    let (s1, s2) = (dev.stream("compute").unwrap(), dev.stream("comm").unwrap());
    let mut a = dev.alloc::<f32>(4, "loss").unwrap();
    dev.fill(&s1, a.view_mut(), 1.0).unwrap();
    let mut out = [0.0f32; 4];
    // Downloading on s2 is ordered after s2's work only.
    let e = dev.download(&s2, a.view(), &mut out).unwrap_err();
    assert!(e.to_string().contains("'loss'"), "{e}");
    // Once the host synced with s1's work, any stream's download may read it.
    let dev = SimDevice::new(5);
    let (s1, s2) = (dev.stream("compute").unwrap(), dev.stream("comm").unwrap());
    let mut a = dev.alloc::<f32>(4, "loss").unwrap();
    dev.fill(&s1, a.view_mut(), 1.0).unwrap();
    dev.sync_event(&dev.record(&s1).unwrap()).unwrap();
    dev.download(&s2, a.view(), &mut out).unwrap();
    assert_eq!(out, [1.0; 4]);
}

#[test]
fn host_tasks_are_ordered_on_their_stream_only() {
    // A host task on comm after comm waited for compute sees compute's writes, and the
    // host learns nothing: compute must still wait for comm before reusing the buffer.
    let run = |wait_back: bool| -> Result<Vec<f32>> {
        let dev = SimDevice::new(9);
        let (compute, comm) = (dev.stream("compute")?, dev.stream("comm")?);
        let mut a = dev.alloc::<f32>(3, "bucket")?;
        dev.upload(&compute, &[1.0, 2.0, 3.0], a.view_mut())?;
        dev.wait_event(&comm, &dev.record(&compute)?)?;
        let ptr = a.raw_ptr();
        let seen = dev.host_task(&comm, "reduce_scatter", &[a.view().access()], &[], || {
            // SAFETY: the task runs after the upload (ordered on comm) and nothing else runs.
            unsafe { std::slice::from_raw_parts(ptr, 3).to_vec() }
        })?;
        if wait_back {
            dev.wait_event(&compute, &dev.record(&comm)?)?;
        }
        dev.fill(&compute, a.view_mut(), 0.0)?;
        Ok(seen)
    };
    assert_eq!(run(true).unwrap(), [1.0, 2.0, 3.0]);
    let e = run(false).unwrap_err().to_string();
    assert!(
        e.contains("write-after-read") && e.contains("'reduce_scatter'"),
        "{e}"
    );
}

#[test]
fn ops_run_lazily_only_as_far_as_needed_and_in_seeded_interleavings() {
    let mut orders = std::collections::BTreeSet::new();
    for seed in 0..32 {
        let dev = SimDevice::new(seed);
        let (a, b, c) = (
            dev.stream("a").unwrap(),
            dev.stream("b").unwrap(),
            dev.stream("c").unwrap(),
        );
        let mut x = dev.alloc::<f32>(1, "x").unwrap();
        let mut y = dev.alloc::<f32>(1, "y").unwrap();
        let mut z = dev.alloc::<f32>(2, "z").unwrap();
        dev.fill(&a, x.view_mut(), 1.0).unwrap();
        dev.fill(&b, y.view_mut(), 2.0).unwrap();
        assert_eq!(dev.ops_pending(), 2, "nothing runs before it is needed");
        // Waiting for a runs a's op only: b's is not in its past.
        dev.sync_event(&dev.record(&a).unwrap()).unwrap();
        assert_eq!(dev.ops_pending(), 1);
        // c depends on both; a second op on each of a and b is unordered with the other.
        dev.copy(&a, x.view(), z.slice_mut(0..1)).unwrap();
        dev.copy(&b, y.view(), z.slice_mut(1..2)).unwrap();
        let (ea, eb) = (dev.record(&a).unwrap(), dev.record(&b).unwrap());
        dev.wait_event(&c, &ea).unwrap();
        dev.wait_event(&c, &eb).unwrap();
        let mut out = [0.0f32; 2];
        dev.download(&c, z.view(), &mut out).unwrap();
        assert_eq!(out, [1.0, 2.0]);
        let order: Vec<usize> = dev.trace().iter().skip(1).map(|(s, _)| *s).collect();
        orders.insert(order);
    }
    // b's fill, a's copy and b's copy ran in more than one order across seeds.
    assert!(orders.len() > 1, "interleavings never varied: {orders:?}");
}

#[test]
fn bad_views_and_shapes_are_errors_and_the_simulation_stops_after_one() {
    let dev = SimDevice::new(0);
    let s = dev.stream("s").unwrap();
    let mut a = dev.alloc::<f32>(8, "a").unwrap();
    let b = dev.alloc::<f32>(4, "b").unwrap();
    assert!(matches!(
        dev.copy(&s, b.view(), a.view_mut()),
        Err(KernelError::LengthMismatch { .. })
    ));
    assert!(a.split_mut(&[0..4, 3..6]).is_err());
    let parts = a.split_mut(&[4..8, 0..4]).unwrap();
    assert_eq!(parts[0].range(), 4..8);
    let mut ids = dev.alloc::<u32>(2, "ids").unwrap();
    dev.upload(&s, &[0, 9], ids.view_mut()).unwrap();
    let mut out = dev.alloc::<f32>(4, "out").unwrap();
    let table = dev.alloc::<f32>(6, "table").unwrap();
    // The id 9 is out of range of a 3-row table: an error when the op runs.
    dev.gather_rows(&s, out.view_mut(), ids.view(), table.view(), 2)
        .unwrap();
    let e = dev.synchronize().unwrap_err().to_string();
    assert!(e.contains("ids[1] = 9"), "{e}");
    let again = dev.fill(&s, out.view_mut(), 0.0).unwrap_err().to_string();
    assert!(again.contains("earlier error"), "{again}");
    // The host device reports the same error at once.
    let host = HostDevice::new();
    let s = host.stream("s").unwrap();
    let mut ids = host.alloc::<u32>(2, "ids").unwrap();
    host.upload(&s, &[0, 9], ids.view_mut()).unwrap();
    let mut out = host.alloc::<f32>(4, "out").unwrap();
    let table = host.alloc::<f32>(6, "table").unwrap();
    assert!(host
        .gather_rows(&s, out.view_mut(), ids.view(), table.view(), 2)
        .is_err());
}

/// The model's row-wise ops and attention on `dev`: layer norm, GELU and its backward,
/// bias rows, add, attention forward and backward, softmax cross-entropy and its
/// backward. Returns every output.
fn model_ops<D: Device>(dev: &D) -> Result<Vec<Vec<f32>>> {
    let s = dev.stream("compute")?;
    let shape = AttnShape {
        b: 5,
        t: 7,
        c: 12,
        h: 3,
    };
    let (rows, c, v) = (shape.b * shape.t, shape.c, 11);
    let vals = |n: usize, seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 + seed * 11) % 41) as f32 * 0.05 - 1.0)
            .collect()
    };
    let up = |x: &[f32], name: &str| -> Result<D::Buf<f32>> {
        let mut b = dev.alloc::<f32>(x.len(), name)?;
        dev.upload(&s, x, b.view_mut())?;
        Ok(b)
    };
    let x = up(&vals(rows * c, 1), "x")?;
    let wb = up(&vals(2 * c, 2), "w|b")?;
    let (mut ln, mut mean, mut rstd) = (
        dev.alloc::<f32>(rows * c, "ln")?,
        dev.alloc::<f32>(rows, "mean")?,
        dev.alloc::<f32>(rows, "rstd")?,
    );
    dev.layernorm_forward(
        &s,
        LayerNormOut {
            out: ln.view_mut(),
            mean: mean.view_mut(),
            rstd: rstd.view_mut(),
        },
        x.view(),
        wb.slice(0..c),
        wb.slice(c..2 * c),
        c,
    )?;
    let mut g = dev.alloc::<f32>(rows * c, "gelu")?;
    dev.gelu_forward(&s, g.view_mut(), ln.view())?;
    let mut dg = up(&vals(rows * c, 3), "dgelu")?;
    dev.gelu_backward(&s, dg.view_mut(), ln.view())?;
    dev.add_rows(&s, g.view_mut(), wb.slice(0..c))?;
    dev.add(&s, g.view_mut(), x.view())?;
    let qkv = up(&vals(rows * 3 * c, 4), "qkv")?;
    let (mut y, mut p) = (
        dev.alloc::<f32>(rows * c, "y")?,
        dev.alloc::<f32>(shape.b * shape.h * shape.t * shape.t, "p")?,
    );
    dev.attention_forward(&s, y.view_mut(), p.view_mut(), qkv.view(), shape)?;
    let (mut dqkv, mut scratch) = (
        dev.alloc::<f32>(rows * 3 * c, "dqkv")?,
        dev.alloc::<f32>(shape.t * shape.t, "scratch")?,
    );
    dev.attention_backward(
        &s,
        dqkv.view_mut(),
        scratch.view_mut(),
        g.view(),
        p.view(),
        qkv.view(),
        shape,
    )?;
    let mut logits = up(&vals(rows * v, 5), "logits")?;
    let mut losses = dev.alloc::<f32>(rows, "losses")?;
    let targets: Vec<u32> = (0..rows as u32).map(|r| (r * 7) % v as u32).collect();
    let mut tg = dev.alloc::<u32>(rows, "targets")?;
    dev.upload(&s, &targets, tg.view_mut())?;
    dev.softmax_xent_forward(&s, logits.view_mut(), losses.view_mut(), tg.view(), v)?;
    let mut probs = dev.alloc::<f32>(rows * v, "probs")?;
    dev.copy(&s, logits.view(), probs.view_mut())?;
    dev.softmax_xent_backward(&s, probs.view_mut(), tg.view(), v, 0.25)?;
    let mut out = Vec::new();
    for b in [
        &ln, &mean, &rstd, &g, &dg, &y, &p, &dqkv, &logits, &losses, &probs,
    ] {
        let mut h = vec![0f32; b.len()];
        dev.download(&s, b.view(), &mut h)?;
        out.push(h);
    }
    Ok(out)
}

#[test]
fn threads_split_the_model_ops_without_changing_a_bit() {
    let one = model_ops(&HostDevice::with_threads(1)).expect("one thread");
    for threads in [2, 3, 8] {
        let many = model_ops(&HostDevice::with_threads(threads)).expect("threads");
        for (i, (a, b)) in one.iter().zip(&many).enumerate() {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "output {i} differs on {threads} threads"
            );
        }
    }
}

/// Llama's ops on `dev` in scalar `F`: RMSNorm forward and backward, rotary/GQA forward
/// and backward, SwiGLU forward and backward, on fixed inputs. Returns every output in f64.
fn llama_ops<D: Device, F: Scalar>(dev: &D) -> Result<Vec<Vec<f64>>> {
    let s = dev.stream("compute")?;
    let rope = RopeShape {
        b: 3,
        t: 5,
        h: 4,
        kv_h: 2,
        hd: 6,
        theta: 10000.0,
    };
    let (rows, c, ckv) = (rope.b * rope.t, rope.c(), rope.c_kv());
    let up = |n: usize, seed: usize, name: &str| -> Result<D::Buf<F>> {
        let x: Vec<F> = (0..n)
            .map(|i| F::from_f64(((i * 37 + seed * 11) % 41) as f64 * 0.05 - 1.0))
            .collect();
        let mut b = dev.alloc::<F>(n, name)?;
        dev.upload(&s, &x, b.view_mut())?;
        Ok(b)
    };
    let (x, w, dout) = (
        up(rows * c, 1, "x")?,
        up(c, 2, "w")?,
        up(rows * c, 3, "dout")?,
    );
    let (mut y, mut rstd) = (
        dev.alloc::<F>(rows * c, "y")?,
        dev.alloc::<F>(rows, "rstd")?,
    );
    dev.rmsnorm_forward(
        &s,
        y.view_mut(),
        rstd.view_mut(),
        x.view(),
        w.view(),
        c,
        1e-5,
    )?;
    let (mut dx, mut dw) = (up(rows * c, 4, "dx")?, up(c, 5, "dw")?);
    dev.rmsnorm_backward(
        &s,
        dx.view_mut(),
        dw.view_mut(),
        dout.view(),
        x.view(),
        w.view(),
        rstd.view(),
        c,
    )?;
    let (k, v) = (up(rows * ckv, 6, "k")?, up(rows * ckv, 7, "v")?);
    let mut qkv = dev.alloc::<F>(rows * 3 * c, "qkv")?;
    dev.rope_gqa_forward(&s, qkv.view_mut(), y.view(), k.view(), v.view(), rope)?;
    let dqkv = up(rows * 3 * c, 8, "dqkv")?;
    let (mut dq, mut dk, mut dv) = (
        dev.alloc::<F>(rows * c, "dq")?,
        dev.alloc::<F>(rows * ckv, "dk")?,
        dev.alloc::<F>(rows * ckv, "dv")?,
    );
    dev.rope_gqa_backward(
        &s,
        dq.view_mut(),
        dk.view_mut(),
        dv.view_mut(),
        dqkv.view(),
        rope,
    )?;
    let mut gate = dev.alloc::<F>(rows * c, "gate")?;
    dev.swiglu_forward(&s, gate.view_mut(), x.view(), y.view())?;
    let (mut da, mut db) = (
        dev.alloc::<F>(rows * c, "da")?,
        dev.alloc::<F>(rows * c, "db")?,
    );
    dev.swiglu_backward(
        &s,
        da.view_mut(),
        db.view_mut(),
        dout.view(),
        x.view(),
        y.view(),
    )?;
    let mut out = Vec::new();
    for b in [&y, &rstd, &dx, &dw, &qkv, &dq, &dk, &dv, &gate, &da, &db] {
        let mut h = vec![F::ZERO; b.len()];
        dev.download(&s, b.view(), &mut h)?;
        out.push(h.iter().map(|x| x.to_f64()).collect());
    }
    Ok(out)
}

/// Llama's ops give the same bits on the host device at any thread count and on the
/// simulated device at any seed, and agree with the same ops in f64 (the reference) to
/// f32 rounding, on the host and on the simulated GPU: values of order 1 through a
/// handful of roundings, 1e-5.
#[test]
fn llama_ops_agree_across_devices_and_with_f64() {
    let want = llama_ops::<_, f32>(&HostDevice::with_threads(1)).expect("host");
    let reference = llama_ops::<_, f64>(&HostDevice::new()).expect("f64");
    let bits = |v: &[Vec<f64>]| -> Vec<u64> { v.iter().flatten().map(|x| x.to_bits()).collect() };
    for threads in [2, 3] {
        let got = llama_ops::<_, f32>(&HostDevice::with_threads(threads)).expect("threads");
        assert_eq!(bits(&got), bits(&want), "{threads} threads");
    }
    for seed in [1, 2, 3] {
        let got = llama_ops::<_, f32>(&SimDevice::new(seed)).expect("sim");
        assert_eq!(bits(&got), bits(&want), "sim seed {seed}");
    }
    // The simulated GPU (the CUDA kernels' twins): RMSNorm's sums are grouped by warp
    // lanes, so y, rstd, dx, dw and what reads y (qkv, gate, da, db) differ from the host
    // by rounding; the rotary backward (dq, dk, dv: outputs 5-7) reads none of them and
    // gives the host's bits.
    let gpu = llama_ops::<_, f32>(&SimDevice::gpu_twin(4)).expect("simulated GPU");
    for i in 5..8 {
        assert_eq!(
            bits(&gpu[i..=i]),
            bits(&want[i..=i]),
            "output {i} on the GPU twin"
        );
    }
    for outputs in [&want, &gpu] {
        for (i, (a, b)) in outputs.iter().zip(&reference).enumerate() {
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "output {i}: {x} vs {y}"
                );
            }
        }
    }
}

#[test]
fn llama_ops_refuse_bad_shapes_with_errors() {
    let host = HostDevice::new();
    let s = host.stream("s").unwrap();
    let buf = |n: usize| host.alloc::<f32>(n, "b").unwrap();
    let (mut y, mut rstd, x, w) = (buf(12), buf(3), buf(12), buf(3));
    // 3 rows of width 4, but w has 3 elements.
    let e = host.rmsnorm_forward(
        &s,
        y.view_mut(),
        rstd.view_mut(),
        x.view(),
        w.view(),
        4,
        1e-5,
    );
    assert!(
        matches!(e, Err(KernelError::LengthMismatch { .. })),
        "{e:?}"
    );
    // 3 kv heads do not divide 4 query heads.
    let rope = RopeShape {
        b: 1,
        t: 1,
        h: 4,
        kv_h: 3,
        hd: 2,
        theta: 1e4,
    };
    let (mut qkv, q, k, v) = (buf(24), buf(8), buf(6), buf(6));
    let e = host.rope_gqa_forward(&s, qkv.view_mut(), q.view(), k.view(), v.view(), rope);
    assert!(matches!(e, Err(KernelError::BadShape { .. })), "{e:?}");
    let (mut o, a) = (buf(5), buf(4));
    assert!(host
        .swiglu_forward(&s, o.view_mut(), a.view(), a.view())
        .is_err());
}

/// Layouts whose span overflows `usize` (in release it wrapped to a few elements, which
/// passed the bound check) or whose stride is no valid offset are refused with an error
/// naming the view, before anything runs.
#[test]
fn matmul_refuses_overflowing_layouts_with_errors() {
    let host = HostDevice::new();
    let s = host.stream("s").unwrap();
    let (a, b) = (
        host.alloc::<f32>(3, "a").unwrap(),
        host.alloc::<f32>(1, "b").unwrap(),
    );
    let mut c = host.alloc::<f32>(3, "c").unwrap();
    let fine = MatLayout::rm(3, 1, 1);
    let one = MatLayout::rm(1, 1, 1);
    // (3-1) * 2^63 + 1 wraps to 1: a 1-element B "held" a 3-row view 2^63 apart.
    let wraps = MatLayout::rm(3, 1, 1 << 63);
    // One row: the span is 1, but the row stride is no isize offset.
    let wild = MatLayout::rm(1, 1, usize::MAX);
    let cases = [
        ("A", wraps, one, fine),
        ("B", fine, wild, fine),
        ("C", fine, one, wraps),
        (
            "A",
            MatLayout {
                cs: usize::MAX,
                ..fine
            },
            one,
            fine,
        ),
    ];
    for (what, la, lb, lc) in cases {
        let mm = MatMul {
            alpha: 1.0f32,
            beta: 0.0,
            a: la,
            b: lb,
            c: lc,
        };
        match host.matmul(&s, mm, a.view(), b.view(), c.view_mut()) {
            Err(KernelError::BadShape {
                op: "matmul",
                detail,
            }) => {
                assert!(detail.starts_with(&format!("{what}'s")), "{detail}")
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // A fitting product of the same buffers still runs.
    let mm = MatMul {
        alpha: 1.0f32,
        beta: 0.0,
        a: fine,
        b: one,
        c: fine,
    };
    host.matmul(&s, mm, a.view(), b.view(), c.view_mut())
        .unwrap();
    host.synchronize().unwrap();
}

/// Attention shapes whose buffer sizes overflow `usize` are errors: with B = 2^62, C = H =
/// 4, T = 1 every size (B*T*3C, B*T*C, B*H*T*T) wrapped to 0, so empty views passed and
/// the kernel ran 2^62 sequences over them.
#[test]
fn attention_refuses_overflowing_shapes_with_errors() {
    let host = HostDevice::new();
    let s = host.stream("s").unwrap();
    let buf = |n: usize| host.alloc::<f32>(n, "b").unwrap();
    let shapes = [
        AttnShape {
            b: 1 << 62,
            t: 1,
            c: 4,
            h: 4,
        },
        AttnShape {
            b: 1,
            t: 1 << 32,
            c: 1,
            h: 1,
        },
        // An empty batch of an impossible shape, too (kernels size by T*3C alone).
        AttnShape {
            b: 0,
            t: 1,
            c: 1 << 63,
            h: 1,
        },
    ];
    for shape in shapes {
        let (mut y, mut p, qkv) = (buf(0), buf(0), buf(0));
        let e = host.attention_forward(&s, y.view_mut(), p.view_mut(), qkv.view(), shape);
        assert!(
            matches!(&e, Err(KernelError::BadShape { op: "attention_forward", detail })
                if detail.contains("more elements than usize")),
            "{shape:?}: {e:?}"
        );
        let (mut dqkv, mut scratch, dy) = (buf(0), buf(1), buf(0));
        let e = host.attention_backward(
            &s,
            dqkv.view_mut(),
            scratch.view_mut(),
            dy.view(),
            p.view(),
            qkv.view(),
            shape,
        );
        assert!(
            matches!(
                &e,
                Err(KernelError::BadShape {
                    op: "attention_backward",
                    ..
                })
            ),
            "{shape:?}: {e:?}"
        );
    }
    // Rotary/GQA alike: 3 * B*T*H*hd wrapped to 0 for B = 2^62.
    let rope = RopeShape {
        b: 1 << 62,
        t: 1,
        h: 2,
        kv_h: 1,
        hd: 2,
        theta: 1e4,
    };
    let (mut qkv, q, k, v) = (buf(0), buf(0), buf(0), buf(0));
    let e = host.rope_gqa_forward(&s, qkv.view_mut(), q.view(), k.view(), v.view(), rope);
    assert!(
        matches!(&e, Err(KernelError::BadShape { detail, .. }) if detail.contains("usize")),
        "{e:?}"
    );
    host.synchronize().unwrap();
}

/// Test tool: host work that finishes on its `polls`-th test (a stand-in for a
/// non-blocking collective), adding 1 to a host buffer when it finishes; counts its tests.
struct SlowWork {
    polls: usize,
    tests: Rc<Cell<usize>>,
    target: *mut f32,
    fail: bool,
}

impl SlowWork {
    fn finish(&mut self) -> Result<()> {
        if self.fail {
            return Err(KernelError::HostWork {
                task: "slow",
                message: "the peer went away".into(),
            });
        }
        // SAFETY: the buffer is retained by the device while this work is in flight.
        unsafe { *self.target += 1.0 };
        Ok(())
    }
}

impl HostWork for SlowWork {
    fn test(&mut self) -> Result<bool> {
        self.tests.set(self.tests.get() + 1);
        if self.tests.get() < self.polls {
            return Ok(false);
        }
        self.finish().map(|()| true)
    }
    fn wait(&mut self) -> Result<()> {
        self.finish()
    }
}

use std::cell::Cell;
use std::rc::Rc;

fn start_slow<D: Device>(
    dev: &D,
    stream: &D::Stream,
    buf: &D::Buf<f32>,
    polls: usize,
    fail: bool,
) -> Rc<Cell<usize>> {
    let tests = Rc::new(Cell::new(0));
    let work = SlowWork {
        polls,
        tests: Rc::clone(&tests),
        target: buf.raw_ptr(),
        fail,
    };
    dev.host_task_started(
        stream,
        "slow",
        &[],
        &[buf.view().access()],
        buf.retain().into_iter().collect(),
        || Ok(Box::new(work) as Box<dyn HostWork>),
    )
    .unwrap();
    tests
}

#[test]
fn host_device_runs_other_streams_while_started_work_is_in_flight() {
    let dev = HostDevice::new();
    let (compute, comm) = (dev.stream("compute").unwrap(), dev.stream("comm").unwrap());
    let mut bucket = dev.alloc::<f32>(1, "bucket").unwrap();
    let mut other = dev.alloc::<f32>(1, "other").unwrap();
    let tests = start_slow(&dev, &comm, &bucket, 3, false);
    // Queued behind the work on comm: it must see the work's +1 when it runs.
    dev.scale(&comm, bucket.view_mut(), 10.0).unwrap();
    let landed = dev.record(&comm).unwrap();
    // compute runs at once (one poll of the work per op).
    dev.fill(&compute, other.view_mut(), 5.0).unwrap();
    assert_eq!(tests.get(), 2, "polled before each op: scale, fill");
    // Waiting for comm's event finishes the work and runs what queued behind it.
    dev.wait_event(&compute, &landed).unwrap();
    let mut out = [0.0f32];
    dev.download(&compute, bucket.view(), &mut out).unwrap();
    assert_eq!(out, [10.0]);
    dev.download(&compute, other.view(), &mut out).unwrap();
    assert_eq!(out, [5.0]);
    let stats = dev.overlap_stats();
    assert_eq!(stats.tasks, 1);
    assert!(stats.total_seconds >= stats.exposed_seconds);
    // Nothing in flight: an event is already complete, and stats keep counting.
    assert!(dev.record(&comm).unwrap().after.is_empty());
}

#[test]
fn host_device_finishes_work_seen_done_by_a_poll_and_keeps_its_buffer() {
    let dev = HostDevice::new();
    let (compute, comm) = (dev.stream("compute").unwrap(), dev.stream("comm").unwrap());
    let bucket = dev.alloc::<f32>(1, "bucket").unwrap();
    let mut other = dev.alloc::<f32>(1, "other").unwrap();
    let mut copy = dev.alloc::<f32>(1, "copy").unwrap();
    let tests = start_slow(&dev, &comm, &bucket, 2, false);
    dev.copy(&comm, bucket.view(), copy.view_mut()).unwrap();
    // The owner lets go of the buffer while the work holds its address.
    drop(bucket);
    // The second poll sees it finished and runs the copy queued behind it.
    dev.fill(&compute, other.view_mut(), 1.0).unwrap();
    dev.fill(&compute, other.view_mut(), 2.0).unwrap();
    assert_eq!(tests.get(), 2);
    let mut out = [0.0f32];
    dev.download(&comm, copy.view(), &mut out).unwrap();
    assert_eq!(out, [1.0]);
    let stats = dev.overlap_stats();
    assert_eq!(stats.tasks, 1);
    assert_eq!(stats.hidden_fraction().map(|h| h > 0.0), Some(true));
}

#[test]
fn host_device_without_overlap_waits_where_work_starts() {
    let dev = HostDevice::new();
    dev.set_overlap(false);
    let comm = dev.stream("comm").unwrap();
    let bucket = dev.alloc::<f32>(1, "bucket").unwrap();
    let tests = start_slow(&dev, &comm, &bucket, 5, false);
    assert_eq!(tests.get(), 0, "waited, never polled");
    let mut out = [0.0f32];
    dev.download(&comm, bucket.view(), &mut out).unwrap();
    assert_eq!(out, [1.0]);
    let s = dev.overlap_stats();
    assert_eq!(s.tasks, 1);
    assert_eq!(s.exposed_seconds, s.total_seconds);
    assert_eq!(s.hidden_fraction(), Some(0.0));
}

#[test]
fn host_device_reports_failed_work_at_the_next_call() {
    let dev = HostDevice::new();
    let (compute, comm) = (dev.stream("compute").unwrap(), dev.stream("comm").unwrap());
    let mut bucket = dev.alloc::<f32>(1, "bucket").unwrap();
    start_slow(&dev, &comm, &bucket, 1, true);
    let e = dev.fill(&compute, bucket.view_mut(), 0.0).unwrap_err();
    assert!(
        matches!(e, KernelError::HostWork { task: "slow", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("the peer went away"), "{e}");
    // The stream is free again afterwards.
    dev.synchronize().unwrap();
}

/// The value of a one-element buffer, read directly (not through the stream, which
/// would wait for the work in flight).
fn peek(buf: &CpuBuffer<f32>) -> f32 {
    // SAFETY: a one-element buffer the test owns; no work in flight writes it now (the
    // callers peek only between ops on this thread, and SlowWork writes only when
    // polled or waited for on this thread).
    unsafe { *buf.raw_ptr() }
}

#[test]
fn host_device_starts_work_behind_work_in_flight_when_nothing_orders_them() {
    let dev = HostDevice::new();
    let comm = dev.stream("comm").unwrap();
    let a = dev.alloc::<f32>(1, "a").unwrap();
    let b = dev.alloc::<f32>(1, "b").unwrap();
    let mut copy = dev.alloc::<f32>(1, "copy").unwrap();
    let first = start_slow(&dev, &comm, &a, 10, false);
    // Queued behind the first work: it reads `a`, which the second work does not touch.
    dev.copy(&comm, a.view(), copy.view_mut()).unwrap();
    let second = start_slow(&dev, &comm, &b, 10, false);
    assert_eq!(peek(&a), 0.0, "the host did not wait for the first work");
    assert_eq!((first.get(), second.get()), (2, 0));
    dev.synchronize().unwrap();
    // The copy ran after the first work, in stream order.
    assert_eq!((peek(&a), peek(&b), peek(&copy)), (1.0, 1.0, 1.0));
    assert_eq!(dev.overlap_stats().tasks, 2);
}

#[test]
fn host_device_waits_before_work_that_an_earlier_op_or_work_conflicts_with() {
    // An op queued behind the first work writes what the second work writes: the op
    // runs first (after the first work), then the second work starts.
    let dev = HostDevice::new();
    let comm = dev.stream("comm").unwrap();
    let a = dev.alloc::<f32>(1, "a").unwrap();
    let mut b = dev.alloc::<f32>(1, "b").unwrap();
    start_slow(&dev, &comm, &a, 10, false);
    dev.fill(&comm, b.view_mut(), 5.0).unwrap();
    start_slow(&dev, &comm, &b, 10, false);
    assert_eq!(
        (peek(&a), peek(&b)),
        (1.0, 5.0),
        "waited for the first work and the fill"
    );
    dev.synchronize().unwrap();
    assert_eq!(peek(&b), 6.0);

    // Work in flight writes what the next work writes.
    let dev = HostDevice::new();
    let comm = dev.stream("comm").unwrap();
    let a = dev.alloc::<f32>(1, "a").unwrap();
    start_slow(&dev, &comm, &a, 10, false);
    start_slow(&dev, &comm, &a, 10, false);
    assert_eq!(
        peek(&a),
        1.0,
        "the first finished before the second started"
    );
    dev.synchronize().unwrap();
    assert_eq!(peek(&a), 2.0);

    // At most MAX_IN_FLIGHT in flight: one more waits for the oldest.
    let dev = HostDevice::new();
    let comm = dev.stream("comm").unwrap();
    let bufs: Vec<CpuBuffer<f32>> = (0..=super::host::MAX_IN_FLIGHT)
        .map(|_| dev.alloc::<f32>(1, "x").unwrap())
        .collect();
    for buf in &bufs {
        start_slow(&dev, &comm, buf, 100, false);
    }
    assert_eq!(peek(&bufs[0]), 1.0, "the oldest finished to make room");
    assert!(bufs[1..].iter().all(|b| peek(b) == 0.0));
    dev.synchronize().unwrap();
    assert!(bufs.iter().all(|b| peek(b) == 1.0));
}

#[test]
fn host_device_still_waits_for_work_started_after_work_that_failed() {
    let dev = HostDevice::new();
    let (compute, comm) = (dev.stream("compute").unwrap(), dev.stream("comm").unwrap());
    let a = dev.alloc::<f32>(1, "a").unwrap();
    let b = dev.alloc::<f32>(1, "b").unwrap();
    let mut other = dev.alloc::<f32>(1, "other").unwrap();
    start_slow(&dev, &comm, &a, 2, true);
    start_slow(&dev, &comm, &b, 100, false);
    let after_second = dev.record(&comm).unwrap();
    // The first work's failure is reported at the next poll...
    let e = dev.fill(&compute, other.view_mut(), 0.0).unwrap_err();
    assert!(
        matches!(e, KernelError::HostWork { task: "slow", .. }),
        "{e}"
    );
    // ...and the second is still waited for where an event says so, not forgotten.
    assert_eq!(peek(&b), 0.0);
    dev.wait_event(&compute, &after_second).unwrap();
    assert_eq!(peek(&b), 1.0);
    dev.synchronize().unwrap();

    // Dropping the device with work in flight behind failed work waits for all of it.
    let dev = HostDevice::new();
    let comm = dev.stream("comm").unwrap();
    let a = dev.alloc::<f32>(1, "a").unwrap();
    let c = dev.alloc::<f32>(1, "c").unwrap();
    let (probe, at) = (
        c.retain().expect("a CPU buffer can be retained"),
        c.raw_ptr(),
    );
    start_slow(&dev, &comm, &a, 100, true);
    start_slow(&dev, &comm, &c, 100, false);
    drop(c);
    drop(dev);
    // SAFETY: `probe` keeps the storage alive; the dropped device has no work left.
    assert_eq!(
        unsafe { *at },
        1.0,
        "the second work was waited for, not dropped"
    );
    drop(probe);
}

#[test]
fn sim_device_without_overlap_waits_for_started_work_in_place() {
    let dev = SimDevice::new(3);
    dev.set_overlap(false);
    let comm = dev.stream("comm").unwrap();
    let bucket = dev.alloc::<f32>(1, "bucket").unwrap();
    let tests = Rc::new(Cell::new(0));
    let work = SlowWork {
        polls: 4,
        tests: Rc::clone(&tests),
        target: bucket.raw_ptr(),
        fail: false,
    };
    dev.host_task_started(
        &comm,
        "slow",
        &[],
        &[bucket.view().access()],
        Vec::new(),
        || Ok(Box::new(work) as Box<dyn HostWork>),
    )
    .unwrap();
    let mut out = [0.0f32];
    dev.download(&comm, bucket.view(), &mut out).unwrap();
    assert_eq!(out, [1.0]);
    assert_eq!(tests.get(), 0);
    let s = dev.overlap_stats();
    assert_eq!(s.tasks, 1);
    assert_eq!(s.exposed_seconds, s.total_seconds);
}

#[test]
fn sim_device_runs_other_streams_while_started_work_is_in_flight() {
    for seed in 0..8 {
        let dev = SimDevice::new(seed);
        let (compute, comm) = (dev.stream("compute").unwrap(), dev.stream("comm").unwrap());
        let mut bucket = dev.alloc::<f32>(1, "bucket").unwrap();
        let mut other = dev.alloc::<f32>(1, "other").unwrap();
        // Finishes only when waited for (no poll reaches 1000).
        let tests = start_slow(&dev, &comm, &bucket, 1000, false);
        // Queued behind the work on comm: it must see the work's +1 when it runs.
        dev.scale(&comm, bucket.view_mut(), 10.0).unwrap();
        let landed = dev.record(&comm).unwrap();
        dev.fill(&compute, other.view_mut(), 5.0).unwrap();
        let mut out = [0.0f32];
        // Compute's result comes without waiting for the work; comm's op stays queued.
        dev.download(&compute, other.view(), &mut out).unwrap();
        assert_eq!(out, [5.0]);
        assert!(tests.get() > 0, "seed {seed}: polled, not waited for");
        assert!(
            dev.trace().iter().all(|&(_, op)| op != "scale"),
            "seed {seed}: {:?}",
            dev.trace()
        );
        // Only comm is left: the host blocks on the work, then comm's queue runs.
        dev.sync_event(&landed).unwrap();
        dev.download(&comm, bucket.view(), &mut out).unwrap();
        assert_eq!(out, [10.0], "seed {seed}");
        let stats = dev.overlap_stats();
        assert_eq!(stats.tasks, 1);
        assert!(stats.total_seconds >= stats.exposed_seconds);
    }
}

#[test]
fn sim_device_lets_a_stream_go_on_once_a_poll_sees_its_work_finished() {
    let dev = SimDevice::new(1);
    let (compute, comm) = (dev.stream("compute").unwrap(), dev.stream("comm").unwrap());
    let bucket = dev.alloc::<f32>(1, "bucket").unwrap();
    let mut copy = dev.alloc::<f32>(1, "copy").unwrap();
    let mut other = dev.alloc::<f32>(1, "other").unwrap();
    let tests = start_slow(&dev, &comm, &bucket, 2, false);
    dev.copy(&comm, bucket.view(), copy.view_mut()).unwrap();
    // The owner lets go of the buffer while the work holds its address.
    drop(bucket);
    // Queueing polls: the second poll sees the work finished.
    dev.fill(&compute, other.view_mut(), 1.0).unwrap();
    assert_eq!(tests.get(), 2);
    let mut out = [0.0f32];
    dev.download(&comm, copy.view(), &mut out).unwrap();
    assert_eq!(out, [1.0]);
    let s = dev.overlap_stats();
    assert_eq!(s.hidden_fraction().map(|h| h > 0.0), Some(true), "{s:?}");
}

#[test]
fn sim_device_reports_failed_work_and_stops() {
    let dev = SimDevice::new(2);
    let (compute, comm) = (dev.stream("compute").unwrap(), dev.stream("comm").unwrap());
    let mut bucket = dev.alloc::<f32>(1, "bucket").unwrap();
    let mut other = dev.alloc::<f32>(1, "other").unwrap();
    start_slow(&dev, &comm, &bucket, 1, true);
    let e = dev.fill(&compute, other.view_mut(), 0.0).unwrap_err();
    assert!(
        matches!(e, KernelError::HostWork { task: "slow", .. }),
        "{e}"
    );
    let e = dev.fill(&comm, bucket.view_mut(), 0.0).unwrap_err();
    assert!(e.to_string().contains("earlier error"), "{e}");
}

#[test]
fn sim_device_waits_for_work_in_flight_when_dropped() {
    let dev = SimDevice::new(4);
    let comm = dev.stream("comm").unwrap();
    let bucket = dev.alloc::<f32>(1, "bucket").unwrap();
    let raw = bucket.raw_ptr();
    let tests = start_slow(&dev, &comm, &bucket, 1000, false);
    // The work retains the buffer: read it through a retained handle after the drop.
    let keep = bucket.retain();
    drop(bucket);
    drop(dev);
    // SAFETY: `keep` holds the allocation.
    assert_eq!(
        unsafe { *raw },
        1.0,
        "the work finished before the device went"
    );
    assert!(tests.get() < 1000);
    drop(keep);
}

/// Staging memory filled by started work is read by [`Device::upload_from_staging`] when
/// the stream reaches the copy, not when it is queued, and is held until then.
fn staged_upload_reads_the_region_late<D: Device>(dev: &D) -> Vec<f32> {
    let comm = dev.stream("comm").unwrap();
    let region = Rc::new(dev.alloc_staging(8).unwrap());
    assert!(region.bytes() >= 8);
    let mut dst = dev.alloc::<f32>(2, "dst").unwrap();
    let work = SlowWork {
        polls: 1000,
        tests: Rc::new(Cell::new(0)),
        target: region.as_ptr() as *mut f32,
        fail: false,
    };
    let held: Vec<Retained> = vec![Box::new(Rc::clone(&region))];
    dev.host_task_started(&comm, "fill region", &[], &[], held, || {
        Ok(Box::new(work) as Box<dyn HostWork>)
    })
    .unwrap();
    // SAFETY: two f32 in the region, which `keep` holds; only the work writes it.
    unsafe {
        dev.upload_from_staging(
            &comm,
            region.as_ptr() as *const f32,
            dst.view_mut(),
            Box::new(Rc::clone(&region)),
        )
    }
    .unwrap();
    drop(region);
    let mut out = vec![0.0f32; 2];
    dev.download(&comm, dst.view(), &mut out).unwrap();
    out
}

#[test]
fn staged_uploads_read_the_region_when_the_stream_gets_there() {
    assert_eq!(
        staged_upload_reads_the_region_late(&SimDevice::new(9)),
        [1.0, 0.0]
    );
    assert_eq!(
        staged_upload_reads_the_region_late(&HostDevice::new()),
        [1.0, 0.0]
    );
    let waits = SimDevice::new(9);
    waits.set_overlap(false);
    assert_eq!(staged_upload_reads_the_region_late(&waits), [1.0, 0.0]);
}

/// The ops whose sums over rows split by channels (layer norm backward's dw and db, the
/// bias gradient) and the copies split by rows or elements (fill, copy, bias rows,
/// accumulation into bf16), on `dev`, for `rows` rows of width `c`. Returns every output.
fn split_ops<D: Device>(dev: &D, rows: usize, c: usize) -> Result<Vec<Vec<f32>>> {
    let s = dev.stream("compute")?;
    let vals = |n: usize, seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 + seed * 11) % 41) as f32 * 0.05 - 1.0 + seed as f32 * 1e-3)
            .collect()
    };
    let up = |x: &[f32], name: &str| -> Result<D::Buf<f32>> {
        let mut b = dev.alloc::<f32>(x.len(), name)?;
        dev.upload(&s, x, b.view_mut())?;
        Ok(b)
    };
    let (x, w, b) = (
        up(&vals(rows * c, 1), "x")?,
        up(&vals(c, 2), "w")?,
        up(&vals(c, 3), "b")?,
    );
    let (mut ln, mut mean, mut rstd) = (
        dev.alloc::<f32>(rows * c, "ln")?,
        dev.alloc::<f32>(rows, "mean")?,
        dev.alloc::<f32>(rows, "rstd")?,
    );
    dev.layernorm_forward(
        &s,
        LayerNormOut {
            out: ln.view_mut(),
            mean: mean.view_mut(),
            rstd: rstd.view_mut(),
        },
        x.view(),
        w.view(),
        b.view(),
        c,
    )?;
    let dout = up(&vals(rows * c, 4), "dout")?;
    let (mut dx, mut dw, mut db) = (
        up(&vals(rows * c, 5), "dx")?,
        up(&vals(c, 6), "dw")?,
        up(&vals(c, 7), "db")?,
    );
    dev.layernorm_backward(
        &s,
        LayerNormGrads {
            dx: dx.view_mut(),
            dw: dw.view_mut(),
            db: db.view_mut(),
        },
        dout.view(),
        LayerNormSaved {
            x: x.view(),
            w: w.view(),
            mean: mean.view(),
            rstd: rstd.view(),
        },
        c,
    )?;
    let mut dbias = up(&vals(c, 8), "dbias")?;
    dev.bias_backward(&s, dbias.view_mut(), dout.view())?;
    let mut filled = dev.alloc::<f32>(rows * c, "filled")?;
    dev.fill_rows(&s, filled.view_mut(), b.view())?;
    let mut copied = dev.alloc::<f32>(rows * c, "copied")?;
    dev.fill(&s, copied.view_mut(), 3.5)?;
    dev.copy(&s, x.slice(0..rows * c - 1), copied.slice_mut(1..rows * c))?;
    let mut zeroed = up(&vals(rows * c, 9), "zeroed")?;
    dev.fill(&s, zeroed.slice_mut(0..rows * c - 1), 0.0)?;
    let mut acc = dev.alloc::<bf16>(rows * c, "acc")?;
    let half: Vec<bf16> = vals(rows * c, 10)
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    dev.upload(&s, &half, acc.view_mut())?;
    dev.accumulate(&s, acc.view_mut(), dout.view())?;
    let mut acc32 = dev.alloc::<f32>(rows * c, "acc32")?;
    dev.cast(&s, acc.view(), acc32.view_mut())?;
    let mut out = Vec::new();
    for b in [
        &ln, &dx, &dw, &db, &dbias, &filled, &copied, &zeroed, &acc32,
    ] {
        let mut h = vec![0f32; b.len()];
        dev.download(&s, b.view(), &mut h)?;
        out.push(h);
    }
    Ok(out)
}

/// Layer norm backward (dx by rows, dw and db by channels), the bias gradient (by
/// channels), fill, copy, bias rows and bf16 accumulation give one thread's bits on 2, 3
/// and 8 threads, at widths below, across and not a multiple of the 16-channel parts.
#[test]
fn threads_split_row_sums_by_channels_without_changing_a_bit() {
    for (rows, c) in [(37, 53), (5, 12), (9, 48), (1, 70)] {
        let one = split_ops(&HostDevice::with_threads(1), rows, c).expect("one thread");
        for threads in [2, 3, 8] {
            let many = split_ops(&HostDevice::with_threads(threads), rows, c).expect("threads");
            for (i, (a, b)) in one.iter().zip(&many).enumerate() {
                assert!(
                    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "rows {rows} width {c}: output {i} differs on {threads} threads"
                );
            }
        }
    }
}

/// The simulated GPU's attention as batched products (the CUDA device's plan on the host
/// GEMM) agrees with the rows kernels' twins to rounding, through the Device trait with
/// more sequences than heads (sequences batched); every other op keeps its bits. A
/// simulated device that is not a GPU has no such choice.
#[test]
fn simulated_gpu_attention_as_products_agrees_with_the_rows_twins() {
    use crate::twin::attention_products::AttentionKernels;
    let rows = model_ops(&SimDevice::gpu_twin(3)).expect("rows kernels");
    let dev = SimDevice::gpu_twin(3);
    let before = dev.set_attention_kernels(AttentionKernels::Products);
    assert_eq!(before, Some(AttentionKernels::Rows));
    assert!(dev.describe().contains("batched products"));
    let products = model_ops(&dev).expect("batched products");
    // model_ops' outputs: ln, mean, rstd, gelu, dgelu, y, p, dqkv, logits, losses, probs.
    let attention = [5, 6, 7];
    // The products ran: their rounding differs somewhere from the rows kernels'.
    assert!(
        attention.iter().any(|&i| rows[i] != products[i]),
        "the products gave the rows kernels' bits: did they run?"
    );
    for (i, (a, b)) in rows.iter().zip(&products).enumerate() {
        if attention.contains(&i) {
            let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
            let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                worst / scale < 1e-5,
                "output {i}: max|d|/max|ref| {}",
                worst / scale
            );
        } else {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "output {i} changed"
            );
        }
    }
    assert_eq!(
        SimDevice::new(1).set_attention_kernels(AttentionKernels::Products),
        None
    );
}

#[test]
fn carving_lengths_that_overflow_is_an_error_not_a_huge_view() {
    // In release builds a plain sum wraps [usize::MAX, 2] to 1, which fits a 1-element
    // buffer: the first piece would then span usize::MAX elements.
    let dev = HostDevice::new();
    let mut a = dev.alloc::<f32>(1, "a").unwrap();
    for lens in [[usize::MAX, 2], [1, usize::MAX], [2, 0]] {
        let e = a.view().try_carve(lens).unwrap_err();
        assert!(matches!(e, KernelError::BadViews(_)), "{e}");
        assert!(e.to_string().contains("buffer 'a'"), "{e}");
        let e = a.view_mut().try_carve(lens).unwrap_err();
        assert!(matches!(e, KernelError::BadViews(_)), "{e}");
    }
    // Pieces that fit come out consecutive, from the view's start.
    let mut b = dev.alloc::<f32>(8, "b").unwrap();
    let [x, y] = b.slice_mut(2..8).try_carve([3, 2]).unwrap();
    assert_eq!((x.range(), y.range()), (2..5, 5..7));
    let [x, y, z] = b.slice(1..4).try_carve([0, 3, 0]).unwrap();
    assert_eq!((x.range(), y.range(), z.range()), (1..1, 1..4, 4..4));
}

#[test]
#[should_panic(expected = "add up to more than the view")]
fn carve_panics_on_overflowing_lengths_in_every_build() {
    let dev = HostDevice::new();
    let mut a = dev.alloc::<f32>(1, "a").unwrap();
    let _ = a.view_mut().carve([usize::MAX, 2]);
}

/// Ops refuse a view that is not inside its buffer (the check where a view becomes a
/// slice, behind the view constructors' own).
fn views_outside_their_buffer_are_refused<D: cpu::CpuQueue>(dev: &D) {
    let s = dev.stream("s").unwrap();
    let mut a = dev.alloc::<f32>(1, "a").unwrap();
    let mut b = dev.alloc::<f32>(4, "b").unwrap();
    let bad = |e: KernelError| {
        assert!(matches!(e, KernelError::BadViews(_)), "{e}");
        assert!(e.to_string().contains("not inside buffer 'a'"), "{e}");
    };
    bad(dev
        .fill(&s, ViewMut::unchecked_for_tests(&mut a, 0..usize::MAX), 1.0)
        .unwrap_err());
    bad(dev
        .fill(&s, ViewMut::unchecked_for_tests(&mut a, 1..3), 1.0)
        .unwrap_err());
    bad(dev
        .copy(&s, View::unchecked_for_tests(&a, 0..4), b.view_mut())
        .unwrap_err());
    bad(dev
        .copy(
            &s,
            b.slice(0..2),
            ViewMut::unchecked_for_tests(&mut a, 0..2),
        )
        .unwrap_err());
    let mut out = [0.0f32; 3];
    bad(dev
        .download(&s, View::unchecked_for_tests(&a, 2..5), &mut out)
        .unwrap_err());
    // Views inside the buffer still work.
    dev.fill(&s, b.view_mut(), 2.0).unwrap();
    dev.copy(&s, b.slice(0..1), a.view_mut()).unwrap();
    dev.synchronize().unwrap();
    let mut one = [0.0f32];
    dev.download(&s, a.view(), &mut one).unwrap();
    assert_eq!(one, [2.0]);
}

#[test]
fn host_and_sim_devices_refuse_views_outside_their_buffer() {
    views_outside_their_buffer_are_refused(&HostDevice::new());
    views_outside_their_buffer_are_refused(&SimDevice::new(0));
}
