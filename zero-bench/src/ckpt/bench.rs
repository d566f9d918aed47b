//! `ckpt bench` (under mpirun): save and load throughput of a sharded checkpoint, per
//! rank and in aggregate, next to a plain sequential write (+ fsync) and read of the same
//! number of bytes per rank to the same directory in the same run. Reported as ratios;
//! nothing is asserted (the machine is shared). Both reads come from the page cache
//! when the files are fresh, which is the same for both sides of the comparison.

use std::io::Write;
use std::time::Instant;

use crate::config::Config;
use anyhow::{anyhow, Context};
use zero_comm::Communicator;
use zero_core::checkpoint::{self, SaveOptions};
use zero_core::config::Stage;
use zero_core::Engine;
use zero_kernels::device::HostDevice;
use zero_models::{Gpt, GptConfig};

use super::args::BenchArgs;

/// The benchmark's own directory inside `--dir`.
const WORK_DIR: &str = "zero-ckpt-bench";

/// Seconds of `f` on the slowest rank (barrier before, max-reduce after).
fn timed<C: Communicator>(comm: &C, f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    comm.barrier()?;
    let t = Instant::now();
    let r = f();
    let mut secs = [t.elapsed().as_secs_f64()];
    comm.all_reduce(&mut secs[..], zero_comm::ReduceOp::Max)?;
    r?;
    Ok(secs[0])
}

/// Run `ckpt bench`.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    // `comm` is dropped before what is left of `up` (MPI finalised last).
    let up = crate::world::init("ckpt bench")?;
    let comm = up.comm;
    let (rank, world) = (comm.rank(), comm.size());
    let mut cfg = Config::default();
    cfg.zero.stage = match args.stage {
        0 => Stage::Zero0,
        1 => Stage::Zero1,
        2 => Stage::Zero2,
        3 => Stage::Zero3,
        s => anyhow::bail!("--stage {s}: ZeRO stages are 0-3"),
    };
    cfg.train.micro_batch = 1;
    cfg.train.seq_len = 64;
    let gpt = GptConfig {
        vocab_size: args.vocab,
        max_seq_len: 64,
        n_layer: args.n_layer,
        n_head: 4,
        n_embd: args.n_embd,
        vocab_block_rows: None,
        checkpoint_every: 0,
    };
    let dev = HostDevice::new();
    let model = Gpt::<HostDevice, f32>::new(&dev, gpt, 1).map_err(|e| anyhow!("model: {e}"))?;
    let mut engine =
        Engine::new(&cfg.engine(), &comm, &dev, &model).map_err(|e| anyhow!("engine: {e}"))?;
    let bytes = (engine.layout().shard_numel() * 12) as u64;
    // Everything goes into a directory of our own, made here and removed at the end:
    // `--dir` may be a real run's checkpoint root, which must not be touched.
    let work = args.dir.join(WORK_DIR);
    let mut made = [0i64];
    if rank == 0 {
        made[0] = match std::fs::create_dir_all(&args.dir).and_then(|_| std::fs::create_dir(&work))
        {
            Ok(()) => 1,
            Err(e) => {
                log::error!("creating {}: {e}", work.display());
                0
            }
        };
    }
    comm.broadcast(&mut made[..], 0)?;
    anyhow::ensure!(
        made[0] == 1,
        "could not create the benchmark's own directory {} (it must not exist yet: remove one left by an interrupted bench, or choose another --dir)",
        work.display()
    );
    let result = measure(args, &comm, &mut engine, &work, bytes);
    comm.barrier()?;
    if rank == 0 {
        if let Err(e) = std::fs::remove_dir_all(&work) {
            log::warn!("could not remove {}: {e}", work.display());
        }
    }
    let [save, load, write, read] = result?;
    if rank == 0 {
        let mb = |s: f64| bytes as f64 / s / 1e6;
        println!(
            "ckpt bench: {world} ranks, stage {}, {} parameters, {:.1} MB of fp32 master+m+v per rank ({:.1} MB in all), best of {}",
            args.stage,
            engine.layout().numel(),
            bytes as f64 / 1e6,
            (bytes * world as u64) as f64 / 1e6,
            args.repeat.max(1)
        );
        println!("             per rank MB/s   aggregate MB/s   vs plain");
        for (what, s, base) in [("save", save, write), ("load", load, read)] {
            let plain_name = if what == "save" {
                "write+fsync"
            } else {
                "read"
            };
            println!(
                "{what:<12} {:>14.0} {:>16.0} {:>10.2}x",
                mb(s),
                mb(s) * world as f64,
                base / s
            );
            println!(
                "plain {plain_name:<6} {:>14.0} {:>16.0}",
                mb(base),
                mb(base) * world as f64
            );
        }
    }
    Ok(())
}

/// The best save, load, plain write and plain read seconds over `--repeat` rounds, all
/// inside `work`.
fn measure<C: Communicator>(
    args: &BenchArgs,
    comm: &C,
    engine: &mut Engine<'_, HostDevice, C>,
    work: &std::path::Path,
    bytes: u64,
) -> anyhow::Result<[f64; 4]> {
    let rank = comm.rank();
    let plain = work.join(format!("plain-rank-{rank:05}.bin"));
    let root = work.join("ckpt");
    let payload = vec![0x5au8; bytes as usize];
    let keep = SaveOptions {
        keep_last: 1,
        ..Default::default()
    };
    let (mut save, mut load, mut write, mut read) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..args.repeat.max(1) {
        // Start from an empty root: removing the previous checkpoint is not the save's
        // cost, and the plain write below also starts from a fresh file.
        if rank == 0 && root.exists() {
            std::fs::remove_dir_all(&root)
                .with_context(|| format!("removing {}", root.display()))?;
        }
        if plain.exists() {
            std::fs::remove_file(&plain)
                .with_context(|| format!("removing {}", plain.display()))?;
        }
        save = save.min(timed(comm, || {
            checkpoint::save(engine, &root, &keep)
                .map(|_| ())
                .context("save")
        })?);
        load = load.min(timed(comm, || {
            checkpoint::load(engine, &root).map(|_| ()).context("load")
        })?);
        write = write.min(timed(comm, || {
            let mut f = std::fs::File::create(&plain)
                .with_context(|| format!("create {}", plain.display()))?;
            f.write_all(&payload).context("plain write")?;
            f.sync_all().context("plain fsync")
        })?);
        read = read.min(timed(comm, || {
            let back = std::fs::read(&plain).context("plain read")?;
            anyhow::ensure!(
                back.len() == payload.len(),
                "plain read returned {} bytes",
                back.len()
            );
            Ok(())
        })?);
    }
    Ok([save, load, write, read])
}
