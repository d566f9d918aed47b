//! `zero-bench micro model`: GPT-2 or Llama forward + backward on the CPU, as tokens/s and
//! achieved FLOP/s, next to SGEMM FLOP/s measured in the same process on the same thread
//! count (the model's MLP up-projection shape, and a square one). FLOPs per token are
//! `6 * (matmul weights) + 12 * L * C * T` (nanoGPT's `estimate_mfu`; see
//! `GptConfig::flops_per_token`, `LlamaConfig::flops_per_token`).

use anyhow::Context;
use std::time::Instant;
use zero_core::model::Compute;
use zero_kernels::device::Buffer;
use zero_kernels::device::{Device, HostDevice};
use zero_models::gemm::{Gemm, Lay};
use zero_models::init::SplitMix64;
use zero_models::LayeredLm;
use zero_models::{upload_units, Gpt, Llama, ModelPreset, TokenBatch as Batch};

use crate::logging::outln;

/// Options of `micro model`.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    /// Model preset (tiny, small, gpt2-124m, ..., llama-tiny, llama2-7b, ...).
    #[arg(long, default_value = "small")]
    preset: String,
    /// B: rows per micro-batch.
    #[arg(long, default_value_t = 4)]
    rows: usize,
    /// T: sequence length (default: the preset's maximum).
    #[arg(long)]
    seq_len: Option<usize>,
    /// GEMM threads (one MPI rank is one process; 1 is what a rank per core uses), 1 to
    /// 1024.
    #[arg(long, default_value_t = 1, value_parser = crate::train::thread_count)]
    threads: usize,
    /// Timed forward+backward steps (after one warm-up step).
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Matrix products with bf16 operands and f32 sums (what `precision = "bf16"`
    /// trains with: AMX, else AVX-512 BF16, else AVX2, where the CPU has it;
    /// `ZERO_BF16_KERNEL=amx|avx512|avx2|portable` forces one), the model and the
    /// reference GEMM alike.
    #[arg(long)]
    bf16: bool,
}

/// Wall and process-CPU seconds since an arbitrary origin. CPU time counts only the time
/// this process ran, so on a shared, oversubscribed machine it stays close to the
/// uncontended time where wall time does not.
fn now() -> (Instant, f64) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec passed; the clock exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    let cpu = if rc == 0 {
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    } else {
        f64::NAN
    };
    (Instant::now(), cpu)
}

/// The fastest (wall, CPU) seconds seen over several timings.
#[derive(Clone, Copy)]
struct Best {
    wall: f64,
    cpu: f64,
}

impl Best {
    fn new() -> Self {
        Best {
            wall: f64::INFINITY,
            cpu: f64::INFINITY,
        }
    }

    fn keep(&mut self, start: (Instant, f64)) {
        let end = now();
        self.wall = self.wall.min((end.0 - start.0).as_secs_f64());
        self.cpu = self.cpu.min(end.1 - start.1);
    }

    /// (wall, CPU) rate of `work` per second, in units of 1e9.
    fn giga(&self, work: f64) -> (f64, f64) {
        (work / self.wall / 1e9, work / self.cpu / 1e9)
    }
}

/// One SGEMM shape, with its buffers: C = A B^T with B stored [n, k], as the model's
/// linear layers compute.
struct Sgemm {
    m: usize,
    k: usize,
    n: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    best: Best,
}

impl Sgemm {
    fn new(m: usize, k: usize, n: usize) -> Self {
        let mut rng = SplitMix64::new(1);
        Sgemm {
            m,
            k,
            n,
            a: (0..m * k).map(|_| rng.next_normal() as f32).collect(),
            b: (0..n * k).map(|_| rng.next_normal() as f32).collect(),
            c: vec![0f32; m * n],
            best: Best::new(),
        }
    }

    /// Time `reps` calls, keeping the fastest.
    fn time(&mut self, g: &Gemm, reps: usize) {
        let (m, k, n) = (self.m, self.k, self.n);
        for _ in 0..reps {
            let t0 = now();
            g.run(
                1.0,
                &self.a,
                Lay::rm(m, k, k),
                &self.b,
                Lay::rm(n, k, k).t(),
                0.0,
                &mut self.c,
                Lay::rm(m, n, n),
            );
            self.best.keep(t0);
        }
    }

    /// (wall, CPU) GFLOP/s.
    fn gflops(&self) -> (f64, f64) {
        self.best.giga(2.0 * (self.m * self.n * self.k) as f64)
    }
}

/// The model under test, of either family.
enum Net {
    Gpt(Gpt<HostDevice, f32>),
    Llama(Llama<HostDevice, f32>),
}

impl Net {
    fn init_params(&self, seed: u64) -> Vec<Vec<f32>> {
        match self {
            Net::Gpt(m) => m.init_params(seed),
            Net::Llama(m) => m.init_params(seed),
        }
    }

    fn zero_grads(&self) -> Vec<Vec<f32>> {
        match self {
            Net::Gpt(m) => m.zero_grads(),
            Net::Llama(m) => m.zero_grads(),
        }
    }

    fn arena_bytes(&self) -> usize {
        match self {
            Net::Gpt(m) => m.arena_bytes(),
            Net::Llama(m) => m.arena_bytes(),
        }
    }

    fn forward_backward<B: Buffer<Elem = f32>>(
        &mut self,
        cx: Compute<'_, HostDevice>,
        batch: &Batch<'_>,
        params: &[B],
        grads: &mut [B],
        scale: f32,
    ) -> anyhow::Result<f64>
    where
        HostDevice: Device<Buf<f32> = B>,
    {
        Ok(match self {
            Net::Gpt(m) => m.forward_backward(cx, batch, params, grads, scale)?,
            Net::Llama(m) => m.forward_backward(cx, batch, params, grads, scale)?,
        })
    }
}

/// Run the benchmark.
pub fn run(args: &ModelArgs) -> anyhow::Result<()> {
    crate::logging::init(None);
    let cfg = ModelPreset::lookup(&args.preset).context("choosing the model")?;
    let ctx = cfg.max_seq_len();
    let t = args.seq_len.unwrap_or(ctx);
    anyhow::ensure!(
        (1..=ctx).contains(&t),
        "--seq-len {t} must be in 1..={ctx} for preset {}",
        args.preset
    );
    anyhow::ensure!(args.steps > 0, "--steps must be > 0");
    let b = args.rows;
    // A bad or unavailable ZERO_BF16_KERNEL is an error here, not a logged fallback.
    let bf16_kernel = zero_kernels::nn::gemm_bf16::Bf16Kernel::from_env()?
        .unwrap_or_else(zero_kernels::nn::gemm_bf16::Bf16Kernel::best);
    // The host device, its GEMMs on --threads threads (the model runs its ops on it).
    let dev = HostDevice::with_threads(args.threads);
    dev.set_bf16_products(args.bf16);
    let stream = dev.stream("compute")?;
    let cx = Compute {
        dev: &dev,
        stream: &stream,
    };
    // (C, the MLP's hidden width, a description of the shape.)
    let (c, hidden, shape_text) = match cfg {
        ModelPreset::Gpt(g) => (
            g.n_embd,
            4 * g.n_embd,
            format!(
                "V={} L={} H={} C={}",
                g.vocab_size, g.n_layer, g.n_head, g.n_embd
            ),
        ),
        ModelPreset::Llama(l) => (
            l.n_embd,
            l.ffn_hidden,
            format!(
                "V={} L={} H={} Hkv={} C={} F={}",
                l.vocab_size, l.n_layer, l.n_head, l.n_kv_head, l.n_embd, l.ffn_hidden
            ),
        ),
    };
    let mut model = match cfg {
        ModelPreset::Gpt(g) => {
            let m = Gpt::<HostDevice, f32>::new(&dev, g, b).context("building the model")?;
            Net::Gpt(m.with_init_threads(dev.threads()))
        }
        ModelPreset::Llama(l) => {
            let m = Llama::<HostDevice, f32>::new(&dev, l, b).context("building the model")?;
            Net::Llama(m.with_init_threads(dev.threads()))
        }
    };
    let params = upload_units(cx, &model.init_params(1), "param")?;
    let mut grads = upload_units(cx, &model.zero_grads(), "grad")?;
    let mut rng = SplitMix64::new(2);
    let v = cfg.vocab_size() as u64;
    let inputs: Vec<u32> = (0..b * t).map(|_| (rng.next_u64() % v) as u32).collect();
    let targets: Vec<u32> = (0..b * t).map(|_| (rng.next_u64() % v) as u32).collect();
    let batch = Batch {
        rows: b,
        seq_len: t,
        inputs: &inputs,
        targets: &targets,
    };
    let scale = 1.0 / (b * t) as f32;
    // The machine may be shared: model steps and SGEMM calls are interleaved and the
    // fastest of each is kept, so both see the same conditions and the ratio is of
    // uncontended times.
    let g = Gemm::new(args.threads).with_bf16_operands(args.bf16);
    let gemm_name = if args.bf16 { "bf16 GEMM" } else { "SGEMM" };
    let mut shape = Sgemm::new(b * t, c, hidden);
    let mut square = Sgemm::new(1024, 1024, 1024);
    let mut best = Best::new();
    let mut loss = 0.0;
    let mut progress = super::Progress::new("micro model");
    for i in 0..=args.steps {
        let t0 = now();
        loss = model
            .forward_backward(cx, &batch, &params, &mut grads, scale)
            .context("forward+backward")?;
        if i > 0 {
            best.keep(t0);
        }
        shape.time(&g, 3);
        square.time(&g, 1);
        progress.done(i, args.steps, "steps (after a warm-up step)");
    }
    let tokens = (b * t) as f64;
    let model_gf = best.giga(cfg.flops_per_token(t) * tokens);
    let (shape_gf, square_gf) = (shape.gflops(), square.gflops());
    let ratio = |i: usize| {
        let pick = |x: (f64, f64)| if i == 0 { x.0 } else { x.1 };
        pick(model_gf) / pick(shape_gf).max(pick(square_gf))
    };

    outln!(
        "model {} ({shape_text}, {} params), B={b} T={t}, {} thread(s), {} products, activation arena {:.1} MiB",
        args.preset,
        cfg.num_params(),
        args.threads,
        if args.bf16 {
            format!("bf16-operand ({bf16_kernel} kernel; attention's stay f32)")
        } else {
            "f32".to_string()
        },
        model.arena_bytes() as f64 / (1 << 20) as f64
    );
    outln!(
        "flops/token = 6*(matmul weights) + 12*L*C*T = {:.4e}; fastest of {} steps",
        cfg.flops_per_token(t),
        args.steps
    );
    // Process CPU time sums every thread, but GEMM worker threads are short-lived and
    // their time is not reliably counted by the time the call returns: show it for one
    // thread only.
    let one = args.threads == 1;
    let row = |label: &str, wall: f64, cpu: f64, prec: usize| {
        let cpu = if one {
            format!("{cpu:.prec$}")
        } else {
            "n/a".to_string()
        };
        outln!("{label:<42} {wall:>12.prec$} {cpu:>12}");
    };
    outln!("{:<42} {:>12} {:>12}", "measure", "wall", "cpu-time");
    row("step fwd+bwd (s)", best.wall, best.cpu, 4);
    row("tokens/s", tokens / best.wall, tokens / best.cpu, 0);
    row("model GFLOP/s (fwd+bwd)", model_gf.0, model_gf.1, 1);
    let label = format!("{gemm_name} GFLOP/s {}x{c}x{hidden} (MLP up shape)", b * t);
    row(&label, shape_gf.0, shape_gf.1, 1);
    let label = format!("{gemm_name} GFLOP/s 1024x1024x1024");
    row(&label, square_gf.0, square_gf.1, 1);
    row(&format!("model / best {gemm_name}"), ratio(0), ratio(1), 3);
    outln!("loss of the batch (sanity, ~ln V at init): {loss:.4}");
    Ok(())
}
