//! Command-line options of `zero-bench train` and how they become configuration
//! overrides: every convenience flag (`--stage`, `--precision`, ...) is a `--set
//! section.key=value` in disguise, so the printed provenance says "command line" for it
//! and zero-core's loader validates it like any other value.

use std::path::PathBuf;

use clap::Args;
use zero_core::config::Stage;

/// Options of `zero-bench train`.
#[derive(Args, Debug, Clone)]
#[command(after_long_help = EXAMPLES)]
// What saves checkpoints: --ckpt-dir, or --resume (which goes on saving where it resumed).
#[command(group(clap::ArgGroup::new("saves").multiple(true).args(["ckpt_dir", "resume"])))]
pub struct TrainArgs {
    /// TOML configuration file (sections `[model]`, `[data]`, `[train]`, `[zero]`,
    /// `[precision]`, `[optim]`, `[divergence]`; every key has a default, so the file is
    /// optional).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Override one configuration value; repeatable. The value is read as TOML (2, true,
    /// 1e-3, [0.9, 0.95], "text"); a bare word is taken as a string.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,

    /// ZeRO stage 0-3, or `auto`: the lowest stage whose memory plan fits the budget
    /// (--mem-limit, else this node's available memory shared by its ranks, minus
    /// --mem-headroom); rank 0 prints the decision and the alternatives
    /// (= --set zero.stage=N / --set zero.stage='"auto"').
    #[arg(long, value_name = "N|auto", conflicts_with = "stages", value_parser = parse_stage_setting)]
    pub stage: Option<StageSetting>,

    /// Memory each rank may plan for: 12GiB, 500MB (KiB/MiB/GiB = 1024, kB/MB/GB = 1000),
    /// or `none` for no limit. Default: this node's available memory (the smaller of
    /// MemAvailable and what this process's memory cgroup, or one above it, leaves: limit
    /// minus usage less the inactive page cache, so a Slurm job's --mem counts) divided by
    /// the ranks on it.
    /// A run whose plan exceeds it stops before allocating, saying what would fit.
    #[arg(long, value_name = "SIZE|none", value_parser = parse_mem_limit)]
    pub mem_limit: Option<MemLimit>,

    /// Share of the budget kept free for what the ledger does not hold (the program,
    /// MPI's buffers, the allocator): 10% or 0.1.
    #[arg(long, default_value = "10%", value_name = "FRACTION", value_parser = crate::plan::parse_fraction)]
    pub mem_headroom: f64,

    /// Run the same training once per listed stage, one after another in this process
    /// (fresh model and engine each), then print a table comparing them: step time
    /// relative to stage 0, tokens/s, per-rank memory, peak RSS, bytes communicated.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_stage)]
    pub stages: Vec<Stage>,

    /// Training precision: fp32, bf16 or fp16 (= --set precision.dtype=...).
    #[arg(long, value_name = "DTYPE")]
    pub precision: Option<String>,

    /// Optimizer steps (= --set train.steps=N).
    #[arg(long, value_name = "N")]
    pub steps: Option<usize>,

    /// Micro-batches accumulated per optimizer step (= --set train.grad_accum=A).
    #[arg(long, value_name = "A")]
    pub grad_accum: Option<usize>,

    /// Model preset, with its own dimensions (over a configuration's; --set model.KEY=...
    /// still changes one): tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b,
    /// llama-tiny, llama-small, llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b,
    /// llama-7b/13b/70b (= --set model.preset=NAME and its dimensions). Where the file and
    /// --set leave them, a preset shorter than the default train.seq_len (64) sets it to
    /// its context length, and one with fewer symbols than the built-in corpus (64) reads
    /// it with vocab_size 64: `--model tiny` runs as it is.
    #[arg(long, value_name = "PRESET")]
    pub model: Option<String>,

    /// Activation checkpointing: every K-th transformer block recomputes its activations
    /// in the backward instead of keeping them; 0 = off, 1 = every block
    /// (= --set model.checkpoint_every=K).
    #[arg(long, value_name = "K")]
    pub checkpoint_every: Option<usize>,

    /// Per-step metrics as JSON lines, written by rank 0 (= --set train.metrics_file=FILE).
    #[arg(long, value_name = "FILE", value_parser = crate::config::utf8_path)]
    pub metrics: Option<PathBuf>,

    /// Run the stage list this many times, interleaved (0,1,2,3,0,1,2,3,...), and average
    /// each stage's step time over the rounds, so that load changes on a shared machine
    /// fall on every stage alike. Ledgers, progress, metrics and peak RSS: first round.
    #[arg(long, default_value_t = 1, value_name = "R")]
    pub rounds: usize,

    /// Print the resolved configuration, the per-rank memory plan next to the ZeRO
    /// paper's formula with every difference explained, and the communication per step;
    /// allocate nothing and exit. Works without mpirun (see --world, --rank).
    #[arg(long)]
    pub dry_run: bool,

    /// Dry run outside MPI: the number of ranks to plan for (under mpirun/srun the real
    /// world size is used, and a different value here is an error).
    #[arg(long, value_name = "N", requires = "dry_run")]
    pub world: Option<usize>,

    /// Dry run: the rank whose plan is shown in full (every rank's total is shown when
    /// they differ).
    #[arg(long, value_name = "R", requires = "dry_run")]
    pub rank: Option<usize>,

    /// Start from the weights of a model file (the optimizer starts fresh): safetensors
    /// (`model.safetensors`, or a folder of shards with Hugging Face's
    /// `model.safetensors.index.json`; f32, f16 or bf16), with our names or Hugging Face
    /// GPT-2's (`wte.weight`, ..., Conv1D weights [in, out]) or Llama's
    /// (`model.embed_tokens.weight`, ..., `lm_head.weight`, which may be absent: tied), as
    /// `zero-bench ckpt export --safetensors [--names hf]` writes them; or a consolidated
    /// HDF5 file (one fp32
    /// dataset per tensor, named as docs/ARCHITECTURE.md lists them, e.g.
    /// `h.0.attn.c_attn.weight` [3C, C]), as `ckpt consolidate`, `--save-model` and h5py
    /// write them. Told apart by the path (a folder, `.safetensors`) and the file's first
    /// bytes. Every missing, misshaped or unreadable tensor is named before step 1.
    #[arg(long, value_name = "FILE|DIR")]
    pub init_from: Option<PathBuf>,

    /// After training, write the final fp32 weights to this HDF5 file in the consolidated
    /// layout (readable by --init-from and by h5py). With --stages: the last stage's weights.
    #[arg(long, value_name = "FILE.h5")]
    pub save_model: Option<PathBuf>,

    /// Save a sharded checkpoint (every rank its shard, atomically) into --ckpt-dir every
    /// N steps. Whatever N, --ckpt-dir always gets one after the last step, and one when
    /// SIGTERM or SIGUSR1 stops the run (then the exit status is 85). Under mpirun, signal
    /// mpirun (it forwards both to every rank) or the ranks: `timeout -s TERM mpirun ...`
    /// also signals mpirun's whole process group, and Open MPI then ends the ranks before
    /// they save (measured with 4.1.4); use `timeout --foreground` or `timeout -s USR1`.
    #[arg(long, default_value_t = 0, value_name = "N", requires = "saves")]
    pub save_every: u64,

    /// Root directory of the checkpoints (`step-<S>/` holds the state after step S,
    /// `latest` names the newest); on a filesystem every rank can write, checked before
    /// step 1. If the checkpoint after the last step cannot be saved, the run exits 1.
    #[arg(long, value_name = "DIR")]
    pub ckpt_dir: Option<PathBuf>,

    /// Checkpoints to keep in --ckpt-dir (the newest ones; at least 1).
    #[arg(long, default_value_t = 3, value_name = "K", requires = "saves")]
    pub keep_last: usize,

    /// Resume from a checkpoint: a root (its `latest`) or a `step-<S>` directory. Any
    /// world size and stage may load it (resharded on load); training continues with
    /// step S + 1 with the saved optimizer state (and loss scale, unless the precision
    /// changed: then the scaler starts from this run's configuration). --steps must be
    /// above S; --metrics keeps the file's lines up to step S and appends.
    /// With --init-from too, the checkpoint wins (it holds the trained weights; a
    /// requeued job script may pass both). Without --ckpt-dir, a root goes on saving
    /// into itself; a step directory saves nothing.
    #[arg(long, value_name = "DIR", conflicts_with = "stages")]
    pub resume: Option<PathBuf>,

    /// With --resume: go on although the global batch (ranks x grad_accum x micro_batch
    /// sequences of seq_len tokens) differs from the checkpoint's; the change is logged
    /// and recorded in the checkpoints that follow, and the data reads on from where the
    /// checkpoint's run had got to (each checkpoint records its data position). Without
    /// it such a resume is refused. Without --resume it has no effect.
    #[arg(long)]
    pub allow_batch_change: bool,

    /// Write the run summary (with --stages: the stage table; with --dry-run: the plans)
    /// as JSON here (rank 0).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,

    /// Threads each rank's kernels use (matrix products, attention, row-wise ops,
    /// AdamW), or `auto`: Slurm's --cpus-per-task where it is set, else this rank's
    /// share of the node, the CPUs it may run on (its affinity) but at most the node's
    /// CPUs for the job divided by its ranks (mpirun binds one core to each of 2 ranks
    /// by default: 1 thread; one process on 16 CPUs, hyperthreads counted: 16). Rank 0 logs the count.
    /// Keep ranks x threads <= cores: a warning says where they are not.
    #[arg(long, default_value = "auto", value_name = "K|auto", value_parser = parse_threads)]
    pub threads: ThreadsSetting,

    /// Wait for each collective where the engine issues it. By default (--device host,
    /// and sim-gpu with MPI or mpi-staged) the engine's MPI collectives are non-blocking
    /// calls left running while compute goes on, and the device polls them (MPI_Test)
    /// between the ops it runs, because Open MPI moves a host collective forward only
    /// inside MPI calls (a progress thread helps: ZERO_COMM_PROGRESS_US). The step is the
    /// same either way; the summary's overlap line says how much communication ran
    /// behind compute. On a CUDA device NCCL's collectives are queued on the GPU's
    /// stream, and the host waits for each host-staged one (`mpi-staged`) unless
    /// ZERO_CUDA_STAGED=overlap (the GPU's stream waits for it instead; not yet run on a
    /// GPU), which this flag overrides.
    #[arg(long)]
    pub no_overlap: bool,

    /// Where to compute: `host` (this CPU, --threads per rank); `cuda` (the GPU of this
    /// rank's node-local rank) or `cuda:N` (GPU N; a zero-bench built with the `cuda`
    /// feature; several ranks exchange GPU memory as --comm says; bf16 runs its products on
    /// tensor cores, and the memory guard budgets the GPU's free memory); `sim-gpu` (a
    /// test tool: the simulated GPU runs the CUDA kernels' CPU twins with CUDA's stream
    /// rules checked, on any number of ranks; slow, and its timings measure nothing).
    /// On both GPU devices ZERO_CUDA_ATTENTION=products runs attention as batched matrix
    /// products (cuBLAS on a GPU) instead of the default one-warp-per-row kernels.
    #[arg(long, default_value = "host", value_name = "DEVICE")]
    pub device: crate::device::DeviceChoice,

    /// How the engine's collectives travel between ranks: `auto` (host buffers: `mpi`;
    /// device buffers across processes: NCCL where built in, else CUDA-aware MPI where
    /// the run-time probe says yes and gradients are reduced in f32, else `mpi-staged`;
    /// one process: `local`), `nccl`,
    /// `mpi-cuda` (device pointers to a CUDA-aware MPI), `mpi-staged` (device buffers
    /// copied through host staging buffers around each collective: always works), `mpi`
    /// (host buffers) or `local` (one process). Rank 0 logs the choice and why; a
    /// backend asked for that cannot run here is an error saying what is missing.
    #[arg(long, default_value = "auto", value_name = "BACKEND")]
    pub comm: zero_comm::CommChoice,

    /// Plain log lines even when stderr is a terminal (no progress bar).
    #[arg(long)]
    pub no_progress: bool,
}

const EXAMPLES: &str = "\
Examples:
  # 4 ranks on this machine, the built-in corpus, every stage in turn, with a table:
  scripts/mpirun.sh 4 target/release/zero-bench train --config configs/demo.toml --stages 0,1,2,3

  # One stage, overrides on the command line, metrics as JSON lines:
  mpirun -n 8 zero-bench train --config configs/demo.toml --stage 3 --precision fp16 \\
      --set optim.lr=3e-4 --set train.micro_batch=8 --metrics metrics.jsonl

  # Inside a Slurm allocation, checkpointing every 100 steps, then going on to step 2000
  # on 16 ranks at stage 3 (another world size changes the global batch: say so):
  srun --mpi=pmix zero-bench train --config configs/demo.toml --stage 2 --steps 1000 \
      --ckpt-dir ckpt --save-every 100
  srun -n 16 --mpi=pmix zero-bench train --config configs/demo.toml --stage 3 --resume ckpt \
      --steps 2000 --allow-batch-change

  # One GPU (a build with --features cuda), bf16 products on its tensor cores:
  zero-bench train --device cuda --model gpt2-124m --precision bf16 --steps 100

  # Per-rank memory of GPT-2 1.5B on 64 ranks at stage 3, without running anything:
  zero-bench train --dry-run --world 64 --model gpt2-1.5b --stage 3 --precision bf16

Errors in the configuration (unknown keys, values out of range, impossible
combinations) are reported before anything runs, with what to change.";

/// `--stage`: a stage, or chosen from the memory budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageSetting {
    /// This stage.
    Fixed(Stage),
    /// The lowest stage that fits the budget.
    Auto,
}

/// `"2"` -> `Fixed(Zero2)`, `"auto"` -> `Auto`.
fn parse_stage_setting(s: &str) -> Result<StageSetting, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        Ok(StageSetting::Auto)
    } else {
        parse_stage(s).map(StageSetting::Fixed)
    }
}

/// `--threads`: a count, or this rank's CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadsSetting {
    /// This many (at least 1).
    Fixed(usize),
    /// The CPUs this rank is given (`train` resolves it per rank).
    Auto,
}

impl std::fmt::Display for ThreadsSetting {
    /// As `--threads` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ThreadsSetting::Fixed(n) => write!(f, "{n}"),
            ThreadsSetting::Auto => f.write_str("auto"),
        }
    }
}

impl ThreadsSetting {
    /// The thread count of a rank given `per_task` CPUs by Slurm (`--cpus-per-task`),
    /// `allowed` CPUs in its affinity, on a node of `cpus` CPUs shared by `local` ranks:
    /// a fixed count as it is; `auto`: `per_task`, else `allowed`, at most `allowed` and
    /// the rank's share `cpus / local` (mpirun inside `salloc -c 16` passes
    /// `SLURM_CPUS_PER_TASK=16` to each of its ranks); at least 1.
    pub fn resolve(
        self,
        per_task: Option<usize>,
        allowed: usize,
        cpus: usize,
        local: usize,
    ) -> usize {
        match self {
            ThreadsSetting::Fixed(n) => n,
            ThreadsSetting::Auto => per_task
                .unwrap_or(allowed)
                .min(allowed)
                .min(cpus / local.max(1))
                .max(1),
        }
    }
}

/// The most kernel threads a rank may be given (more than any node's cores).
const MAX_THREADS: usize = 1024;

/// `--threads` of `train` and `sweep`: a count ([`thread_count`]) or `auto`.
pub(crate) fn parse_threads(s: &str) -> Result<ThreadsSetting, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(ThreadsSetting::Auto);
    }
    thread_count(s)
        .map(ThreadsSetting::Fixed)
        .map_err(|e| format!("{e}, or auto (a thread per core the rank is given)"))
}

/// A count of kernel threads, 1 to [`MAX_THREADS`] (`--threads` of the micro-benchmarks,
/// and of `train` besides `auto`).
pub(crate) fn thread_count(s: &str) -> Result<usize, String> {
    let s = s.trim();
    match s.parse::<usize>() {
        Ok(0) => Err("0 threads: give at least 1".to_string()),
        Ok(n) if n > MAX_THREADS => Err(format!("{n} threads: at most {MAX_THREADS}")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "'{s}' is not a thread count: give a whole number from 1 to {MAX_THREADS}"
        )),
    }
}

/// `--mem-limit`: bytes per rank, or no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemLimit {
    /// At most this many bytes per rank.
    Bytes(u64),
    /// No limit (the guard is off).
    None,
}

fn parse_mem_limit(s: &str) -> Result<MemLimit, String> {
    if s.trim().eq_ignore_ascii_case("none") {
        Ok(MemLimit::None)
    } else {
        crate::plan::parse_mem(s).map(MemLimit::Bytes)
    }
}

/// `"2"` -> `Stage::Zero2`.
fn parse_stage(s: &str) -> Result<Stage, String> {
    let n: i64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a ZeRO stage; use 0, 1, 2 or 3"))?;
    Stage::try_from(n)
}

/// The key of a `--set section.key=value` argument (the whole text when it has no `=`,
/// which the loader refuses by name).
pub(crate) fn set_key(set: &str) -> &str {
    set.split_once('=').map_or(set, |(key, _)| key).trim()
}

/// A TOML basic string holding `s` (JSON's string escapes are valid TOML escapes).
fn toml_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

impl TrainArgs {
    /// The `section.key=value` overrides of this command line: every `--set` in order,
    /// then the convenience flags (so a flag wins over a `--set` of the same key).
    pub fn overrides(&self) -> Vec<String> {
        let mut o = self.set.clone();
        for (flag, key, value) in self.flag_overrides() {
            o.push(format!("{key}={value}"));
            if flag == "--model" {
                for (key, value) in self.preset_dimensions() {
                    o.push(format!("{key}={value}"));
                }
                if let Some(theta) = self.preset_rope_theta() {
                    o.push(format!("model.rope_theta={theta:?}"));
                }
            }
        }
        o
    }

    /// The convenience flags given, each as (flag, key, TOML value).
    fn flag_overrides(&self) -> Vec<(&'static str, &'static str, String)> {
        let mut o = Vec::new();
        match self.stage {
            Some(StageSetting::Fixed(s)) => {
                o.push(("--stage", "zero.stage", s.number().to_string()))
            }
            Some(StageSetting::Auto) => o.push(("--stage", "zero.stage", "\"auto\"".into())),
            None => {}
        }
        if let Some(p) = &self.precision {
            o.push(("--precision", "precision.dtype", toml_string(p)));
        }
        if let Some(n) = self.steps {
            o.push(("--steps", "train.steps", n.to_string()));
        }
        if let Some(a) = self.grad_accum {
            o.push(("--grad-accum", "train.grad_accum", a.to_string()));
        }
        if let Some(m) = &self.model {
            o.push(("--model", "model.preset", toml_string(m)));
        }
        if let Some(k) = self.checkpoint_every {
            o.push((
                "--checkpoint-every",
                "model.checkpoint_every",
                k.to_string(),
            ));
        }
        if let Some(f) = &self.metrics {
            let path = toml_string(&f.display().to_string());
            o.push(("--metrics", "train.metrics_file", path));
        }
        o
    }

    /// A warning for each convenience flag that overrides a `--set` of the same key with
    /// another value (the flag wins: `sweep` and `tune` rely on it to vary a key over a
    /// user's `--set`s), so that a user who gave both sees which one ran.
    pub fn flag_conflicts(&self) -> Vec<String> {
        // TOML text to compare: "bf16" and bf16 are the same value as --set takes it.
        let bare = |v: &str| v.trim().trim_matches('"').to_string();
        let mut warnings = Vec::new();
        for (flag, key, value) in self.flag_overrides() {
            if let Some(given) = self.set_value(key) {
                if bare(given) != bare(&value) {
                    warnings.push(format!(
                        "{flag} {} overrides --set {key}={given}: a flag wins over a --set of the same key",
                        bare(&value)
                    ));
                }
            }
        }
        if !self.stages.is_empty() {
            if let Some(given) = self.set_value("zero.stage") {
                warnings.push(format!(
                    "--stages runs each stage listed, overriding --set zero.stage={given}"
                ));
            }
        }
        warnings
    }

    /// What `--model NAME` sets besides the preset: the preset's own dimensions (keys
    /// `model.vocab_size`, ...), over those a configuration file sets (a sweep's `--models
    /// small` on configs/demo.toml trains `small`, not the demo model labelled so); one a
    /// `--set model.KEY=...` gives is left to it. Empty without `--model` or for a name
    /// that is no preset (the loader says so).
    pub fn preset_dimensions(&self) -> Vec<(String, usize)> {
        let Some(m) = &self.model else {
            return Vec::new();
        };
        let mut dims: Vec<(String, usize)> = crate::config::preset_dimensions(m)
            .into_iter()
            .flatten()
            .map(|(key, value)| (format!("model.{key}"), value))
            .collect();
        // A Llama preset's key/value heads and MLP width too, over a file's, except where
        // `--set` gives the dimension they go with: then the preset's rules decide
        // (`config::resolve_any`: a changed heads keeps or follows Hkv, a changed width
        // needs ffn_hidden).
        if let Some(l) = zero_models::LlamaConfig::preset(m) {
            if self.set_value("model.heads").is_none() {
                dims.push(("model.n_kv_head".into(), l.n_kv_head));
            }
            if self.set_value("model.width").is_none() {
                dims.push(("model.ffn_hidden".into(), l.ffn_hidden));
            }
        }
        dims.retain(|(key, _)| self.set_value(key).is_none());
        dims
    }

    /// A Llama preset's RoPE base, which `--model` also brings over a file's unless
    /// `--set` gives it.
    fn preset_rope_theta(&self) -> Option<f64> {
        let l = zero_models::LlamaConfig::preset(self.model.as_deref()?)?;
        self.set_value("model.rope_theta")
            .is_none()
            .then_some(l.rope_theta)
    }

    /// The value `--set KEY=VALUE` gives `key` (the last one), if any.
    fn set_value(&self, key: &str) -> Option<&str> {
        self.set.iter().rev().find_map(|s| {
            s.split_once('=')
                .filter(|_| set_key(s) == key)
                .map(|(_, v)| v.trim())
        })
    }

    /// What `--model NAME` also sets so that its preset runs as it is, where neither the
    /// configuration file (`file`, its TOML) nor `--set` gives the key: `train.seq_len`
    /// down to the preset's context length (the default, 64, is longer than `tiny`'s
    /// 8) and, on the built-in corpus, `model.vocab_size` up to the corpus's symbols
    /// (`tiny` has 32). Each as (key, value, why).
    pub fn preset_fit(&self, file: &toml::Table) -> Vec<(String, usize, String)> {
        let Some(m) = &self.model else {
            return Vec::new();
        };
        let in_file = |key: &str| {
            let (section, name) = key.split_once('.').unwrap_or(("", key));
            file.get(section)
                .and_then(toml::Value::as_table)
                .and_then(|t| t.get(name))
                .cloned()
        };
        let given = |key: &str| self.set_value(key).is_some() || in_file(key).is_some();
        let mut fit = Vec::new();
        for (key, value) in self.preset_dimensions() {
            let default = crate::config::Config::default();
            if key == "model.context_len"
                && value < default.train.seq_len
                && !given("train.seq_len")
            {
                fit.push((
                    "train.seq_len".to_string(),
                    value,
                    format!(
                        "--model {m}: its context_len (the default is {})",
                        default.train.seq_len
                    ),
                ));
            }
            let path = match self.set_value("data.path") {
                Some(p) => p.trim_matches('"').to_string(),
                None => in_file("data.path")
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or(default.data.path),
            };
            let builtin = super::data::BUILTIN_VOCAB;
            if key == "model.vocab_size" && value < builtin && path == "builtin" {
                fit.push((
                    key,
                    builtin,
                    format!("--model {m} on the built-in corpus: its {builtin} symbols (the preset has {value})"),
                ));
            }
        }
        fit
    }

    /// The overrides of one run of the stage list (`None`: the configured stage).
    pub fn overrides_for(&self, stage: Option<Stage>) -> Vec<String> {
        let mut o = self.overrides();
        if let Some(s) = stage {
            o.push(format!("zero.stage={}", s.number()));
        }
        o
    }

    /// The stages to run: the list, or one run at the configured stage.
    pub fn stage_runs(&self) -> Vec<Option<Stage>> {
        if self.stages.is_empty() {
            vec![None]
        } else {
            self.stages.iter().copied().map(Some).collect()
        }
    }
}

/// `train`'s arguments alone, as clap parses them (tests).
#[cfg(test)]
#[derive(clap::Parser)]
pub(crate) struct TestCli {
    #[command(flatten)]
    pub(crate) t: TrainArgs,
}

#[cfg(test)]
mod tests {
    use super::TestCli as Cli;
    use super::*;
    use clap::Parser;

    #[test]
    fn flags_become_overrides_after_set() {
        let cli = Cli::parse_from([
            "x",
            "--set",
            "zero.stage=1",
            "--stage",
            "3",
            "--precision",
            "fp16",
            "--model",
            "gpt2-124m",
            "--metrics",
            "/tmp/m \"q\".jsonl",
        ]);
        let o = cli.t.overrides();
        assert_eq!(
            o,
            vec![
                "zero.stage=1".to_string(),
                "zero.stage=3".into(),
                "precision.dtype=\"fp16\"".into(),
                "model.preset=\"gpt2-124m\"".into(),
                "model.vocab_size=50257".into(),
                "model.context_len=1024".into(),
                "model.layers=12".into(),
                "model.heads=12".into(),
                "model.width=768".into(),
                "train.metrics_file=\"/tmp/m \\\"q\\\".jsonl\"".into(),
            ]
        );
        let loaded = crate::config::load(None, &o).unwrap();
        assert_eq!(loaded.config.zero.stage, Stage::Zero3);
        assert_eq!(
            loaded.config.train.metrics_file.as_deref(),
            Some("/tmp/m \"q\".jsonl")
        );
    }

    /// `--model` with a Llama preset brings its key/value heads, MLP width and RoPE base
    /// over a file's, except where `--set` gives them or the dimension they go with.
    #[test]
    fn a_llama_model_flag_brings_its_own_kv_heads_mlp_and_rope() {
        let overrides = |args: &[&str]| {
            let cli = Cli::parse_from(std::iter::once("x").chain(args.iter().copied()));
            cli.t.overrides()
        };
        let l = zero_models::LlamaConfig::preset("llama2-7b").unwrap();
        let o = overrides(&["--model", "llama2-7b"]);
        assert!(
            o.contains(&format!("model.n_kv_head={}", l.n_kv_head)),
            "{o:?}"
        );
        assert!(
            o.contains(&format!("model.ffn_hidden={}", l.ffn_hidden)),
            "{o:?}"
        );
        assert!(
            o.contains(&format!("model.rope_theta={:?}", l.rope_theta)),
            "{o:?}"
        );
        // A file's values give way to them.
        let file =
            "[model]\npreset = \"llama-tiny\"\nn_kv_head = 1\nffn_hidden = 48\nrope_theta = 7.0\n";
        let c = crate::config::load_str(file, "t.toml", &o).unwrap().config;
        match c.model_preset().unwrap() {
            zero_models::ModelPreset::Llama(m) => {
                assert_eq!(
                    (m.n_kv_head, m.ffn_hidden, m.rope_theta),
                    (l.n_kv_head, l.ffn_hidden, l.rope_theta)
                );
            }
            other => panic!("{other:?}"),
        }
        // --set heads or width leaves Hkv and F to the preset's rules; --set of a key wins.
        let o = overrides(&[
            "--model",
            "llama2-7b",
            "--set",
            "model.heads=64",
            "--set",
            "model.width=1024",
            "--set",
            "model.rope_theta=1e6",
        ]);
        assert!(
            !o.iter()
                .any(|s| s.starts_with("model.n_kv_head") || s.starts_with("model.ffn_hidden")),
            "{o:?}"
        );
        assert!(
            !o.iter().any(|s| s.starts_with("model.rope_theta=10000")),
            "{o:?}"
        );
        // A GPT-2 preset brings none of them.
        let o = overrides(&["--model", "small"]);
        assert!(
            !o.iter()
                .any(|s| s.contains("n_kv_head") || s.contains("rope_theta")),
            "{o:?}"
        );
    }

    /// A flag that overrides a `--set` of the same key with another value is named (the
    /// same value, or TOML's quotes around it, is no conflict); `--stages` over a `--set
    /// zero.stage` too.
    #[test]
    fn a_flag_over_a_set_of_the_same_key_is_named() {
        let conflicts = |args: &[&str]| {
            let cli = Cli::parse_from(std::iter::once("x").chain(args.iter().copied()));
            cli.t.flag_conflicts()
        };
        assert_eq!(
            conflicts(&["--set", "train.steps=20", "--steps", "10"]),
            vec!["--steps 10 overrides --set train.steps=20: a flag wins over a --set of the same key"]
        );
        assert!(conflicts(&["--set", "train.steps=10", "--steps", "10"]).is_empty());
        assert!(
            conflicts(&["--set", "precision.dtype=\"bf16\"", "--precision", "bf16"]).is_empty()
        );
        let two = conflicts(&[
            "--set",
            "precision.dtype=fp16",
            "--set",
            "model.preset=tiny",
            "--precision",
            "bf16",
            "--model",
            "small",
        ]);
        assert_eq!(two.len(), 2, "{two:?}");
        assert!(two[0].starts_with("--precision bf16 overrides --set precision.dtype=fp16"));
        assert!(two[1].starts_with("--model small overrides --set model.preset=tiny"));
        // The last --set of a key is the one a flag overrides.
        assert!(conflicts(&[
            "--set",
            "train.steps=5",
            "--set",
            "train.steps=10",
            "--steps",
            "10"
        ])
        .is_empty());
        assert_eq!(
            conflicts(&["--set", "zero.stage=2", "--stages", "0,1"]),
            vec!["--stages runs each stage listed, overriding --set zero.stage=2"]
        );
        assert!(conflicts(&["--steps", "10", "--stage", "2"]).is_empty());
    }

    #[test]
    fn a_small_preset_gets_the_sequence_length_and_vocabulary_it_needs() {
        let fit = |args: &[&str], file: &str| {
            let cli = Cli::parse_from(std::iter::once("x").chain(args.iter().copied()));
            let file: toml::Table = toml::from_str(file).unwrap();
            cli.t
                .preset_fit(&file)
                .into_iter()
                .map(|(k, v, _)| (k, v))
                .collect::<Vec<_>>()
        };
        let both = vec![
            ("model.vocab_size".to_string(), 64),
            ("train.seq_len".to_string(), 8),
        ];
        assert_eq!(fit(&["--model", "tiny"], ""), both);
        // A file's [model] dimensions give way to the preset's, so the vocabulary is
        // fitted all the same; its train.seq_len stays its own.
        assert_eq!(
            fit(
                &["--model", "tiny"],
                "[model]\nvocab_size = 64\n[train]\nseq_len = 4\n"
            ),
            both[..1]
        );
        // What --set gives stays.
        assert_eq!(
            fit(&["--model", "tiny", "--set", "train.seq_len=4"], ""),
            both[..1]
        );
        assert!(
            fit(&["--model", "tiny", "--set", "model.vocab_size=40"], "")
                .iter()
                .all(|(k, _)| k != "model.vocab_size")
        );
        // A token file: its vocabulary is the model's business.
        assert_eq!(
            fit(&["--model", "tiny"], "[data]\npath = \"x.bin\"\n"),
            both[1..]
        );
        assert_eq!(
            fit(&["--model", "tiny", "--set", "data.path=x.bin"], ""),
            both[1..]
        );
        // Presets that fit the defaults, and no --model: nothing.
        assert!(fit(&["--model", "small"], "").is_empty());
        assert!(fit(&["--model", "llama-tiny"], "").is_empty());
        assert!(fit(&[], "").is_empty());
        // The run loads and validates.
        let cli = Cli::parse_from(["x", "--model", "tiny"]);
        let mut o = cli.t.overrides();
        o.extend(
            fit(&["--model", "tiny"], "")
                .iter()
                .map(|(k, v)| format!("{k}={v}")),
        );
        let c = crate::config::load(None, &o).unwrap().config;
        assert_eq!((c.train.seq_len, c.model.vocab_size), (8, Some(64)));
    }

    #[test]
    fn a_model_flag_trains_the_preset_over_a_files_dimensions() {
        let file =
            std::env::temp_dir().join(format!("zero-model-flag-{}.toml", std::process::id()));
        std::fs::write(
            &file,
            "[model]\npreset = \"tiny\"\nvocab_size = 64\nwidth = 32\n[train]\nseq_len = 8\n",
        )
        .unwrap();
        let model = |args: &[&str]| {
            let cli = Cli::parse_from(std::iter::once("x").chain(args.iter().copied()));
            let c = crate::config::load(Some(&file), &cli.t.overrides()).unwrap();
            let m = c.config.model;
            (
                m.preset,
                m.vocab_size,
                m.context_len,
                m.layers,
                m.heads,
                m.width,
            )
        };
        // The file alone: its dimensions over its preset.
        assert_eq!(
            model(&[]),
            (Some("tiny".into()), Some(64), None, None, None, Some(32))
        );
        // --model: the preset's own (small: V=256 T=256 L=4 H=4 C=256).
        let small = (
            Some("small".into()),
            Some(256),
            Some(256),
            Some(4),
            Some(4),
            Some(256),
        );
        assert_eq!(model(&["--model", "small"]), small);
        // ... but a --set of one dimension still wins.
        let wide = model(&["--set", "model.width=512", "--model", "small"]);
        assert_eq!(
            wide,
            (
                Some("small".into()),
                Some(256),
                Some(256),
                Some(4),
                Some(4),
                Some(512)
            )
        );
        // A Llama preset's dimensions come along too.
        assert_eq!(
            model(&["--model", "llama-tiny"]).0.as_deref(),
            Some("llama-tiny")
        );
        let _ = std::fs::remove_file(&file);
    }

    #[test]
    fn threads_parse_and_resolve() {
        let threads = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
                .map(|c| c.t.threads)
        };
        assert_eq!(threads(&[]).ok(), Some(ThreadsSetting::Auto));
        assert_eq!(
            threads(&["--threads", "AUTO"]).ok(),
            Some(ThreadsSetting::Auto)
        );
        assert_eq!(
            threads(&["--threads", "3"]).ok(),
            Some(ThreadsSetting::Fixed(3))
        );
        for bad in ["0", "-1", "two", ""] {
            assert!(threads(&["--threads", bad]).is_err(), "{bad:?}");
        }
        let auto = ThreadsSetting::Auto;
        // Under mpirun's default binding (one core per rank): 1.
        assert_eq!(auto.resolve(None, 1, 2, 2), 1);
        // Unbound ranks share the node; more ranks than CPUs still get one each.
        assert_eq!(auto.resolve(None, 64, 64, 4), 16);
        assert_eq!(auto.resolve(None, 2, 2, 3), 1);
        // One process alone: its whole affinity.
        assert_eq!(auto.resolve(None, 16, 16, 1), 16);
        // srun --cpus-per-task=8 (bound, or not: --cpu-bind=none).
        assert_eq!(auto.resolve(Some(8), 8, 32, 4), 8);
        assert_eq!(auto.resolve(Some(8), 32, 32, 4), 8);
        assert_eq!(auto.resolve(Some(8), 2, 32, 4), 2);
        // mpirun -n 4 --bind-to none inside `salloc -c 16`: the share, not 16 each.
        assert_eq!(auto.resolve(Some(16), 16, 16, 4), 4);
        // A fixed count is kept (the caller warns where it oversubscribes).
        assert_eq!(ThreadsSetting::Fixed(4).resolve(Some(1), 1, 2, 2), 4);
    }

    #[test]
    fn stage_list_parses_and_rejects() {
        let cli = Cli::parse_from(["x", "--stages", "0,1,2,3"]);
        assert_eq!(cli.t.stages, Stage::ALL.to_vec());
        assert_eq!(cli.t.stage_runs().len(), 4);
        assert!(Cli::try_parse_from(["x", "--stages", "0,4"]).is_err());
        assert!(Cli::try_parse_from(["x", "--stages", "1", "--stage", "2"]).is_err());
    }
}
