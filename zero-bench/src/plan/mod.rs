//! `zero-bench plan`: job sizing without allocating and without MPI. For a model (a
//! preset or a bare parameter count), world sizes N, stages, precision and the engine's
//! knobs, it prints per stage whether the job fits in the GPU's memory, the per-GPU
//! memory by category, the ZeRO paper's formula next to it with every difference
//! explained, the bytes communicated per step by collective, and an alpha-beta estimate
//! of the communication time.
//!
//! Every number comes from zero-core's ledgers, the code the engine allocates and
//! communicates by (see compute.rs); this module only parses, loops and prints.

mod compute;
mod model;
mod report;
pub(crate) mod units;

pub use units::{parse_fraction, parse_mem};

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};
use zero_core::config::ZeroConfig;
use zero_core::layout::DEFAULT_ALIGN;
use zero_core::{PartitionLayout, Precision, Stage};

use compute::Knobs;

use crate::logging::out;

/// Training precision on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PrecisionArg {
    /// bf16 parameters and gradients, fp32 master, m, v.
    Bf16,
    /// fp16 with dynamic loss scaling, fp32 master, m, v.
    Fp16,
    /// fp32 everywhere (the parameters are the master).
    Fp32,
}

impl PrecisionArg {
    fn precision(self) -> Precision {
        match self {
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::Fp16 => Precision::Fp16,
            PrecisionArg::Fp32 => Precision::Fp32,
        }
    }

    fn name(self) -> &'static str {
        match self {
            PrecisionArg::Bf16 => "bf16",
            PrecisionArg::Fp16 => "fp16",
            PrecisionArg::Fp32 => "fp32",
        }
    }
}

/// A list of world sizes (`8,64,512`).
#[derive(Clone, Debug)]
pub struct Worlds(Vec<u64>);

fn parse_worlds(s: &str) -> Result<Worlds, String> {
    units::parse_world_list(s, "--gpus").map(|v| Worlds(first_of_each(v)))
}

/// `v` with each value kept only where it first appears (`8,8,64` plans 8 and 64 once).
fn first_of_each<T: PartialEq>(v: Vec<T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(v.len());
    for x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// The largest `--params`: 1e15 (1000 T), some 500 times the largest models trained,
/// and where every byte count of the ledger is still an exact integer with room to spare.
const MAX_PARAMS: u64 = 1_000_000_000_000_000;

fn parse_params(s: &str) -> Result<u64, String> {
    let v = units::parse_positive(s, "--params")?;
    if v > MAX_PARAMS {
        return Err(format!(
            "--params {s} is {v} parameters: at most 1e15 (1000T), far above any model trained (the largest have a few 1e12)"
        ));
    }
    Ok(v)
}

/// The most `--units`: 100 000, hundreds of times the depth of any model trained (a
/// unit is a layer's parameters); the ledger holds a few records per unit, so that a
/// plan stays instant and small.
const MAX_UNITS: usize = 100_000;

fn parse_units(s: &str) -> Result<usize, String> {
    let v = parse_positive_usize(s)?;
    if v > MAX_UNITS {
        return Err(format!(
            "--units {s}: at most {MAX_UNITS} (a unit per layer; the deepest models have a few hundred)"
        ));
    }
    Ok(v)
}

fn parse_usize(s: &str) -> Result<usize, String> {
    let v = units::parse_count(s)?;
    usize::try_from(v).map_err(|_| format!("'{s}' is too large"))
}

fn parse_positive_usize(s: &str) -> Result<usize, String> {
    let v = units::parse_positive(s, "the value")?;
    usize::try_from(v).map_err(|_| format!("'{s}' is too large"))
}

/// A list of stages (`2,3`).
#[derive(Clone, Debug)]
pub struct Stages(Vec<Stage>);

fn parse_stages(s: &str) -> Result<Stages, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<i64>()
                .map_err(|_| format!("stage '{x}' is not a number; use 0, 1, 2 or 3"))
                .and_then(|n| {
                    Stage::try_from(n)
                        .map_err(|_| format!("stage {n} is not a ZeRO stage; use 0, 1, 2 or 3"))
                })
        })
        .collect::<Result<_, _>>()
        .map(|v| Stages(first_of_each(v)))
}

/// Size a job: memory per GPU and communication per step, for each ZeRO stage.
///
/// Examples: `zero-bench plan --params 7.5e9 --gpus 64` (the ZeRO paper's worked
/// example); `zero-bench plan --params 70e9 --gpus 8,64,512 --gpu-mem 80GiB`;
/// `zero-bench plan --model gpt2-1.5b --gpus 16 --micro-batch 4 --verbose`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Parameter count Ψ of a synthetic model (70e9, 7.5e9, 1.5B). It is cut into
    /// --units equal units, one per layer (units only size partition padding and the
    /// stage-3 gather and compute buffers). At most 1e15.
    #[arg(long, value_parser = parse_params, allow_negative_numbers = true, conflicts_with = "model", required_unless_present = "model")]
    pub params: Option<u64>,
    /// A model preset instead: tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b,
    /// llama-tiny, llama-small, llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b,
    /// llama-7b, llama-13b, llama-70b.
    #[arg(long)]
    pub model: Option<String>,
    /// --model only: activation checkpointing every K transformer blocks (blocks 0, K,
    /// 2K, ... keep only their output and recompute the rest in the backward); 0: off.
    /// The report gives the activations with it and without.
    // `conflicts_with = "params"`, not `requires = "model"`: clap waives a requirement
    // on an argument that conflicts with one given (--model with --params), so `requires`
    // let `--params 7.5e9 --checkpoint-every 2` through, the flag ignored.
    #[arg(long, default_value_t = 0, value_parser = parse_usize, conflicts_with = "params")]
    pub checkpoint_every: usize,
    /// --params only: units of the synthetic model. Default: the depth of a transformer
    /// of that size with GPT-3's aspect ratio C = 128 L, i.e. L = (Ψ / 196608)^(1/3)
    /// (96 for 175e9, 71 for 70e9, 34 for 7.5e9). At most 100000.
    #[arg(long, value_parser = parse_units, conflicts_with = "model")]
    pub units: Option<usize>,
    /// N: GPUs (data-parallel ranks); a comma-separated list prints a table over N.
    #[arg(long, value_parser = parse_worlds, allow_negative_numbers = true)]
    pub gpus: Worlds,
    /// Memory per GPU: 80GiB, 141GB, 24GiB (KiB/MiB/GiB/TiB = 1024, kB/MB/GB/TB = 1000).
    #[arg(long, default_value = "80GiB", value_parser = units::parse_mem, allow_negative_numbers = true)]
    pub gpu_mem: u64,
    /// Share of --gpu-mem kept free for what the ledger does not hold (CUDA context,
    /// NCCL/MPI buffers, allocator fragmentation): 10% or 0.1.
    #[arg(long, default_value = "10%", value_parser = units::parse_fraction)]
    pub headroom: f64,
    /// Stages to plan (0, 1, 2, 3 or a list such as 2,3). Default: all four.
    #[arg(long, value_parser = parse_stages)]
    pub stage: Option<Stages>,
    /// Training precision.
    #[arg(long, value_enum, default_value_t = PrecisionArg::Bf16)]
    pub precision: PrecisionArg,
    /// Reduce 16-bit gradients in f32 (twice the bytes on the wire and in the buckets).
    #[arg(long)]
    pub reduce_f32: bool,
    /// Accumulate 16-bit gradients in f32 (precision.grad_accum_dtype = "f32": 2 more
    /// bytes a parameter of gradients, the running sum kept in f32; --reduce-f32 keeps
    /// the reductions in f32 too).
    #[arg(long)]
    pub accumulate_f32: bool,
    /// Stages 2/3: accumulate full gradients locally and reduce once per step (less
    /// traffic with --grad-accum > 1, full gradients in memory).
    #[arg(long)]
    pub reduce_once: bool,
    /// A: micro-steps accumulated per optimizer step.
    #[arg(long, default_value = "1", value_parser = parse_positive_usize)]
    pub grad_accum: usize,
    /// B: sequences per micro-step per GPU (presets: sizes the activation arena).
    #[arg(long, default_value = "1", value_parser = parse_positive_usize)]
    pub micro_batch: usize,
    /// T: tokens per sequence, for --tflops (attention FLOPs and tokens per step).
    /// Presets: default and at most the context length (the activation arena is always
    /// sized for the context length, as the model allocates it). --params: default 2048.
    #[arg(long, value_parser = parse_positive_usize)]
    pub seq_len: Option<usize>,
    /// --params only: activation memory per GPU to add (e.g. 10GiB); default none (a bare
    /// parameter count has no activation model).
    #[arg(long, value_parser = units::parse_mem, conflicts_with = "model")]
    pub activation_mem: Option<u64>,
    /// Capacity of each gradient bucket, elements (default: the engine's budget,
    /// max(4Mi, 64Ki x N)).
    #[arg(long, value_parser = parse_positive_usize)]
    pub bucket_elems: Option<usize>,
    /// A unit used again later (a tied table) stays resident in between when the layers
    /// in between use at most this many elements of other units; else it is gathered
    /// again (stage 3) and its gradient reduced after each use (stages 2/3).
    #[arg(long, default_value_t = ZeroConfig::default().reuse_distance, value_parser = parse_usize)]
    pub reuse_distance: usize,
    /// Stage 3: layers whose parameters are gathered ahead.
    #[arg(long, default_value_t = ZeroConfig::default().prefetch, value_parser = parse_usize)]
    pub prefetch: usize,
    /// Stage 3: units with fewer elements stay gathered (0: none).
    #[arg(long, default_value_t = ZeroConfig::default().persistence_threshold, value_parser = parse_usize)]
    pub persistence_threshold: usize,
    /// Shard alignment, elements.
    #[arg(long, default_value_t = DEFAULT_ALIGN, value_parser = parse_positive_usize)]
    pub align: usize,
    /// Beta: link bandwidth per rank. A bare number is Gb/s (100 = 12.5 GB/s); also
    /// 400Gbps, 25GB/s.
    #[arg(long, default_value = "100", value_parser = units::parse_bandwidth, allow_negative_numbers = true)]
    pub link_gbps: f64,
    /// Bandwidth of a rank to the ranks of its node (NVLink, shared memory), with
    /// --ranks-per-node. A bare number is Gb/s; also 400Gbps, 25GB/s. Default: --link-gbps.
    #[arg(long, value_parser = units::parse_bandwidth, allow_negative_numbers = true)]
    pub intra_gbps: Option<f64>,
    /// Bandwidth of a node to the other nodes, shared by its ranks, with
    /// --ranks-per-node. A bare number is Gb/s. Default: --link-gbps.
    #[arg(long, value_parser = units::parse_bandwidth, allow_negative_numbers = true)]
    pub inter_gbps: Option<f64>,
    /// L: ranks (GPUs) per node. The traffic is then split into what stays inside a node
    /// and what leaves it, and estimated with --intra-gbps / --inter-gbps. Default: one
    /// node of N ranks.
    #[arg(long, value_parser = parse_positive_usize)]
    pub ranks_per_node: Option<usize>,
    /// qwZ: parameter gathers as int8 codes + one f32 scale per --quant-block values
    /// (stage 3, and stages 1/2 in 16-bit training).
    #[arg(long)]
    pub quantize_weights: bool,
    /// hpZ: stage 3's backward gathers from a copy partitioned inside each node.
    #[arg(long)]
    pub hierarchical_weights: bool,
    /// qgZ: the gradient reduce-scatter as int8 all-to-alls inside and across nodes
    /// (stages 1-3).
    #[arg(long)]
    pub quantize_grads: bool,
    /// Bits per qgZ gradient code: 8 (int8) or 4 (int4, half the code bytes).
    #[arg(long, default_value = "8", value_parser = ["4", "8"])]
    pub grad_quant_bits: String,
    /// Values per scale of the quantized switches.
    #[arg(long, default_value_t = ZeroConfig::default().quant_block, value_parser = parse_positive_usize)]
    pub quant_block: usize,
    /// Alpha: latency per ring step of a collective. A bare number is microseconds; also
    /// 500ns, 0.01ms.
    #[arg(long, default_value = "5", value_parser = units::parse_latency, allow_negative_numbers = true)]
    pub link_latency_us: f64,
    /// Sustained TFLOP/s per GPU: adds a compute-time estimate per step (presets: the
    /// model's FLOPs per token; --params: 6Ψ per token).
    #[arg(long)]
    pub tflops: Option<f64>,
    /// Print each point's memory by category, the formula's differences explained, and
    /// the traffic per collective.
    #[arg(long, short)]
    pub verbose: bool,
    /// Also write the whole plan as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Run `zero-bench plan`.
pub fn run(a: &PlanArgs) -> anyhow::Result<()> {
    crate::logging::init(None);
    if let Some(path) = &a.json {
        crate::micro::outputs::check(&[("--json", path)])?;
    }
    if let Some(tf) = a.tflops {
        if !(tf.is_finite() && tf > 0.0) {
            bail!("--tflops must be positive, got {tf}");
        }
    }
    let plan_model = match (&a.model, a.params) {
        (Some(name), _) => model::preset(name, a.micro_batch, a.seq_len, a.checkpoint_every)?,
        (None, Some(psi)) => model::synthetic(
            psi,
            a.units.unwrap_or_else(|| model::default_units(psi)),
            a.activation_mem.unwrap_or(0),
        )?,
        (None, None) => bail!("give --params (e.g. 70e9) or --model (e.g. gpt2-1.5b)"),
    };
    let seq_len = match &plan_model.preset {
        Some(cfg) => a.seq_len.unwrap_or(cfg.max_seq_len()),
        None => a.seq_len.unwrap_or(2048),
    };
    let knobs = Knobs {
        precision: a.precision.precision(),
        reduce_f32: a.reduce_f32,
        accumulate_f32: a.accumulate_f32,
        reduce_once: a.reduce_once,
        grad_accum: a.grad_accum,
        micro_batch: a.micro_batch,
        seq_len,
        bucket_elems: a.bucket_elems,
        reuse_distance: a.reuse_distance,
        prefetch: a.prefetch,
        persistence_threshold: a.persistence_threshold,
        align: a.align,
        gpu_mem: a.gpu_mem,
        headroom: a.headroom,
        alpha_s: a.link_latency_us,
        beta_bytes_per_s: a.link_gbps,
        intra_bytes_per_s: a.intra_gbps.unwrap_or(a.link_gbps),
        inter_bytes_per_s: a.inter_gbps.unwrap_or(a.link_gbps),
        ranks_per_node: a.ranks_per_node,
        quantize_weights: a.quantize_weights,
        hierarchical_weights: a.hierarchical_weights,
        quantize_grads: a.quantize_grads,
        quant_block: a.quant_block,
        grad_quant_bits: if a.grad_quant_bits == "4" { 4 } else { 8 },
        tflops: a.tflops,
    };
    if a.reduce_f32 && matches!(a.precision, PrecisionArg::Fp32) {
        bail!("--reduce-f32 with --precision fp32: fp32 gradients are already reduced in f32; drop the flag");
    }
    if a.accumulate_f32 && matches!(a.precision, PrecisionArg::Fp32) {
        bail!("--accumulate-f32 with --precision fp32: fp32 gradients already accumulate in f32; drop the flag");
    }
    if a.ranks_per_node.is_none() && (a.intra_gbps.is_some() || a.inter_gbps.is_some()) {
        bail!("--intra-gbps and --inter-gbps describe the links inside and between nodes: give --ranks-per-node too (without it, --link-gbps is every link)");
    }
    let stages = a.stage.clone().map_or_else(|| Stage::ALL.to_vec(), |s| s.0);
    let mut points = Vec::new();
    for &n in &a.gpus.0 {
        let world = usize::try_from(n).with_context(|| format!("--gpus {n} is too large"))?;
        let layout = PartitionLayout::new(&plan_model.spec, world, a.align)
            .with_context(|| format!("laying out {} over N = {world}", plan_model.name))?;
        for &stage in &stages {
            points.push(compute::plan_point(&plan_model, &layout, &knobs, stage)?);
        }
    }
    let report = report::PlanReport::new(&plan_model, &knobs, a.precision.name(), points);
    out!("{}", report.render(a.verbose, a.tflops));
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&report).context("serialising the plan")?;
        crate::outfile::write_text(path, &(text + "\n"))?;
        log::info!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_worlds_and_stages_are_planned_once_in_the_order_given() {
        assert_eq!(parse_worlds("8,8,64,8").unwrap().0, [8, 64]);
        assert_eq!(parse_worlds("64,8").unwrap().0, [64, 8]);
        assert_eq!(
            parse_stages("3,2,3,2").unwrap().0,
            [Stage::Zero3, Stage::Zero2]
        );
        assert!(parse_stages("3,4").is_err());
    }
}
