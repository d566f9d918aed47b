//! `zero-bench train`: train the GPT on a corpus at a chosen ZeRO stage, precision and
//! accumulation, one process per rank under mpirun or srun.
//!
//! Flow (every rank runs it; rank 0 prints and writes files):
//! 1. configuration: `--config FILE` + `--set` overrides (+ convenience flags), loaded and
//!    validated by `crate::config`, once per run of `--stages`. Every rank validates the same
//!    inputs, so a bad config fails everywhere without communicating; rank 0 prints why.
//! 2. `--dry-run`: print the plans and stop (no MPI needed; see dry_run.rs).
//! 3. set-up that may fail on one rank only (data file, `--init-from`, metrics file) is
//!    agreed on across ranks (launch.rs), so a failure is reported once and every rank
//!    exits 1 instead of hanging in a collective.
//! 4. training, one stage after another (run.rs); an error during a step aborts the job
//!    from the rank that hit it.
//! 5. summary: one stage's loss, throughput and memory, or the `--stages` table.

mod args;
pub mod budget;
#[cfg(feature = "hdf5")]
mod checkpoints;
mod data;
mod dry_run;
mod init_from;
// Also `ckpt bench`'s: the same agreement on failures.
pub(crate) mod launch;
mod metrics;
mod outputs;
mod progress;
mod report;
mod rss;
mod run;
mod signals;
#[cfg(not(feature = "hdf5"))]
mod without_hdf5;
#[cfg(not(feature = "hdf5"))]
use without_hdf5::checkpoints;

use std::path::Path;

use crate::config::{load, LoadedConfig, Source};
use crate::device::{BenchDevice, DeviceChoice};
use crate::world::{self, WorldComm};
use anyhow::{anyhow, Context};
use zero_comm::Communicator;
use zero_core::config::Stage;
use zero_kernels::device::{HostDevice, SimDevice};
use zero_kernels::twin::attention_products::AttentionKernels;

use crate::logging::{out, outln};
pub use args::TrainArgs;
pub(crate) use args::{parse_threads, set_key, thread_count, ThreadsSetting};
use launch::{agree, Failure};
pub use report::precision_name;
use report::StageResult;

/// Run `zero-bench train`. On failure exactly one rank prints the error, then every rank
/// shuts MPI down and exits with status 1 (85 when a scheduler's stop signal ended the
/// run, after a checkpoint or before step 1: [`launch::PREEMPTED_EXIT_CODE`]; 130 for
/// SIGINT).
pub fn run(mut args: TrainArgs) -> anyhow::Result<()> {
    let without_mpi = args.dry_run && !world::under_launcher();
    if !args.dry_run {
        // As early as can be: a signal that comes during start-up is kept, not fatal.
        signals::install()?;
    }
    let mpi = if without_mpi {
        None
    } else {
        Some(world::init("train")?)
    };
    let world = mpi.as_ref().map(|m| (m.comm.rank(), m.comm.size()));
    crate::logging::init(world);
    let rank0 = world.is_none_or(|w| w.0 == 0);
    if rank0 {
        for warning in args.flag_conflicts() {
            log::warn!("{warning}");
        }
    }
    if let (Some(from), None) = (&args.resume, &args.ckpt_dir) {
        args.ckpt_dir = checkpoints::default_ckpt_dir(from);
        match &args.ckpt_dir {
            Some(dir) if rank0 => log::info!(
                "--resume {} without --ckpt-dir: the run goes on saving into {} (give --ckpt-dir to save elsewhere)",
                from.display(),
                dir.display()
            ),
            // A step directory: nothing of this run is saved.
            None if args.save_every > 0 => anyhow::bail!(
                "--save-every {} with --resume {} (a step directory) and no --ckpt-dir: give --ckpt-dir, where this run's checkpoints go",
                args.save_every,
                from.display()
            ),
            None if rank0 && !args.dry_run => log::warn!(
                "--resume {} without --ckpt-dir: this run saves no checkpoint (give --ckpt-dir to keep its steps)",
                from.display()
            ),
            _ => {}
        }
    }
    let result = run_on(&args, mpi.as_ref().map(|m| &m.comm));
    match result {
        Ok(()) => Ok(()),
        Err(f) => {
            // Print before MPI_Finalize: finalising waits for every rank, so no rank can
            // exit (and make mpirun kill the others) before the message is out.
            if f.print && f.code == launch::PREEMPTED_EXIT_CODE {
                eprintln!("{}", crate::logging::chain(&f.error));
                let _ = std::io::Write::flush(&mut std::io::stderr());
            } else if f.print {
                eprintln!("error: {}", crate::logging::chain(&f.error));
                let _ = std::io::Write::flush(&mut std::io::stderr());
            }
            drop(mpi);
            std::process::exit(f.code)
        }
    }
}

/// What `--model` fitted besides the preset's dimensions: (key, value, why).
pub(crate) type PresetFit = Vec<(String, usize, String)>;

/// The configuration of each run of a stage list (`None`: the configured stage).
pub(crate) type StageRuns = Vec<(Option<Stage>, LoadedConfig)>;

/// Load and validate the configuration of every run of the stage list, then train's own
/// checks of the command line.
fn configs(args: &TrainArgs) -> anyhow::Result<Vec<LoadedConfig>> {
    let (runs, _) = load_runs(args)?;
    if args.rounds == 0 {
        return Err(anyhow!("--rounds 0: run the stage list at least once"));
    }
    // Each run of the list starts again from step 1 (or from the one checkpoint resumed):
    // saving would replace one run's checkpoints with the next's, and prune the one the
    // next resumes from.
    if let Some(dir) = &args.ckpt_dir {
        if args.rounds > 1 {
            return Err(anyhow!(
                "--rounds {} with --ckpt-dir {} (or --resume, which saves there too): every round trains from the same start and would save over the round before; --rounds is for timing: leave out the checkpoints, or train once",
                args.rounds,
                dir.display()
            ));
        }
        if args.stages.len() > 1 {
            return Err(anyhow!(
                "--stages with --ckpt-dir {}: each stage trains from step 1 and would save over the stage before; checkpoint one stage per run (--stage N --ckpt-dir DIR)",
                dir.display()
            ));
        }
    }
    if args.keep_last == 0 {
        return Err(anyhow!(
            "--keep-last 0 would delete every checkpoint, the one just written included; keep at least 1 (default 3)"
        ));
    }
    Ok(runs.into_iter().map(|(_, loaded)| loaded).collect())
}

/// The configuration of every run of `args`'s stage list (`None`: the configured
/// stage), loaded and validated as train runs it: the file with the command line's
/// overrides (every `--set`, then the flags) and what `--model` fits where neither
/// gives it, with the model checks; and that fit. `sweep run` and `tune` check their
/// jobs' command lines with it before launching any (sweep/child.rs).
pub(crate) fn load_runs(args: &TrainArgs) -> anyhow::Result<(StageRuns, PresetFit)> {
    let runs = args.stage_runs();
    let mut out = Vec::with_capacity(runs.len());
    // What the preset needs besides (a shorter train.seq_len, the built-in corpus's
    // vocabulary), where the file and --set leave it. A file that cannot be read or
    // parsed is the loader's to report.
    let file: toml::Table = args
        .config
        .as_deref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| toml::from_str(&text).ok())
        .unwrap_or_default();
    let fit = args.preset_fit(&file);
    // What --model brought besides the preset: named in provenance, and after an error
    // that is about one of them.
    let dims = args.preset_dimensions();
    let model = args.model.as_deref().unwrap_or_default();
    let brought: Vec<(String, usize)> = dims
        .iter()
        .map(|(k, v)| {
            let fitted = fit.iter().find(|(f, _, _)| f == k).map(|(_, v, _)| *v);
            (k.clone(), fitted.unwrap_or(*v))
        })
        .chain(
            fit.iter()
                .filter(|(k, _, _)| !dims.iter().any(|(d, _)| d == k))
                .map(|(k, v, _)| (k.clone(), *v)),
        )
        .collect();
    // An error names the stage of a list whose configuration it is about.
    let listed = runs.len() > 1 || runs.iter().any(Option::is_some);
    for stage in runs {
        let at = |e: anyhow::Error| match stage {
            Some(s) if listed => e.context(format!("at stage {}", s.number())),
            _ => e,
        };
        let mut overrides = args.overrides_for(stage);
        overrides.extend(fit.iter().map(|(key, value, _)| format!("{key}={value}")));
        let mut loaded = load(args.config.as_deref(), &overrides)
            .map_err(|e| at(with_preset_note(anyhow!(e), model, &brought)))?;
        for (key, _) in &dims {
            let from = Source::Derived(format!("--model {model}: the preset's"));
            loaded.provenance.insert(key.clone(), from);
        }
        for (key, _, why) in &fit {
            loaded
                .provenance
                .insert(key.clone(), Source::Derived(why.clone()));
        }
        // Model checks zero-core cannot do (it knows no model family): e.g. a GPT-2's
        // V within its bound, a Llama's Hkv dividing H.
        run::model_preset(&loaded.config).map_err(|e| at(with_preset_note(e, model, &brought)))?;
        out.push((stage, loaded));
    }
    Ok((out, fit))
}

/// `error` with, after it, the values `--model NAME` gave the keys it names (`brought`:
/// the preset's dimensions and what was fitted to them), so that a problem with one of
/// them says where its value came from; any other error as it is.
fn with_preset_note(
    error: anyhow::Error,
    model: &str,
    brought: &[(String, usize)],
) -> anyhow::Error {
    let text = crate::logging::chain(&error);
    let named: Vec<String> = brought
        .iter()
        .filter(|(key, _)| names_key(&text, key))
        .map(|(key, value)| format!("{key} = {value}"))
        .collect();
    if named.is_empty() {
        return error;
    }
    anyhow!(
        "{text}\n  (--model {model} set {}; --set KEY=VALUE changes it)",
        named.join(", ")
    )
}

/// Whether `text` names `key` (`model.heads`, not `model.heads_kv`).
fn names_key(text: &str, key: &str) -> bool {
    text.match_indices(key).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + key.len()..].chars().next();
        let part = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.');
        !part(before) && !part(after)
    })
}

fn run_on(args: &TrainArgs, comm: Option<&WorldComm>) -> Result<(), Failure> {
    let rank = comm.map_or(0, |c| c.rank());
    let same = |e: anyhow::Error| Failure::same_everywhere(e, rank);
    // Agreed: a file that one node cannot read must fail every rank, not leave the
    // others waiting in the first collective.
    let mut loaded = match comm {
        Some(c) => agree(c, configs(args))?,
        None => configs(args).map_err(same)?,
    };
    if args.dry_run {
        return dry_run(args, &mut loaded, comm).map_err(same);
    }
    let comm =
        comm.ok_or_else(|| same(anyhow!("training needs MPI (internal: not initialised)")))?;
    same_on_every_rank(comm, args, &loaded)?;
    // Again after MPI_Init, in case the MPI library installed handlers of its own.
    signals::install().map_err(same)?;
    // The transport of the engine's collectives (issue 14), chosen once and the same on
    // every rank: what rank 0 finds (the NCCL library, the CUDA-aware probe) decides for
    // all, so nodes that differ cannot pick different backends and wait for each other
    // forever; a rank where rank 0's choice then cannot start fails in the agreed set-up.
    let facts = agreed_facts(
        comm,
        zero_comm::Facts {
            buffers: args.device.buffers(),
            processes: comm.size(),
            nccl_compiled: cfg!(feature = "nccl"),
            nccl_present: nccl_present(),
            cuda_aware: zero_comm::probe_cuda_aware(),
            half_reductions: loaded
                .iter()
                .any(|l| l.config.engine().precision.reduce_dtype() != zero_kernels::DType::F32),
        },
    )
    .map_err(same)?;
    let (backend, why) = zero_comm::select(args.comm, &facts).map_err(|e| same(anyhow!(e)))?;
    if rank == 0 {
        log::info!("comm backend: {backend} ({why})");
        if let Some(note) = world::host_transport(comm, backend) {
            log::info!("comm backend: {note}");
        }
    }
    // One device per rank for every run of the stage list.
    match args.device {
        DeviceChoice::Host => {
            let threads = host_threads(comm, args.threads).map_err(same)?;
            let dev = HostDevice::with_threads(threads);
            dev.set_overlap(!args.no_overlap);
            with_backend(args, loaded, comm, backend, &dev)
        }
        DeviceChoice::SimGpu => {
            let dev = SimDevice::gpu_twin(SIM_GPU_SEED + rank as u64);
            // The CUDA device's choice of attention kernels, simulated.
            let attention = agree(comm, AttentionKernels::from_env().map_err(|e| anyhow!(e)))?;
            dev.set_attention_kernels(attention);
            dev.set_overlap(!args.no_overlap);
            with_backend(args, loaded, comm, backend, &dev)
        }
        DeviceChoice::Cuda(ordinal) => on_cuda(args, loaded, comm, Some(ordinal), backend),
        DeviceChoice::CudaLocal => on_cuda(args, loaded, comm, None, backend),
    }
}

/// Refuse ranks that were given different configurations (a stale config file on one
/// node, a flag in one rank's command line): they would wait for each other in
/// collectives of different sizes, or train differently without a word. Rank 0's
/// settings go to every rank, and each rank that differs names the first difference.
/// The token file's path and the metrics file may differ (node-local copies; only rank
/// 0 writes metrics). Collective.
fn same_on_every_rank(
    comm: &WorldComm,
    args: &TrainArgs,
    loaded: &[LoadedConfig],
) -> Result<(), Failure> {
    let rank = comm.rank();
    // The kind of device only: each rank may name its own GPU (`cuda:$SLURM_LOCALID`).
    let device = match args.device {
        DeviceChoice::Cuda(_) | DeviceChoice::CudaLocal => "cuda".to_string(),
        other => format!("{other:?}"),
    };
    // Every flag that changes which collectives a rank issues. (--init-from's and
    // --save-model's paths are left out, only whether they are given: a node-local copy
    // is a different path to the same file, and only rank 0 writes the model. --json and
    // --metrics are rank 0's alone: the others may leave them out.)
    let flags = [
        format!("--device = {device}"),
        format!("--comm = {:?}", args.comm),
        format!("--ckpt-dir = {:?}", args.ckpt_dir),
        format!("--save-every = {}", args.save_every),
        format!("--keep-last = {}", args.keep_last),
        format!("--resume = {:?}", args.resume),
        format!("--allow-batch-change = {}", args.allow_batch_change),
        format!("--init-from given = {}", args.init_from.is_some()),
        format!("--save-model given = {}", args.save_model.is_some()),
        format!("--no-overlap = {}", args.no_overlap),
        format!("--rounds = {}", args.rounds),
        format!("--mem-limit = {:?}", args.mem_limit),
        format!("--mem-headroom = {}", args.mem_headroom),
    ];
    // (The ZERO_COMM_* settings that change the collectives are compared by
    // `zero_comm::init` itself, before any collective.)
    let mut mine: Vec<String> = flags.to_vec();
    for (i, l) in loaded.iter().enumerate() {
        mine.extend(
            l.settings()
                .into_iter()
                .filter(|s| !s.starts_with("data.path =") && !s.starts_with("train.metrics_file ="))
                .map(|s| format!("run {}: {s}", i + 1)),
        );
    }
    let text = mine.join("\n");
    // A broadcast that fails leaves the ranks at different points: end the job (as
    // `agree` does), rather than wait in MPI_Finalize.
    let broken = |e: zero_comm::CommError| -> Failure {
        zero_comm::abort(
            &format!("error: comparing the configuration across ranks: {e}"),
            1,
        )
    };
    let mut len = [text.len() as i64];
    comm.broadcast(&mut len[..], 0).map_err(broken)?;
    let mut theirs = if rank == 0 {
        text.clone().into_bytes()
    } else {
        vec![0u8; len[0] as usize]
    };
    comm.broadcast(&mut theirs[..], 0).map_err(broken)?;
    let theirs = String::from_utf8_lossy(&theirs);
    let differs = if theirs == text {
        Ok(())
    } else {
        let ours: Vec<&str> = text.lines().collect();
        let first = theirs
            .lines()
            .zip(ours.iter())
            .find(|(a, b)| a != *b)
            .map_or_else(
                || "a different number of settings".to_string(),
                |(a, b)| format!("rank 0 has `{a}`, this rank `{b}`"),
            );
        Err(anyhow!(
            "this rank's configuration differs from rank 0's ({first}): give every rank the same config file, --set values and flags"
        ))
    };
    agree(comm, differs)
}

/// The threads of this rank's host device: `--threads K`, or (`auto`) the CPUs the rank
/// is given: Slurm's `SLURM_CPUS_PER_TASK` where set, else the CPUs it may run on (its
/// affinity); either at most its affinity and the node's CPUs for the job
/// (`SLURM_CPUS_ON_NODE`, else the CPUs online) divided by the node's ranks, so that
/// ranks x threads fill the node and do not oversubscribe it
/// ([`ThreadsSetting::resolve`]). Rank 0 logs its count and why. Collective (the node
/// split).
///
/// Warns where the CPU is oversubscribed: this node's ranks times the threads exceed the
/// CPUs it has for the job, or this rank's threads exceed the CPUs it may run on (mpirun
/// binds each of up to 2 ranks to one core by default). A rank waiting in a collective
/// spins; with more threads than cores the rank it waits for is off its core, and steps
/// stall (4 ranks on 2 cores under srun: steps of 30 ms with stalls of 5-23 s,
/// `slurm/README.md`).
fn host_threads(comm: &WorldComm, setting: ThreadsSetting) -> anyhow::Result<usize> {
    let (node_rank, local) = crate::world::node_rank(comm)?;
    let count = |var: &str| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
    };
    // SAFETY: sysconf reads a system constant.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let online = usize::try_from(online).unwrap_or(1).max(1);
    // (Slurm's count, where it is no more than the host has: a test cluster may declare
    // more CPUs than its host's, or several nodes on one host, whose ranks `local` counts
    // together.)
    let (cpus, source) = match count("SLURM_CPUS_ON_NODE") {
        Some(c) if c <= online => (c, "SLURM_CPUS_ON_NODE"),
        _ => (online, "CPUs online"),
    };
    let allowed = std::thread::available_parallelism().map_or(cpus, |n| n.get());
    let per_task = count("SLURM_CPUS_PER_TASK");
    let threads = setting.resolve(per_task, allowed, cpus, local);
    if comm.rank() == 0 {
        let why = match (setting, per_task) {
            (ThreadsSetting::Fixed(_), _) => "--threads".to_string(),
            (ThreadsSetting::Auto, Some(n)) => {
                format!("auto: SLURM_CPUS_PER_TASK={n}, {allowed} CPU(s) in this rank's affinity")
            }
            (ThreadsSetting::Auto, None) => format!(
                "auto: {allowed} CPU(s) in this rank's affinity; {cpus} on its node ({source}) for {local} rank(s)"
            ),
        };
        log::info!("threads per rank: {threads} ({why})");
    }
    if node_rank == 0 && local * threads > cpus {
        log::warn!(
            "{local} rank(s) x {threads} thread(s) on this node, but it has {cpus} CPU(s) for them ({source}): ranks waiting in a collective spin while the rank they wait for is off its CPU, so steps can stall for seconds; run at most {cpus} ranks x threads per node (srun --ntasks-per-node, --cpus-per-task; --threads)"
        );
    }
    if threads > allowed {
        log::warn!(
            "--threads {threads}, but this rank may run on {allowed} CPU(s) (its CPU affinity), so its threads share them; give each rank {threads} CPUs (mpirun --map-by slot:PE={threads}, or --bind-to none; srun --cpus-per-task={threads})"
        );
    }
    Ok(threads)
}

/// The rest of `train` on `dev` with the engine's collectives on `backend`.
fn with_backend<D: BenchDevice>(
    args: &TrainArgs,
    mut loaded: Vec<LoadedConfig>,
    comm: &WorldComm,
    backend: zero_comm::Backend,
    dev: &D,
) -> Result<(), Failure> {
    use zero_comm::Backend;
    let rank = comm.rank();
    let rounded_sums = loaded
        .iter()
        .map(|l| &l.config)
        .find(|c| c.train.grad_accum > 1 && c.precision.grad_dtype() != zero_kernels::DType::F32);
    if let (0, Some(c)) = (rank, rounded_sums) {
        log::info!(
            "gradients accumulate in {} over {} micro-steps, the sum rounded at each; precision.grad_accum_dtype = \"f32\" keeps it in fp32 for 2 more bytes a parameter (with precision.grad_reduce_dtype = \"f32\" too, stages 2/3 also reduce each micro-step in f32)",
            c.precision.grad_dtype(),
            c.train.grad_accum
        );
    }
    // hpZ / qgZ: the node and cross-node groups (collective; every rank agrees).
    let wanted = agree(comm, wanted_ranks_per_node(&loaded))?;
    let groups = match wanted {
        Some(l) => {
            let g = agree(comm, crate::world::node_groups(comm, l))?;
            if rank == 0 {
                log::info!(
                    "nodes for hpZ/qgZ: {} node(s) of {} rank(s) ({})",
                    g.cross.size(),
                    g.node.size(),
                    if l.is_some() {
                        "zero.ranks_per_node"
                    } else {
                        "found from the launch"
                    }
                );
            }
            if rank == 0 && g.cross.size() == 1 {
                log::warn!(
                    "hpZ/qgZ on one node of {} rank(s): no traffic leaves a node to be saved (hpZ costs memory, qgZ rounds the gradients); on one host, zero.ranks_per_node emulates nodes",
                    g.node.size()
                );
            }
            let hpz = loaded.iter().any(|l| l.config.zero.hierarchical_weights);
            if rank == 0 && hpz && g.node.size() == 1 && g.cross.size() > 1 {
                log::warn!(
                    "hpZ with one rank per node: each rank keeps a whole copy of the weights (up to Ψ more parameters held) and gains nothing over stage 3's own gathers"
                );
            }
            // The nodes found are what the memory budget and the engine plan for.
            for l in &mut loaded {
                l.set_ranks_per_node(g.node.size());
            }
            Some(g)
        }
        None => None,
    };
    match backend {
        Backend::Mpi => run_with(args, loaded, comm, comm, groups.as_ref(), dev, backend),
        Backend::MpiStaged => {
            let staged = zero_comm::StagedComm::new(comm);
            let staged_groups = groups.as_ref().map(|g| zero_comm::NodeGroups {
                node: zero_comm::StagedComm::new(&g.node),
                cross: zero_comm::StagedComm::new(&g.cross),
            });
            run_with(
                args,
                loaded,
                comm,
                &staged,
                staged_groups.as_ref(),
                dev,
                backend,
            )
        }
        Backend::MpiCuda => {
            agree(comm, crate::world::device_pointers(comm))?;
            if let Some(g) = &groups {
                agree(comm, crate::world::device_pointers(&g.node))?;
                agree(comm, crate::world::device_pointers(&g.cross))?;
            }
            run_with(args, loaded, comm, comm, groups.as_ref(), dev, backend)
        }
        Backend::Local => {
            // One process: a communicator of this one rank, which reaches any memory.
            let engine_comm = agree(
                comm,
                (|| -> anyhow::Result<_> {
                    let config = zero_comm::CommConfig::from_env()?;
                    zero_comm::LocalComm::world_on_nodes(1, 1, config)?
                        .pop()
                        .ok_or_else(|| anyhow!("no communicator"))
                })()
                .context("creating the one-rank communicator"),
            )?;
            let (world, one_node) = engine_comm;
            let one_node = groups.as_ref().map(|_| one_node);
            run_with(args, loaded, comm, &world, one_node.as_ref(), dev, backend)
        }
        #[cfg(feature = "nccl")]
        Backend::Nccl => {
            // The GPU this rank trains on; set up over the world (a rank whose GPU or id
            // fails stops every rank before any waits in ncclCommInitRank).
            let ordinal = match dev.location() {
                zero_kernels::device::Location::Cuda(o) => o,
                zero_kernels::device::Location::Host => {
                    return Err(Failure::same_everywhere(
                        anyhow!("--comm nccl needs a CUDA device (--device cuda)"),
                        rank,
                    ))
                }
            };
            // The watchdog's timeout is the MPI world's (ZERO_COMM_TIMEOUT).
            let config = agree(
                comm,
                zero_comm::CommConfig::from_env().map_err(anyhow::Error::from),
            )?;
            let nccl =
                zero_comm::NcclComm::over(comm, ordinal, &config).map_err(anyhow::Error::from);
            let nccl = agree(comm, nccl)?;
            // hpZ / qgZ: one NCCL communicator per MPI group, its id over that group.
            let nccl_groups = match &groups {
                Some(g) => {
                    let on = |sub: &WorldComm| -> anyhow::Result<zero_comm::NcclComm> {
                        Ok(zero_comm::NcclComm::over(sub, ordinal, &config)?)
                    };
                    let node = agree(comm, on(&g.node).context("NCCL on the node group"))?;
                    let cross = agree(comm, on(&g.cross).context("NCCL on the cross-node group"))?;
                    Some(zero_comm::NodeGroups { node, cross })
                }
                None => None,
            };
            run_with(
                args,
                loaded,
                comm,
                &nccl,
                nccl_groups.as_ref(),
                dev,
                backend,
            )
        }
        #[cfg(not(feature = "nccl"))]
        Backend::Nccl => Err(Failure::same_everywhere(
            anyhow!("--comm nccl: this build has no NCCL backend (internal: it was selected)"),
            rank,
        )),
    }
}

/// Whether a run of the stage list uses hpZ or qgZ (`Some`), and with which
/// `zero.ranks_per_node` (`Some(None)`: nodes found from the launch); the runs must agree.
fn wanted_ranks_per_node(loaded: &[LoadedConfig]) -> anyhow::Result<Option<Option<usize>>> {
    let mut wanted = loaded
        .iter()
        .map(|l| &l.config.zero)
        .filter(|z| z.hierarchical())
        .map(|z| z.ranks_per_node);
    let Some(first) = wanted.next() else {
        return Ok(None);
    };
    if let Some(other) = wanted.find(|&l| l != first) {
        return Err(anyhow!(
            "the runs of this stage list set zero.ranks_per_node to {first} and {other}; give one value (0: found from the launch)"
        ));
    }
    Ok(Some((first > 0).then_some(first)))
}

/// `mine` with rank 0's NCCL presence and CUDA-aware probe (a broadcast).
fn agreed_facts(comm: &WorldComm, mine: zero_comm::Facts) -> anyhow::Result<zero_comm::Facts> {
    let tri = |b: Option<bool>| b.map_or(-1, i32::from);
    let from = |v: i32| (v >= 0).then_some(v == 1);
    let env = mine.cuda_aware.env;
    let mut v = [
        i32::from(mine.nccl_present),
        tri(mine.cuda_aware.library),
        tri(env.map(|(_, on)| on)),
    ];
    comm.broadcast(&mut v[..], 0)
        .map_err(|e| anyhow!("agreeing on the comm backend: {e}"))?;
    Ok(zero_comm::Facts {
        nccl_present: v[0] == 1,
        cuda_aware: zero_comm::backend::CudaAware {
            library: from(v[1]),
            // The variable's name is the same convention everywhere; rank 0's value.
            env: from(v[2]).map(|on| (env.map_or("OMPI_MCA_opal_cuda_support", |(n, _)| n), on)),
        },
        ..mine
    })
}

/// The NCCL library can be loaded (only asked in a build with the NCCL backend).
fn nccl_present() -> bool {
    #[cfg(feature = "nccl")]
    {
        zero_comm::nccl::present()
    }
    #[cfg(not(feature = "nccl"))]
    {
        false
    }
}

/// Seed of the simulated GPU's scheduling choices (`--device sim-gpu`), plus the rank.
const SIM_GPU_SEED: u64 = 0x5157_6770;

/// Train on CUDA GPU `ordinal`, or (`None`) the GPU of this rank's node-local rank.
#[cfg(feature = "cuda")]
fn on_cuda(
    args: &TrainArgs,
    loaded: Vec<LoadedConfig>,
    comm: &WorldComm,
    ordinal: Option<usize>,
    backend: zero_comm::Backend,
) -> Result<(), Failure> {
    let ordinal = match ordinal {
        Some(o) => o,
        None => agree(comm, local_gpu(comm))?,
    };
    let dev = agree(comm, crate::device::cuda::open(ordinal))?;
    if args.no_overlap {
        // Whatever ZERO_CUDA_STAGED says: the host waits for each staged collective.
        dev.set_overlap(false);
    }
    with_backend(args, loaded, comm, backend, &dev)
}

/// This rank's GPU from its node-local rank (collective: the shared-memory split). Where
/// the driver is missing or shows no GPU, GPU 0, and opening it says what is wrong.
#[cfg(feature = "cuda")]
pub(crate) fn local_gpu(comm: &WorldComm) -> anyhow::Result<usize> {
    let (local, ranks) = world::node_rank(comm)?;
    let visible = zero_kernels::cuda::CudaDevice::count().unwrap_or(0);
    if visible == 0 {
        return Ok(0);
    }
    // Slurm bound each task its own GPU (slurm/README.md): --gpus-per-task, or
    // --gpu-bind=single:1. (One visible GPU alone proves nothing: a one-GPU node shows
    // the same GPU to every task, and those ranks must not share it unasked.)
    let env = |v: &str| std::env::var(v).ok().filter(|x| !x.trim().is_empty());
    let per_task = env("SLURM_GPUS_PER_TASK").is_some()
        || env("SLURM_GPU_BIND").is_some_and(|v| v.contains("single"));
    let share = std::env::var("ZERO_SHARE_GPUS").is_ok_and(|v| v.trim() == "1");
    Ok(zero_comm::gpu_for_rank(
        local, ranks, visible, per_task, share,
    )?)
}

/// Without the `cuda` feature: say how to build with it.
#[cfg(not(feature = "cuda"))]
fn on_cuda(
    _args: &TrainArgs,
    _loaded: Vec<LoadedConfig>,
    comm: &WorldComm,
    ordinal: Option<usize>,
    _backend: zero_comm::Backend,
) -> Result<(), Failure> {
    let device = ordinal.map_or("cuda".to_string(), |o| format!("cuda:{o}"));
    Err(Failure::same_everywhere(
        anyhow!(
            "--device {device}: this zero-bench was built without the `cuda` feature; build \
             it with `cargo build -p zero-bench --release --features nccl` (CUDA and NCCL; or \
             the carried GPU build: --no-default-features --features nccl), or train with \
             --device host"
        ),
        comm.rank(),
    ))
}

/// The rest of `train` on `dev`, the engine's collectives on `engine_comm` (everything
/// else, agreement included, on `comm`).
#[allow(clippy::too_many_arguments)]
fn run_with<E: Communicator, D: BenchDevice>(
    args: &TrainArgs,
    mut loaded: Vec<LoadedConfig>,
    comm: &WorldComm,
    engine_comm: &E,
    nodes: Option<&zero_comm::NodeGroups<E>>,
    dev: &D,
    backend: zero_comm::Backend,
) -> Result<(), Failure> {
    let rank = comm.rank();
    let same = |e: anyhow::Error| Failure::same_everywhere(e, rank);
    if rank == 0 {
        outln!(
            "resolved configuration ({} rank(s) on {}{}):",
            comm.size(),
            dev.describe(),
            if loaded.len() > 1 {
                format!(", zero.stage set per run: {}", stage_list(&loaded))
            } else {
                String::new()
            }
        );
        out!("{}", loaded[0].render());
    }
    // The memory guard (and the automatic stage) before anything is allocated.
    let device_memory = dev.free_memory().map(|free| (free, dev.describe()));
    let fitted = fit_to_budget(
        args,
        &mut loaded,
        comm.size(),
        rank,
        Some(comm),
        device_memory,
        rank == 0,
    );
    agree(comm, fitted)?;
    let first = &loaded[0];

    // Set-up shared by every stage; each step agreed on across ranks.
    let c = &first.config;
    let vocab = run::model_preset(c).map_err(same)?.vocab_size();
    let tokens = agree(comm, data::open(c, vocab))?;
    let tokens_at_start = data::check(comm, &tokens, c).map_err(same)?;
    let init_path = match (&args.init_from, &args.resume) {
        (Some(path), Some(ckpt)) => {
            if rank == 0 {
                log::warn!(
                    "--init-from {} is ignored: --resume {} continues the trained run (a requeued job passes both)",
                    path.display(),
                    ckpt.display()
                );
            }
            None
        }
        (from, _) => from.as_ref(),
    };
    let init = match init_path {
        Some(path) => {
            let preset = run::model_preset(c).map_err(same)?;
            let file = agree(
                comm,
                init_from::check_hf_config(path, &preset)
                    .and_then(|()| init_from::InitFile::open(path, &preset.spec())),
            )?;
            if rank == 0 {
                file.log_unused();
            }
            Some(file)
        }
        None => None,
    };
    // Outputs writable and not inputs, checkpoint directory writable, resume
    // consistent: before step 1.
    agree(
        comm,
        match rank {
            0 => outputs::check(args, c),
            _ => Ok(()),
        },
    )?;
    let resume = checkpoints::prepare(comm, args, &loaded)?;
    let metrics_file = c.train.metrics_file.as_deref().map(Path::new);
    let mut metrics = agree(
        comm,
        match (metrics_file, &resume) {
            (Some(p), Some(r)) if rank == 0 => metrics::Metrics::resume(p, r.step()).map(Some),
            (Some(p), None) if rank == 0 => metrics::Metrics::create(p).map(Some),
            _ => Ok(None),
        },
    )?;

    let mut results: Vec<StageResult> = Vec::with_capacity(loaded.len());
    // With a stage list, rank 0 rewrites the --json report (whole) after each run of the
    // first round and when a run stops with an error every rank agreed on, so that the
    // stages that finished survive a later one's failure (a sweep tables them). A file
    // left by a job that ended otherwise (a rank's own error aborts the job, a kill)
    // still says the run did not complete.
    let stage_list_numbers: Vec<usize> = loaded
        .iter()
        .map(|l| l.config.zero.stage.number())
        .collect();
    let partial_json = args
        .json
        .as_deref()
        .filter(|p| rank == 0 && loaded.len() > 1 && !outputs::is_special(p));
    let write_partial = |results: &[StageResult], stopped: String| {
        if let Some(path) = partial_json {
            let mut results = results.to_vec();
            report::set_ratios(&mut results);
            let value = report_json(
                comm.size(),
                dev.describe(),
                backend,
                staging_report(engine_comm, nodes, false),
                &stage_list_numbers,
                &results,
                Some(stopped),
            );
            // The final report (or the job's error) says the rest; a failure to write
            // this one costs only the partial result.
            if let Err(e) = write_report(path, &value) {
                log::warn!("the partial --json report: {}", crate::logging::chain(&e));
            }
        }
    };
    for round in 0..args.rounds {
        for (i, l) in loaded.iter().enumerate() {
            let last = round + 1 == args.rounds && i + 1 == loaded.len();
            let shared = run::Shared {
                tokens: &tokens,
                tokens_at_start,
                init: init.as_ref(),
                save_model: args.save_model.as_deref().filter(|_| last),
                checkpoints: run::Checkpoints {
                    dir: args.ckpt_dir.as_deref(),
                    every: args.save_every,
                    keep_last: args.keep_last,
                    resume: resume.as_ref(),
                },
                plain: args.no_progress,
                quiet: round > 0,
            };
            let mut no_metrics = None;
            let m = if round == 0 {
                &mut metrics
            } else {
                &mut no_metrics
            };
            let r = match run::train(comm, engine_comm, nodes, dev, l, &shared, m) {
                Ok(r) => r,
                Err(f) => {
                    write_partial(
                        &results,
                        format!(
                            "the {} run{} failed: {}",
                            l.config.zero.stage,
                            round_note(round, args.rounds),
                            crate::logging::chain(&f.error)
                        ),
                    );
                    return Err(f);
                }
            };
            if round == 0 {
                if rank == 0 {
                    summary(&r, c.data.path == "builtin");
                    if let Some(t) = &r.nodes {
                        outln!("{}", t.render(r.stage));
                    }
                    if let Some(o) = &r.overlap {
                        outln!("{}", o.render(r.stage));
                    }
                }
                results.push(r);
                if !last {
                    let next = match loaded.get(i + 1) {
                        Some(next) => format!("the {} run", next.config.zero.stage),
                        None => format!("round 2 of {}", args.rounds),
                    };
                    write_partial(
                        &results,
                        format!(
                            "{next} did not finish (this report was written after the {} run; the job's log says why it ended)",
                            l.config.zero.stage
                        ),
                    );
                }
            } else {
                report::add_round(&mut results[i], &r);
            }
            // Start the next run together (fair timing, RSS reset after the last drop).
            comm.barrier()
                .map_err(|e| Failure::same_everywhere(anyhow!("barrier: {e}"), rank))?;
            // A stop signal during a run that then finished: start no further run.
            let signal = signals::agreed(comm).map_err(same)?;
            if let (Some(sig), false) = (signal, last) {
                let (what, code) = match args.ckpt_dir.as_deref() {
                    Some(dir) => (
                        format!("its checkpoint is in {}", dir.display()),
                        launch::PREEMPTED_EXIT_CODE,
                    ),
                    None => ("no --ckpt-dir was given".to_string(), 1),
                };
                let error = anyhow!(
                    "stopped by {} after the {} run of the stage list ({what}); the runs after it did not start",
                    signals::name(sig),
                    l.config.zero.stage
                );
                write_partial(&results, error.to_string());
                return Err(Failure {
                    error,
                    print: rank == 0,
                    code,
                });
            }
        }
        if rank == 0 && args.rounds > 1 {
            log::info!("round {}/{} of the stage list done", round + 1, args.rounds);
        }
    }
    report::set_ratios(&mut results);
    let staging = staging_report(engine_comm, nodes, rank == 0);
    // Rank 0 writes the report; the others wait to hear that it did (returning alone,
    // it would leave them in the collective below until their watchdog fired).
    let mut reported = Ok(());
    if rank == 0 {
        if results.len() > 1 {
            outln!("\n=== stages compared ({} rank(s)) ===", comm.size());
            out!("{}", report::stage_table(&results));
        }
        if let Some(path) = &args.json {
            reported = write_json(
                path,
                &report_json(
                    comm.size(),
                    dev.describe(),
                    backend,
                    staging,
                    &stage_list_numbers,
                    &results,
                    None,
                ),
            );
        }
        if let Some(p) = metrics_file {
            outln!("metrics: {}", p.display());
        }
    }
    agree(comm, reported)?;
    // Training finished (its checkpoints and model file are written), but steps are
    // missing from the metrics file: not a clean exit.
    let lost = metrics.as_ref().and_then(|m| m.failure());
    agree(comm, lost.map_or(Ok(()), |why| Err(anyhow!("{why}"))))?;
    Ok(())
}

/// Host staging (mpi-staged) so far, for the `--json` report: host memory held beside
/// the device ledger, and the copies, which are not network bytes (the step ledgers
/// count those, as for every backend); hpZ and qgZ: the node groups' staging too. `None`
/// without staging. Logs a line when `log`.
fn staging_report<E: Communicator>(
    engine_comm: &E,
    nodes: Option<&zero_comm::NodeGroups<E>>,
    log: bool,
) -> Option<serde_json::Value> {
    let groups = nodes.into_iter().flat_map(|g| [&g.node, &g.cross]);
    let stagings: Vec<_> = std::iter::once(engine_comm)
        .chain(groups)
        .filter_map(|c| c.staging())
        .collect();
    let held: u64 = stagings.iter().map(|s| s.held_bytes()).sum();
    let (to_host, to_device, calls) = stagings.iter().fold((0, 0, 0), |(h, d, n), s| {
        let c = s.stats();
        (h + c.to_host, d + c.to_device, n + c.calls)
    });
    if let (true, Some(st)) = (log, stagings.first()) {
        log::info!(
            "host staging: {} held ({} communicator(s) x 2 slots x send + receive of {} each); {} copied to host and {} to the device in {} collectives",
            zero_core::ledger::human_bytes(held as f64),
            stagings.len(),
            zero_core::ledger::human_bytes(st.capacity() as f64),
            zero_core::ledger::human_bytes(to_host as f64),
            zero_core::ledger::human_bytes(to_device as f64),
            calls
        );
    }
    (!stagings.is_empty()).then(|| {
        serde_json::json!({
            "held_bytes": held,
            "to_host_bytes": to_host,
            "to_device_bytes": to_device,
            "collectives": calls,
        })
    })
}

/// The `--json` report of a run: `stages` has a result per finished run,
/// `stages_requested` the stage list (`--stages`, one per run of a round),
/// `stages_completed` the stages of `stages`, and `stopped` why the report is not
/// complete (`null` once every run finished).
fn report_json(
    world: usize,
    device: String,
    backend: zero_comm::Backend,
    staging: Option<serde_json::Value>,
    stage_list: &[usize],
    results: &[StageResult],
    stopped: Option<String>,
) -> serde_json::Value {
    let completed: Vec<usize> = results.iter().map(|r| r.stage).collect();
    serde_json::json!({
        "world": world,
        "device": device,
        "comm": backend.name(),
        "staging": staging,
        "stages_requested": stage_list,
        "stages_completed": completed,
        "complete": stopped.is_none(),
        "stopped": stopped,
        "stages": results,
    })
}

/// " (round R of ROUNDS)" with `--rounds`, else nothing.
fn round_note(round: usize, rounds: usize) -> String {
    if rounds > 1 {
        format!(" (round {} of {rounds})", round + 1)
    } else {
        String::new()
    }
}

fn stage_list(loaded: &[LoadedConfig]) -> String {
    let s: Vec<String> = loaded
        .iter()
        .map(|l| l.config.zero.stage.number().to_string())
        .collect();
    s.join(",")
}

/// Resolve each rank's memory budget, choose the stage where it is `"auto"`, and refuse
/// a plan over the budget (collective under MPI). Rank 0 prints when `print`.
fn fit_to_budget(
    args: &TrainArgs,
    loaded: &mut [LoadedConfig],
    world: usize,
    rank: usize,
    comm: Option<&WorldComm>,
    device_memory: Option<(u64, String)>,
    print: bool,
) -> anyhow::Result<()> {
    let budget = budget::resolve(args.mem_limit, args.mem_headroom, comm, device_memory)?;
    if print {
        if let Some(b) = &budget {
            log::info!(
                "memory budget per rank: {} ({})",
                zero_core::ledger::human_bytes(b.bytes as f64),
                b.source
            );
        }
    }
    for l in loaded.iter_mut() {
        if l.auto_stage {
            let Some(b) = &budget else {
                return Err(anyhow!(
                    "zero.stage = \"auto\" chooses from a memory budget, and there is none: give --mem-limit SIZE (a dry run outside MPI, or --mem-limit none, has no budget)"
                ));
            };
            let (stage, table) = budget::choose_stage(&l.config, world, rank, b, comm)?;
            if print {
                out!("{table}");
            }
            l.config.zero.stage = stage;
        }
        if let Some(b) = &budget {
            budget::guard(&l.config, world, rank, b)?;
        }
    }
    Ok(())
}

fn dry_run(
    args: &TrainArgs,
    loaded: &mut [LoadedConfig],
    comm: Option<&WorldComm>,
) -> anyhow::Result<()> {
    let (rank, world) = match comm {
        Some(c) => {
            if let Some(w) = args.world.filter(|&w| w != c.size()) {
                return Err(anyhow!(
                    "--world {w} under an MPI launcher of {} ranks: the dry run plans the real world size; drop --world or launch {w} ranks",
                    c.size()
                ));
            }
            (c.rank(), c.size())
        }
        None => (0, args.world.unwrap_or(1)),
    };
    if world == 0 {
        return Err(anyhow!("--world 0: plan for at least 1 rank"));
    }
    let most = crate::plan::units::MAX_RANKS;
    if world as u64 > most {
        return Err(anyhow!(
            "--world {world}: the dry run plans every rank, for at most {most} ranks"
        ));
    }
    // hpZ/qgZ under a launcher: plan for the nodes the launch has (as a run does).
    if let (Some(c), Some(wanted)) = (comm, wanted_ranks_per_node(loaded)?) {
        let g = crate::world::node_groups(c, wanted)?;
        for l in loaded.iter_mut() {
            l.set_ranks_per_node(g.node.size());
        }
    }
    let show = args.rank.unwrap_or(0);
    if show >= world {
        return Err(anyhow!(
            "--rank {show} is out of range for {world} rank(s) (ranks are 0..{})",
            world - 1
        ));
    }
    let print = rank == 0;
    if print {
        outln!(
            "resolved configuration (dry run, {world} rank(s){}):",
            if loaded.len() > 1 {
                format!(", zero.stage set per run: {}", stage_list(loaded))
            } else {
                String::new()
            }
        );
        out!("{}", loaded[0].render());
    }
    fit_to_budget(args, loaded, world, show, comm, None, print)?;
    let staged = args.comm == zero_comm::CommChoice::MpiStaged;
    let json = print && args.json.is_some();
    let plans = dry_run::plan(loaded, world, show, print, staged, json)?;
    if let Some(path) = &args.init_from {
        // Pre-flight: the file fits the model (names, shapes, types), read nothing else.
        let preset = run::model_preset(&loaded[0].config)?;
        init_from::check_hf_config(path, &preset)?;
        let file = init_from::InitFile::open(path, &preset.spec())?;
        if print {
            outln!(
                "--init-from {} ({}): every tensor of the model present with its shape{}",
                path.display(),
                file.describe(),
                if file.extra().is_empty() {
                    String::new()
                } else {
                    format!(" ({} extra tensor(s) would be ignored)", file.extra().len())
                }
            );
        }
    }
    if let (Some(path), Some(plans)) = (&args.json, &plans) {
        write_json(path, plans)?;
    }
    Ok(())
}

fn write_json(path: &Path, value: &serde_json::Value) -> anyhow::Result<()> {
    write_report(path, value)?;
    outln!("report written to {}", path.display());
    Ok(())
}

/// Write `value` to `path` whole (a reader never sees half of it).
fn write_report(path: &Path, value: &serde_json::Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("serialising the report")?;
    crate::outfile::write_text(path, &(text + "\n"))
}

/// Rank 0's end-of-run lines for one stage.
fn summary(r: &StageResult, builtin: bool) {
    let first = r.losses.first().copied().unwrap_or(f64::NAN);
    outln!(
        "summary ZeRO-{}: {} steps, loss {first:.4} -> {:.4}{}, {} tok/s, {:.1} ms/step (after the first), \
         ledger {} per rank (ZeRO formula {}), peak RSS {}",
        r.stage,
        r.steps,
        r.final_loss,
        if builtin {
            format!(" (corpus entropy floor {:.4})", builtin_floor())
        } else {
            String::new()
        },
        progress::si(r.tokens_per_s),
        r.mean_step_seconds * 1e3,
        zero_core::ledger::human_bytes(
            r.ledger_bytes_per_rank.iter().copied().max().unwrap_or(0) as f64
        ),
        zero_core::ledger::human_bytes(r.formula_bytes_per_rank),
        zero_core::ledger::human_bytes(
            r.peak_rss_bytes_per_rank.iter().copied().max().unwrap_or(0) as f64
        ),
    );
}

/// The built-in corpus's entropy rate: no model's expected loss is below it (computed
/// once; a power iteration over 4096 contexts).
fn builtin_floor() -> f64 {
    static FLOOR: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *FLOOR.get_or_init(|| zero_models::data::MarkovSource::default_source().entropy_rate())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brought() -> Vec<(String, usize)> {
        [
            ("model.vocab_size", 64),
            ("model.context_len", 8),
            ("model.heads", 2),
            ("train.seq_len", 8),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect()
    }

    #[test]
    fn the_presets_values_follow_only_an_error_about_them() {
        // An error about another key is left as it is: no preset line before or after.
        let e = with_preset_note(
            anyhow!("config error in command line (--set): invalid type: string \"abc\", expected f64 in `optim.lr`"),
            "tiny",
            &brought(),
        );
        let text = crate::logging::chain(&e);
        assert!(text.starts_with("config error"), "{text}");
        assert!(!text.contains("--model"), "{text}");
        // One about a dimension the preset set: the error first, then the value named.
        let e = with_preset_note(
            anyhow!("invalid configuration:\n  - model.heads (2) must divide model.width (15)"),
            "tiny",
            &brought(),
        );
        let text = crate::logging::chain(&e);
        assert!(text.starts_with("invalid configuration:"), "{text}");
        assert!(
            text.ends_with("(--model tiny set model.heads = 2; --set KEY=VALUE changes it)"),
            "{text}"
        );
        assert!(!text.contains("vocab_size"), "{text}");
    }

    #[test]
    fn keys_are_named_whole() {
        assert!(names_key("model.heads (3) must", "model.heads"));
        assert!(names_key("raise model.context_len", "model.context_len"));
        assert!(!names_key("model.heads_kv (3)", "model.heads"));
        assert!(!names_key("xmodel.heads", "model.heads"));
        assert!(!names_key("optim.lr", "model.heads"));
    }
}
