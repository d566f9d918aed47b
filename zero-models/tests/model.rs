//! Model correctness on the `tiny` preset: backward against central finite differences in
//! f64 for every parameter tensor; f32 against the f64 reference; loss at init ~ ln V;
//! overfitting one batch; determinism; layer-by-layer execution with unit parameters
//! gathered into separate buffers per call (stage 3) giving the same bits as one pass;
//! the simulated device giving the host device's bits; and the token table split into
//! row blocks being the same model.

use zero_core::model::{Compute, UnitGrads, UnitParams};
use zero_core::Model;
use zero_kernels::device::{Buffer, Device, HostDevice, Scalar, SimDevice};
use zero_kernels::{Exec, Isa};
use zero_models::init::SplitMix64;
use zero_models::LayeredLm;
use zero_models::{download_units, upload_units, Gpt, GptConfig, TokenBatch};

const B: usize = 2;

/// Gradient views of a layer's units from per-unit buffers, in the layer's unit order
/// (what the engine passes to `backward_layer`).
fn layer_grads<'a>(
    spec: &'a zero_core::ModelSpec,
    layer: &zero_core::LayerSpec,
    grads: &'a mut [<HostDevice as Device>::Buf<f32>],
) -> Vec<UnitGrads<'a, HostDevice>> {
    let mut picked: Vec<(usize, _)> = grads
        .iter_mut()
        .enumerate()
        .filter(|(u, _)| layer.units.contains(u))
        .collect();
    picked.sort_by_key(|(u, _)| layer.units.iter().position(|x| x == u));
    picked
        .into_iter()
        .map(|(u, b)| UnitGrads::new(&spec.units[u], b.view_mut()))
        .collect()
}

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

fn batch<'a>(cfg: &GptConfig, rows: usize, io: &'a (Vec<u32>, Vec<u32>)) -> TokenBatch<'a> {
    TokenBatch {
        rows,
        seq_len: cfg.max_seq_len,
        inputs: &io.0,
        targets: &io.1,
    }
}

/// A device and its compute stream.
struct On<D: Device> {
    dev: D,
    stream: D::Stream,
}

impl<D: Device> On<D> {
    fn new(dev: D) -> Self {
        let stream = dev.stream("compute").expect("stream");
        On { dev, stream }
    }
    fn cx(&self) -> Compute<'_, D> {
        Compute {
            dev: &self.dev,
            stream: &self.stream,
        }
    }
    /// forward + backward on host parameter and gradient buffers (gradients added into).
    fn fb<F: Scalar>(
        &self,
        model: &mut Gpt<D, F>,
        batch: &TokenBatch<'_>,
        params: &[Vec<F>],
        grads: &mut [Vec<F>],
        scale: F,
    ) -> f64 {
        let p = upload_units(self.cx(), params, "p").expect("upload");
        let mut g = upload_units(self.cx(), grads, "g").expect("upload");
        let loss = model
            .forward_backward(self.cx(), batch, &p, &mut g, scale)
            .expect("valid call");
        let back = download_units(self.cx(), &g).expect("download");
        grads.clone_from_slice(&back);
        loss
    }
    fn fwd<F: Scalar>(
        &self,
        model: &mut Gpt<D, F>,
        batch: &TokenBatch<'_>,
        params: &[Vec<F>],
    ) -> f64 {
        let p = upload_units(self.cx(), params, "p").expect("upload");
        model.forward_all(self.cx(), batch, &p).expect("valid call")
    }
}

fn host() -> On<HostDevice> {
    On::new(HostDevice::new())
}

/// Init, then perturb every parameter by N(0, 0.2) so LayerNorm weights, biases and all
/// paths carry non-trivial gradients (at init biases are 0 and LN weights 1).
fn rough_params<D: Device>(model: &Gpt<D, f64>) -> Vec<Vec<f64>> {
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
        vocab_block_rows: None,
        checkpoint_every: 0,
    };
    gradcheck(cfg, 1);
}

/// `tiny` with its 32-row table in blocks of 10, 10, 10 and 2 rows: four units, three
/// more lookup layers and three more logits layers.
fn tiny_split() -> GptConfig {
    GptConfig {
        vocab_block_rows: Some(10),
        ..tiny()
    }
}

#[test]
fn backward_matches_central_differences_f64_with_the_table_in_row_blocks() {
    let cfg = tiny_split();
    assert_eq!(cfg.vocab_blocks(), vec![0..10, 10..20, 20..30, 30..32]);
    assert_eq!(cfg.spec().units.len(), 4 + cfg.n_layer + 1);
    assert_eq!(cfg.spec().layers.len(), 4 + cfg.n_layer + 4);
    gradcheck(cfg, B);
}

/// Splitting the table changes no value: the blocks hold the whole table's initial rows,
/// the forward computes the same logits and loss, and the gradients agree with the
/// unsplit model's (the lookups' bitwise; the head's to f32 rounding, since the input
/// gradient of the head is summed block by block).
#[test]
fn the_table_in_row_blocks_is_the_same_model() {
    let (whole_cfg, split_cfg) = (tiny(), tiny_split());
    let on = host();
    let io = batch_tokens(&whole_cfg, B, 41);
    let bt = batch(&whole_cfg, B, &io);
    let scale = 1.0 / (B * whole_cfg.max_seq_len) as f32;
    let mut whole = Gpt::<HostDevice, f32>::new(&on.dev, whole_cfg, B).expect("valid");
    let mut split = Gpt::<HostDevice, f32>::new(&on.dev, split_cfg, B).expect("valid");
    let (pw, ps) = (whole.init_params(8), split.init_params(8));
    // Units of the split model: [wte[0..10] + wpe, wte[10..20], wte[20..30], wte[30..32],
    // h.0, h.1, ln_f]; of the whole one: [wte + wpe, h.0, h.1, ln_f].
    let c = whole_cfg.n_embd;
    let join = |u: &[Vec<f32>]| -> Vec<f32> {
        let mut wte = u[0][..10 * c].to_vec();
        (1..4).for_each(|k| wte.extend_from_slice(&u[k]));
        wte.extend_from_slice(&u[0][10 * c..]);
        wte.extend(u[4..].iter().flatten());
        wte
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let flat_whole: Vec<f32> = pw.iter().flatten().copied().collect();
    assert_eq!(bits(&join(&ps)), bits(&flat_whole), "initial values");
    let (mut gw, mut gs) = (whole.zero_grads(), split.zero_grads());
    let lw = on.fb(&mut whole, &bt, &pw, &mut gw, scale);
    let ls = on.fb(&mut split, &bt, &ps, &mut gs, scale);
    // Each logit is the same dot product: the losses agree to f64 rounding of the mean.
    assert!((lw - ls).abs() <= 1e-12 * lw.abs(), "loss {lw} vs {ls}");
    let (gw, gs) = (gw.concat(), join(&gs));
    // f32 rounding of sums over V = 32 blocks' terms in another grouping: 1e-5 of the
    // largest gradient is ~100x the expected difference, and any missing term fails.
    let tol = 1e-5 * max_abs(&gw.iter().map(|&x| x as f64).collect::<Vec<_>>());
    for (i, (a, b)) in gw.iter().zip(&gs).enumerate() {
        assert!((a - b).abs() as f64 <= tol, "element {i}: {a:e} vs {b:e}");
    }
}

fn gradcheck(cfg: GptConfig, rows: usize) {
    let on = host();
    let mut model = Gpt::<HostDevice, f64>::new(&on.dev, cfg, rows).expect("config is valid");
    let io = batch_tokens(&cfg, rows, 3);
    let bt = batch(&cfg, rows, &io);
    let mut params = rough_params(&model);
    let mut grads = model.zero_grads();
    let scale = 1.0 / (rows * cfg.max_seq_len) as f64;
    on.fb(&mut model, &bt, &params, &mut grads, scale);
    let spec = cfg.spec();
    let h = 1e-5;
    let mut checked = 0;
    for (u, unit) in spec.units.iter().enumerate() {
        for (p, off) in unit.params.iter().zip(unit.offsets()) {
            let mut max_g = 0.0f64;
            for i in off..off + p.numel() {
                let x = params[u][i];
                params[u][i] = x + h;
                let lp = on.fwd(&mut model, &bt, &params);
                params[u][i] = x - h;
                let lm = on.fwd(&mut model, &bt, &params);
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
    let on = host();
    let mut m64 = Gpt::<HostDevice, f64>::new(&on.dev, cfg, B).expect("valid");
    let mut m32 = Gpt::<HostDevice, f32>::new(&on.dev, cfg, B).expect("valid");
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
    let l64 = on.fb(&mut m64, &bt, &p64, &mut g64, scale);
    let l32 = on.fb(&mut m32, &bt, &p32, &mut g32, scale as f32);
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
    let on = host();
    let mut model = Gpt::<HostDevice, f32>::new(&on.dev, cfg, B).expect("valid");
    let params = model.init_params(1);
    let io = batch_tokens(&cfg, B, 11);
    let loss = on.fwd(&mut model, &batch(&cfg, B, &io), &params);
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
    let on = host();
    let mut model = Gpt::<HostDevice, f32>::new(&on.dev, cfg, B).expect("valid");
    let mut params = model.init_params(42);
    let io = batch_tokens(&cfg, B, 13);
    let bt = batch(&cfg, B, &io);
    let (mut m, mut v) = (model.zero_grads(), model.zero_grads());
    let scale = 1.0 / (B * cfg.max_seq_len) as f32;
    let mut first = f64::NAN;
    let mut last = f64::NAN;
    for step in 1..=300 {
        let mut grads = model.zero_grads();
        last = on.fb(&mut model, &bt, &params, &mut grads, scale);
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
        let on = host();
        let mut model = Gpt::<HostDevice, f32>::new(&on.dev, cfg, B).expect("valid");
        let params = model.init_params(seed);
        let mut grads = model.zero_grads();
        let io = batch_tokens(&cfg, B, 17);
        let loss = on.fb(&mut model, &batch(&cfg, B, &io), &params, &mut grads, 0.01);
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
/// pass over per-unit buffers, on 1 and 2 GEMM threads.
#[test]
fn layer_by_layer_with_separate_unit_buffers_is_bitwise_one_pass() {
    let mut cfg = tiny();
    cfg.n_embd = 64;
    cfg.n_head = 4;
    cfg.max_seq_len = 96; // two attention bands
    cfg.vocab_size = 96;
    layer_by_layer(cfg);
    // The table in three row blocks (40, 40, 16 rows).
    cfg.vocab_block_rows = Some(40);
    layer_by_layer(cfg);
}

fn layer_by_layer(cfg: GptConfig) {
    let rows = 4;
    let io = batch_tokens(&cfg, rows, 23);
    let bt = batch(&cfg, rows, &io);
    let scale = 1.0 / (rows * cfg.max_seq_len) as f32;

    let on = host();
    let mut reference = Gpt::<HostDevice, f32>::new(&on.dev, cfg, rows).expect("valid");
    let spec = reference.spec().clone();
    let params = reference.init_params(3);
    let mut want_grads = reference.zero_grads();
    let want_loss = on.fb(&mut reference, &bt, &params, &mut want_grads, scale);

    for threads in [1, 2] {
        let on = On::new(HostDevice::with_threads(threads));
        let cx = on.cx();
        let mut model = Gpt::<HostDevice, f32>::new(&on.dev, cfg, rows).expect("valid");
        const PAD: usize = 5;
        let gather = |u: usize| {
            let mut v = vec![f32::NAN; spec.units[u].numel() + PAD];
            reference.init_unit(3, u, &mut v);
            let mut b = on.dev.alloc::<f32>(v.len(), "gathered").expect("alloc");
            on.dev.upload(&on.stream, &v, b.view_mut()).expect("upload");
            b
        };
        let zeros: Vec<Vec<f32>> = spec
            .units
            .iter()
            .map(|u| vec![0f32; u.numel() + PAD])
            .collect();
        let mut grads = upload_units(cx, &zeros, "grad").expect("upload");
        model.begin_micro_step(cx, &bt).expect("valid");
        for (l, layer) in spec.layers.iter().enumerate() {
            let owned: Vec<_> = layer.units.iter().map(|&u| gather(u)).collect();
            let p: Vec<UnitParams<'_, HostDevice>> = layer
                .units
                .iter()
                .zip(&owned)
                .map(|(&u, b)| UnitParams::new(&spec.units[u], b.view()))
                .collect();
            model.forward_layer(cx, l, &p).expect("valid");
        }
        let mut loss = [0f32];
        on.dev
            .download(&on.stream, model.loss(), &mut loss)
            .expect("download");
        assert_eq!(loss[0].to_bits(), (want_loss as f32).to_bits());
        for (l, layer) in spec.layers.iter().enumerate().rev() {
            // A lookup's backward takes no parameters (LayerSpec::backward_units).
            let read = layer.backward_units();
            let owned: Vec<_> = read.iter().map(|&u| gather(u)).collect();
            let p: Vec<UnitParams<'_, HostDevice>> = read
                .iter()
                .zip(&owned)
                .map(|(&u, b)| UnitParams::new(&spec.units[u], b.view()))
                .collect();
            let mut g = layer_grads(&spec, layer, &mut grads);
            // The engine's weight is the loss's; the model divides by B x T.
            model
                .backward_layer(cx, l, &p, &mut g, scale * (rows * cfg.max_seq_len) as f32)
                .expect("valid");
        }
        let got = download_units(cx, &grads).expect("download");
        for (u, unit) in spec.units.iter().enumerate() {
            let want = &want_grads[u];
            let g = &got[u][..unit.numel()];
            assert!(
                want.iter().zip(g).all(|(a, b)| a.to_bits() == b.to_bits()),
                "unit {} differs on {threads} threads",
                unit.name
            );
            assert!(
                got[u][unit.numel()..].iter().all(|&x| x == 0.0),
                "padding was written"
            );
        }
    }
}

/// The simulated device (queued, interleaved, hazard-checked) computes the host device's
/// bits: the model's ops are ordered correctly on one stream.
#[test]
fn simulated_device_gives_the_host_bits() {
    simulated_equals_host(tiny());
    simulated_equals_host(tiny_split());
}

fn simulated_equals_host(cfg: GptConfig) {
    let io = batch_tokens(&cfg, B, 31);
    let bt = batch(&cfg, B, &io);
    let h = host();
    let mut m = Gpt::<HostDevice, f32>::new(&h.dev, cfg, B).expect("valid");
    let params = m.init_params(4);
    let mut want = m.zero_grads();
    let want_loss = h.fb(&mut m, &bt, &params, &mut want, 0.01);
    for seed in [1, 2] {
        let s = On::new(SimDevice::new(seed));
        let mut m = Gpt::<SimDevice, f32>::new(&s.dev, cfg, B).expect("valid");
        let mut got = m.zero_grads();
        let loss = s.fb(&mut m, &bt, &params, &mut got, 0.01);
        assert_eq!(loss.to_bits(), want_loss.to_bits());
        let bits = |v: &[Vec<f32>]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "seed {seed}");
        assert!(s.dev.ops_run() > 50);
    }
}

/// Every instruction-set level the CPU has computes the same bits (the model's ops are
/// compiled per level; none reorders a float operation), on one and on two threads.
#[test]
fn every_isa_level_gives_the_same_bits() {
    for cfg in [tiny(), tiny_split()] {
        let io = batch_tokens(&cfg, B, 43);
        let bt = batch(&cfg, B, &io);
        let mut want = None;
        for isa in Isa::available() {
            for threads in [1, 2] {
                let exec = Exec::default()
                    .with_isa(isa)
                    .and_then(|e| e.with_threads(threads));
                let on = On::new(HostDevice::with_exec(exec.expect("available"), threads));
                let mut m = Gpt::<HostDevice, f32>::new(&on.dev, cfg, B).expect("valid");
                let params = m.init_params(8);
                let mut grads = m.zero_grads();
                let loss = on.fb(&mut m, &bt, &params, &mut grads, 0.01);
                let bits: Vec<u32> = grads.iter().flatten().map(|x| x.to_bits()).collect();
                let got = (loss.to_bits(), bits);
                match &want {
                    None => want = Some(got),
                    Some(w) => assert!(*w == got, "{isa} on {threads} thread(s) differs"),
                }
            }
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
    let small = TokenBatch {
        rows,
        seq_len: t,
        inputs: x,
        targets: y,
    };
    let run = |max_rows: usize| {
        let on = host();
        let mut model = Gpt::<HostDevice, f32>::new(&on.dev, cfg, max_rows).expect("valid");
        let params = model.init_params(9);
        let mut grads = model.zero_grads();
        let loss = on.fb(&mut model, &small, &params, &mut grads, 0.1);
        let bits: Vec<u32> = grads.iter().flatten().map(|g| g.to_bits()).collect();
        (loss.to_bits(), bits)
    };
    assert_eq!(run(2), run(7));
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let cfg = tiny();
    let on = host();
    let cx = on.cx();
    let mut model = Gpt::<HostDevice, f32>::new(&on.dev, cfg, B).expect("valid");
    let params = upload_units(cx, &model.init_params(1), "p").expect("upload");
    let spec = model.spec().clone();
    let mut io = batch_tokens(&cfg, B, 1);
    io.0[3] = cfg.vocab_size as u32;
    assert!(
        model.begin_micro_step(cx, &batch(&cfg, B, &io)).is_err(),
        "token >= V"
    );
    let io = batch_tokens(&cfg, B, 1);
    model
        .begin_micro_step(cx, &batch(&cfg, B, &io))
        .expect("valid");
    let unit = |u: usize| UnitParams::new(&spec.units[u], params[u].view());
    assert!(
        model.forward_layer(cx, 1, &[unit(1)]).is_err(),
        "out of order"
    );
    let short = UnitParams::new(&spec.units[0], params[0].slice(0..10));
    assert!(model.forward_layer(cx, 0, &[short]).is_err(), "short view");
    let big = (0..3 * cfg.max_seq_len).map(|_| 0u32).collect::<Vec<_>>();
    let too_many_rows = TokenBatch {
        rows: 3,
        seq_len: cfg.max_seq_len,
        inputs: &big,
        targets: &big,
    };
    assert!(
        model.begin_micro_step(cx, &too_many_rows).is_err(),
        "B above the arena"
    );

    // The embedding's backward reads no parameter: it takes none, and parameters passed
    // to it are a bad call (the engine never gathers them for it at stage 3).
    assert!(!spec.layers[0].backward_reads_params && spec.layers[1].backward_reads_params);
    model
        .begin_micro_step(cx, &batch(&cfg, B, &io))
        .expect("valid");
    let zeros: Vec<Vec<f32>> = spec.units.iter().map(|u| vec![0f32; u.numel()]).collect();
    let mut grads = upload_units(cx, &zeros, "g").expect("upload");
    for (l, layer) in spec.layers.iter().enumerate() {
        let p: Vec<_> = layer.units.iter().map(|&u| unit(u)).collect();
        model.forward_layer(cx, l, &p).expect("valid");
    }
    for (l, layer) in spec.layers.iter().enumerate().rev() {
        let p: Vec<_> = layer.backward_units().iter().map(|&u| unit(u)).collect();
        let mut g = layer_grads(&spec, layer, &mut grads);
        if l == 0 {
            let wrong = [unit(0)];
            let err = model.backward_layer(cx, 0, &wrong, &mut g, 1.0);
            assert!(
                matches!(err, Err(zero_core::ModelError::BadCall(_))),
                "a lookup given parameters"
            );
        }
        model.backward_layer(cx, l, &p, &mut g, 1.0).expect("valid");
    }
}
