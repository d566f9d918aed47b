//! Model correctness on the `tiny` preset: backward against central finite differences in
//! f64 for every parameter tensor; f32 against the f64 reference; loss at init ~ ln V;
//! overfitting one batch; determinism; and layer-by-layer execution with unit parameters
//! gathered into separate buffers per call (stage 3) giving the same bits as one pass.

use zero_core::{Batch, Model};
use zero_models::init::SplitMix64;
use zero_models::{Gpt, GptConfig};

const B: usize = 2;

fn tiny() -> GptConfig {
    GptConfig::preset("tiny").expect("tiny is a preset")
}

/// A fixed batch of B rows of T tokens.
fn batch_tokens(cfg: &GptConfig, rows: usize, seed: u64) -> (Vec<u32>, Vec<u32>) {
    let mut g = SplitMix64::new(seed);
    let n = rows * cfg.max_seq_len;
    let v = cfg.vocab_size as u64;
    let inputs = (0..n).map(|_| (g.next_u64() % v) as u32).collect();
    let targets = (0..n).map(|_| (g.next_u64() % v) as u32).collect();
    (inputs, targets)
}

fn batch<'a>(cfg: &GptConfig, rows: usize, io: &'a (Vec<u32>, Vec<u32>)) -> Batch<'a> {
    Batch {
        rows,
        seq_len: cfg.max_seq_len,
        inputs: &io.0,
        targets: &io.1,
    }
}

/// Init, then perturb every parameter by N(0, 0.2) so LayerNorm weights, biases and all
/// paths carry non-trivial gradients (at init biases are 0 and LN weights 1).
fn rough_params(model: &Gpt<f64>) -> Vec<Vec<f64>> {
    let mut params = model.init_params(7);
    let mut g = SplitMix64::new(99);
    for p in params.iter_mut().flatten() {
        *p += 0.2 * g.next_normal();
    }
    params
}

#[test]
fn backward_matches_central_differences_f64_for_every_tensor() {
    gradcheck(tiny(), B);
}

/// T = 70 spans two 64-query bands of the causal attention products.
#[test]
fn backward_matches_central_differences_f64_across_attention_bands() {
    let cfg = GptConfig {
        vocab_size: 16,
        max_seq_len: 70,
        n_layer: 1,
        n_head: 2,
        n_embd: 8,
    };
    gradcheck(cfg, 1);
}

fn gradcheck(cfg: GptConfig, rows: usize) {
    let mut model = Gpt::<f64>::new(cfg, rows, 1).expect("config is valid");
    let io = batch_tokens(&cfg, rows, 3);
    let bt = batch(&cfg, rows, &io);
    let mut params = rough_params(&model);
    let mut grads = model.zero_grads();
    let scale = 1.0 / (rows * cfg.max_seq_len) as f64;
    model
        .forward_backward(&bt, &params, &mut grads, scale)
        .expect("valid call");
    let spec = cfg.spec();
    let h = 1e-5;
    let mut checked = 0;
    for (u, unit) in spec.units.iter().enumerate() {
        for (p, off) in unit.params.iter().zip(unit.offsets()) {
            let mut max_g = 0.0f64;
            for i in off..off + p.numel() {
                let x = params[u][i];
                params[u][i] = x + h;
                let lp = model.forward_all(&bt, &params).expect("valid call");
                params[u][i] = x - h;
                let lm = model.forward_all(&bt, &params).expect("valid call");
                params[u][i] = x;
                let fd = (lp - lm) / (2.0 * h);
                let an = grads[u][i];
                // Central differences in f64: truncation ~h^2|f'''| ~ 1e-10, rounding
                // ~eps*|loss|/h ~ 1e-10; 1e-7 absolute + 1e-5 relative leaves a wide margin
                // while any wrong term (O(|g|) error) fails.
                assert!(
                    (an - fd).abs() <= 1e-7 + 1e-5 * fd.abs(),
                    "{}[{}]: analytic {an:e} vs finite difference {fd:e}",
                    p.name,
                    i - off
                );
                max_g = max_g.max(an.abs());
                checked += 1;
            }
            assert!(
                max_g > 1e-6,
                "{}: gradient is all ~0 ({max_g:e}); the check would be vacuous",
                p.name
            );
        }
    }
    assert_eq!(checked, cfg.num_params());
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

#[test]
fn f32_model_matches_f64_reference() {
    let cfg = tiny();
    let mut m64 = Gpt::<f64>::new(cfg, B, 1).expect("valid");
    let mut m32 = Gpt::<f32>::new(cfg, B, 1).expect("valid");
    let io = batch_tokens(&cfg, B, 5);
    let bt = batch(&cfg, B, &io);
    let p64 = rough_params(&m64);
    // The f32 model runs on the f32 rounding of the same parameters; compare it with the
    // f64 model on those rounded values, so only the arithmetic differs.
    let p32: Vec<Vec<f32>> = p64
        .iter()
        .map(|u| u.iter().map(|&x| x as f32).collect())
        .collect();
    let p64: Vec<Vec<f64>> = p32
        .iter()
        .map(|u| u.iter().map(|&x| x as f64).collect())
        .collect();
    let scale = 1.0 / (B * cfg.max_seq_len) as f64;
    let (mut g64, mut g32) = (m64.zero_grads(), m32.zero_grads());
    let l64 = m64
        .forward_backward(&bt, &p64, &mut g64, scale)
        .expect("valid");
    let l32 = m32
        .forward_backward(&bt, &p32, &mut g32, scale as f32)
        .expect("valid");
    // f32 rounding (6e-8) grows through ~10 layers of O(C)-term sums: relative 1e-5 on the
    // loss and 1e-4 of each tensor's largest gradient is ~100x the expected error.
    assert!(
        (l64 - l32).abs() <= 1e-5 * l64.abs(),
        "loss f64 {l64} vs f32 {l32}"
    );
    let spec = cfg.spec();
    for (u, unit) in spec.units.iter().enumerate() {
        for (p, off) in unit.params.iter().zip(unit.offsets()) {
            let r = off..off + p.numel();
            let want = &g64[u][r.clone()];
            let tol = 1e-4 * max_abs(want);
            for (i, (&w, &g)) in want.iter().zip(&g32[u][r]).enumerate() {
                assert!(
                    (w - g as f64).abs() <= tol,
                    "{}[{i}]: f64 {w:e} vs f32 {g:e}",
                    p.name
                );
            }
        }
    }
}

#[test]
fn loss_at_init_is_close_to_ln_vocab() {
    let mut cfg = tiny();
    cfg.vocab_size = 256;
    cfg.max_seq_len = 32;
    let mut model = Gpt::<f32>::new(cfg, B, 1).expect("valid");
    let params = model.init_params(1);
    let io = batch_tokens(&cfg, B, 11);
    let loss = model
        .forward_all(&batch(&cfg, B, &io), &params)
        .expect("valid");
    // Logits at init have std ~0.02*sqrt(C) = 0.08, which raises the expected loss above
    // ln V by ~var/2 = 0.003; 0.05 allows for the sample.
    let ln_v = (cfg.vocab_size as f64).ln();
    assert!(
        (loss - ln_v).abs() < 0.05,
        "loss at init {loss}, ln V = {ln_v}"
    );
}

/// Adam on flat per-unit buffers (the test's own optimizer; the engine has the real one).
fn adam_step(
    params: &mut [Vec<f32>],
    grads: &[Vec<f32>],
    m: &mut [Vec<f32>],
    v: &mut [Vec<f32>],
    t: i32,
    lr: f32,
) {
    let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
    for u in 0..params.len() {
        for i in 0..params[u].len() {
            let g = grads[u][i];
            m[u][i] = b1 * m[u][i] + (1.0 - b1) * g;
            v[u][i] = b2 * v[u][i] + (1.0 - b2) * g * g;
            let mh = m[u][i] / (1.0 - b1.powi(t));
            let vh = v[u][i] / (1.0 - b2.powi(t));
            params[u][i] -= lr * mh / (vh.sqrt() + eps);
        }
    }
}

#[test]
fn tiny_model_overfits_one_batch() {
    let cfg = tiny();
    let mut model = Gpt::<f32>::new(cfg, B, 1).expect("valid");
    let mut params = model.init_params(42);
    let io = batch_tokens(&cfg, B, 13);
    let bt = batch(&cfg, B, &io);
    let (mut m, mut v) = (model.zero_grads(), model.zero_grads());
    let scale = 1.0 / (B * cfg.max_seq_len) as f32;
    let mut first = f64::NAN;
    let mut last = f64::NAN;
    for step in 1..=300 {
        let mut grads = model.zero_grads();
        last = model
            .forward_backward(&bt, &params, &mut grads, scale)
            .expect("valid");
        if step == 1 {
            first = last;
        }
        adam_step(&mut params, &grads, &mut m, &mut v, step, 1e-2);
    }
    assert!(
        last < 0.1 * first,
        "loss went from {first} to {last}: less than a 90% drop"
    );
}

#[test]
fn same_seed_same_bits() {
    let cfg = tiny();
    let run = |seed: u64| {
        let mut model = Gpt::<f32>::new(cfg, B, 1).expect("valid");
        let params = model.init_params(seed);
        let mut grads = model.zero_grads();
        let io = batch_tokens(&cfg, B, 17);
        let loss = model
            .forward_backward(&batch(&cfg, B, &io), &params, &mut grads, 0.01)
            .expect("valid");
        (loss.to_bits(), params, grads)
    };
    let (a, b, c) = (run(5), run(5), run(6));
    assert_eq!(a.0, b.0);
    let bits = |v: &[Vec<f32>]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.1), bits(&b.1));
    assert_eq!(bits(&a.2), bits(&b.2));
    assert_ne!(
        bits(&a.1),
        bits(&c.1),
        "a different seed must give different parameters"
    );
}

/// Stage-3 style: each call gets freshly "gathered" copies of only its units' parameters,
/// in buffers with NaN padding after the unit (the model must read only numel elements),
/// and gradients accumulate into padded per-unit buffers. Must equal, bit for bit, one
/// pass over slices of a single contiguous buffer, on 1 and 2 GEMM threads.
#[test]
fn layer_by_layer_with_separate_unit_buffers_is_bitwise_one_pass() {
    let mut cfg = tiny();
    cfg.n_embd = 64;
    cfg.n_head = 4;
    cfg.max_seq_len = 96; // two attention bands
    cfg.vocab_size = 96;
    let rows = 4;
    let io = batch_tokens(&cfg, rows, 23);
    let bt = batch(&cfg, rows, &io);
    let scale = 1.0 / (rows * cfg.max_seq_len) as f32;

    // Reference: all parameters in one flat buffer, sliced per unit.
    let mut reference = Gpt::<f32>::new(cfg, rows, 1).expect("valid");
    let spec = reference.spec().clone();
    let flat: Vec<f32> = reference.init_params(3).concat();
    let mut flat_grads = vec![0f32; flat.len()];
    let mut at = 0;
    let mut ps: Vec<&[f32]> = Vec::new();
    for u in &spec.units {
        ps.push(&flat[at..at + u.numel()]);
        at += u.numel();
    }
    let mut gs: Vec<&mut [f32]> = Vec::new();
    let mut rest = flat_grads.as_mut_slice();
    for u in &spec.units {
        let (h, t) = rest.split_at_mut(u.numel());
        gs.push(h);
        rest = t;
    }
    let want_loss = reference
        .forward_backward(&bt, &ps, &mut gs, scale)
        .expect("valid");

    for threads in [1, 2] {
        let mut model = Gpt::<f32>::new(cfg, rows, threads).expect("valid");
        const PAD: usize = 5;
        let gather = |u: usize| {
            let mut v = vec![f32::NAN; spec.units[u].numel() + PAD];
            reference.init_unit(3, u, &mut v);
            v
        };
        let mut grads: Vec<Vec<f32>> = spec
            .units
            .iter()
            .map(|u| vec![0f32; u.numel() + PAD])
            .collect();
        model.begin_micro_step(&bt).expect("valid");
        for (l, layer) in spec.layers.iter().enumerate() {
            let owned: Vec<Vec<f32>> = layer.units.iter().map(|&u| gather(u)).collect();
            let p: Vec<&[f32]> = owned.iter().map(|v| v.as_slice()).collect();
            model.forward_layer(l, &p).expect("valid");
        }
        assert_eq!(model.loss().to_bits(), (want_loss as f32).to_bits());
        for (l, layer) in spec.layers.iter().enumerate().rev() {
            let owned: Vec<Vec<f32>> = layer.units.iter().map(|&u| gather(u)).collect();
            let p: Vec<&[f32]> = owned.iter().map(|v| v.as_slice()).collect();
            let mut picked: Vec<(usize, &mut Vec<f32>)> = grads
                .iter_mut()
                .enumerate()
                .filter(|(u, _)| layer.units.contains(u))
                .collect();
            picked.sort_by_key(|(u, _)| layer.units.iter().position(|x| x == u));
            let mut g: Vec<&mut [f32]> =
                picked.into_iter().map(|(_, v)| v.as_mut_slice()).collect();
            model.backward_layer(l, &p, &mut g, scale).expect("valid");
        }
        let mut at = 0;
        for (u, unit) in spec.units.iter().enumerate() {
            let want = &flat_grads[at..at + unit.numel()];
            let got = &grads[u][..unit.numel()];
            assert!(
                want.iter()
                    .zip(got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "unit {} differs on {threads} threads",
                unit.name
            );
            assert!(
                grads[u][unit.numel()..].iter().all(|&x| x == 0.0),
                "padding was written"
            );
            at += unit.numel();
        }
    }
}

/// A batch smaller than the arena (fewer rows, shorter sequences) computes the same bits
/// as on a model whose arena is exactly its size.
#[test]
fn smaller_batches_fit_the_arena_and_match() {
    let cfg = tiny();
    let (rows, t) = (2, 5);
    let io = batch_tokens(&cfg, rows, 29);
    let (x, y) = (&io.0[..rows * t], &io.1[..rows * t]);
    let small = Batch {
        rows,
        seq_len: t,
        inputs: x,
        targets: y,
    };
    let run = |max_rows: usize| {
        let mut model = Gpt::<f32>::new(cfg, max_rows, 1).expect("valid");
        let params = model.init_params(9);
        let mut grads = model.zero_grads();
        let loss = model
            .forward_backward(&small, &params, &mut grads, 0.1)
            .expect("valid");
        let bits: Vec<u32> = grads.iter().flatten().map(|g| g.to_bits()).collect();
        (loss.to_bits(), bits)
    };
    assert_eq!(run(2), run(7));
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let cfg = tiny();
    let mut model = Gpt::<f32>::new(cfg, B, 1).expect("valid");
    let params = model.init_params(1);
    let mut io = batch_tokens(&cfg, B, 1);
    io.0[3] = cfg.vocab_size as u32;
    assert!(
        model.begin_micro_step(&batch(&cfg, B, &io)).is_err(),
        "token >= V"
    );
    let io = batch_tokens(&cfg, B, 1);
    model.begin_micro_step(&batch(&cfg, B, &io)).expect("valid");
    assert!(
        model.forward_layer(1, &[&params[1]]).is_err(),
        "out of order"
    );
    assert!(
        model.forward_layer(0, &[&params[0][..10]]).is_err(),
        "short slice"
    );
    let big = (0..3 * cfg.max_seq_len).map(|_| 0u32).collect::<Vec<_>>();
    let too_many_rows = Batch {
        rows: 3,
        seq_len: cfg.max_seq_len,
        inputs: &big,
        targets: &big,
    };
    assert!(
        model.begin_micro_step(&too_many_rows).is_err(),
        "B above the arena"
    );
}
