//! Llama correctness on `llama-tiny` (H = 4 query heads sharing Hkv = 2 key/value
//! heads): backward against central finite differences in f64 for every element of every
//! parameter tensor; the simulated device giving the host device's bits; loss at init
//! ~ ln V; the published shapes' parameter counts.

use zero_core::model::Compute;
use zero_kernels::device::{Device, HostDevice, Scalar, SimDevice};
use zero_models::init::SplitMix64;
use zero_models::LayeredLm;
use zero_models::{download_units, upload_units, Llama, LlamaConfig, ModelPreset, TokenBatch};

const B: usize = 2;

/// `llama-tiny` at T = 8: a gradient check runs two forwards per parameter.
fn tiny() -> LlamaConfig {
    LlamaConfig {
        max_seq_len: 8,
        ..LlamaConfig::preset("llama-tiny").expect("llama-tiny is a preset")
    }
}

fn batch_tokens(cfg: &LlamaConfig, rows: usize, seed: u64) -> (Vec<u32>, Vec<u32>) {
    let mut g = SplitMix64::new(seed);
    let n = rows * cfg.max_seq_len;
    let v = cfg.vocab_size as u64;
    let inputs = (0..n).map(|_| (g.next_u64() % v) as u32).collect();
    let targets = (0..n).map(|_| (g.next_u64() % v) as u32).collect();
    (inputs, targets)
}

fn batch<'a>(cfg: &LlamaConfig, rows: usize, io: &'a (Vec<u32>, Vec<u32>)) -> TokenBatch<'a> {
    TokenBatch {
        rows,
        seq_len: cfg.max_seq_len,
        inputs: &io.0,
        targets: &io.1,
    }
}

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
    fn fb<F: Scalar>(
        &self,
        model: &mut Llama<D, F>,
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
        model: &mut Llama<D, F>,
        batch: &TokenBatch<'_>,
        params: &[Vec<F>],
    ) -> f64 {
        let p = upload_units(self.cx(), params, "p").expect("upload");
        model.forward_all(self.cx(), batch, &p).expect("valid call")
    }
}

/// Init, then perturb every parameter by N(0, 0.2) so the norm weights and every path
/// carry non-trivial gradients.
fn rough_params<D: Device>(model: &Llama<D, f64>) -> Vec<Vec<f64>> {
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

/// Multi-head attention (Hkv = H) and a single key/value head (Hkv = 1), Llama 3's theta.
#[test]
fn backward_matches_central_differences_f64_mha_and_one_kv_head() {
    for kv in [4, 1] {
        let cfg = LlamaConfig {
            n_kv_head: kv,
            n_layer: 1,
            max_seq_len: 6,
            rope_theta: 500_000.0,
            ..tiny()
        };
        gradcheck(cfg, 1);
    }
}

/// `llama-tiny` with its 64-row tables in blocks of 20, 20, 20 and 4 rows: three more
/// lookup layers, three more logits layers, six more units.
fn tiny_split() -> LlamaConfig {
    LlamaConfig {
        vocab_block_rows: Some(20),
        ..tiny()
    }
}

#[test]
fn backward_matches_central_differences_f64_with_the_tables_in_row_blocks() {
    let cfg = tiny_split();
    assert_eq!(cfg.vocab_blocks(), vec![0..20, 20..40, 40..60, 60..64]);
    assert_eq!(cfg.spec().units.len(), 4 + cfg.n_layer + 4);
    assert_eq!(cfg.spec().layers.len(), 4 + cfg.n_layer + 4);
    gradcheck(cfg, B);
}

/// Splitting the tables changes no value: the blocks hold the whole tables' initial rows,
/// and the loss and gradients agree with the unsplit model's (the head's input gradient
/// is summed block by block: f32 rounding).
#[test]
fn the_tables_in_row_blocks_are_the_same_model() {
    let (whole_cfg, split_cfg) = (tiny(), tiny_split());
    let on = On::new(HostDevice::new());
    let io = batch_tokens(&whole_cfg, B, 41);
    let bt = batch(&whole_cfg, B, &io);
    let mut whole = Llama::<HostDevice, f32>::new(&on.dev, whole_cfg, B).expect("valid");
    let mut split = Llama::<HostDevice, f32>::new(&on.dev, split_cfg, B).expect("valid");
    let (pw, ps) = (whole.init_params(8), split.init_params(8));
    // Split units: [emb 0..20, emb 20..40, emb 40..60, emb 60..64, layers.0, layers.1,
    // norm + out 0..20, out 20..40, out 40..60, out 60..64]; whole: [emb, layers.*, norm + out].
    let join = |u: &[Vec<f32>]| -> Vec<f32> { u.concat() };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&join(&ps)), bits(&join(&pw)), "initial values");
    let (mut gw, mut gs) = (whole.zero_grads(), split.zero_grads());
    let scale = 1.0 / (B * whole_cfg.max_seq_len) as f32;
    let lw = on.fb(&mut whole, &bt, &pw, &mut gw, scale);
    let ls = on.fb(&mut split, &bt, &ps, &mut gs, scale);
    assert!((lw - ls).abs() <= 1e-12 * lw.abs(), "loss {lw} vs {ls}");
    let (gw, gs) = (join(&gw), join(&gs));
    // f32 sums of V = 64 terms in another grouping: 1e-5 of the largest gradient.
    let tol = 1e-5 * gw.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    for (i, (a, b)) in gw.iter().zip(&gs).enumerate() {
        assert!((a - b).abs() <= tol, "element {i}: {a:e} vs {b:e}");
    }
}

fn gradcheck(cfg: LlamaConfig, rows: usize) {
    let on = On::new(HostDevice::new());
    let mut model = Llama::<HostDevice, f64>::new(&on.dev, cfg, rows).expect("valid config");
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
                // As GPT-2's check (zero-models/tests/model.rs): truncation and rounding
                // ~1e-10, so 1e-7 + 1e-5 relative fails only on a wrong term.
                assert!(
                    (an - fd).abs() <= 1e-7 + 1e-5 * fd.abs(),
                    "{}[{}]: analytic {an:e} vs finite difference {fd:e}",
                    p.name,
                    i - off
                );
                max_g = max_g.max(an.abs());
                checked += 1;
            }
            assert!(max_g > 1e-6, "{}: gradient is all ~0 ({max_g:e})", p.name);
        }
    }
    assert_eq!(checked, cfg.num_params());
}

/// The simulated device (ops queued, interleaved by seed, accesses checked) computes the
/// host device's bits.
#[test]
fn simulated_device_gives_the_host_bits() {
    simulated_equals_host(tiny());
    simulated_equals_host(tiny_split());
}

fn simulated_equals_host(cfg: LlamaConfig) {
    let io = batch_tokens(&cfg, B, 31);
    let bt = batch(&cfg, B, &io);
    let h = On::new(HostDevice::new());
    let mut m = Llama::<HostDevice, f32>::new(&h.dev, cfg, B).expect("valid");
    let params = m.init_params(4);
    let mut want = m.zero_grads();
    let want_loss = h.fb(&mut m, &bt, &params, &mut want, 0.01);
    for seed in [1, 2] {
        let s = On::new(SimDevice::new(seed));
        let mut m = Llama::<SimDevice, f32>::new(&s.dev, cfg, B).expect("valid");
        let mut got = m.zero_grads();
        let loss = s.fb(&mut m, &bt, &params, &mut got, 0.01);
        assert_eq!(loss.to_bits(), want_loss.to_bits());
        let bits = |v: &[Vec<f32>]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "seed {seed}");
    }
}

#[test]
fn loss_at_init_is_close_to_ln_vocab() {
    let cfg = tiny();
    let on = On::new(HostDevice::new());
    let mut m = Llama::<HostDevice, f32>::new(&on.dev, cfg, B).expect("valid");
    let io = batch_tokens(&cfg, B, 5);
    let params = m.init_params(1);
    let loss = on.fwd(&mut m, &batch(&cfg, B, &io), &params);
    let want = (cfg.vocab_size as f64).ln();
    assert!((loss - want).abs() < 0.1, "loss {loss} vs ln V {want}");
}

/// Parameter counts of the published shapes (Meta's model cards: 6.74B, 13.0B, 69.0B,
/// 8.03B, 70.6B), and the aliases.
#[test]
fn published_shapes_have_their_parameter_counts() {
    for (name, want) in [
        ("llama2-7b", 6_738_415_616usize),
        ("llama2-13b", 13_015_864_320),
        ("llama2-70b", 68_976_648_192),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama-7b", 6_738_415_616),
        ("llama-70b", 68_976_648_192),
        ("llama3-70b", 70_553_706_496),
    ] {
        let m = ModelPreset::lookup(name).expect("preset");
        m.validate().expect("valid");
        assert_eq!(m.num_params(), want, "{name}");
        assert_eq!(m.spec().numel(), want, "{name}");
    }
    let theta = |n| match ModelPreset::lookup(n) {
        Ok(ModelPreset::Llama(l)) => l.rope_theta,
        _ => panic!("{n} is a Llama preset"),
    };
    assert_eq!((theta("llama2-7b"), theta("llama3-8b")), (1e4, 5e5));
    // One block's worth of rows per table unit: Llama 2's 32000 rows stay whole, Llama 3's
    // 128256 split (so no unit outgrows a transformer block).
    for (name, blocks) in [
        ("llama2-7b", 1),
        ("llama2-70b", 1),
        ("llama3-8b", 3),
        ("llama3-70b", 2),
    ] {
        let Ok(ModelPreset::Llama(l)) = ModelPreset::lookup(name) else {
            panic!("{name}")
        };
        assert_eq!(l.vocab_blocks().len(), blocks, "{name}");
        let spec = l.spec();
        let block = spec.units[l.vocab_blocks().len()].numel();
        assert!(
            spec.units.iter().all(|u| u.numel() <= block + l.n_embd),
            "{name}"
        );
    }
}
