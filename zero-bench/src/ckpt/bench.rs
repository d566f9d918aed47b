//! `ckpt bench` (under mpirun): save and load throughput of a sharded checkpoint, per
//! rank and in aggregate, next to a plain sequential write (+ fsync) and read of the same
//! number of bytes per rank to the same directory in the same run. Reported as ratios;
//! nothing is asserted (the machine is shared). Both reads come from the page cache
//! when the files are fresh, which is the same for both sides of the comparison, and
//! both read into memory allocated (and touched) before the timing. At stage 0 every
//! rank loads all N shard files, so its plain read reads all N plain files too, and
//! load's MB/s count those N times the bytes.
//!
//! Failures follow `train`'s rule (train/launch.rs): every step that may fail on some
//! ranks only (a full disk on one node, rank 0's own directory operations) is agreed on,
//! so every rank returns the error at the same point, rank 0 prints it once naming the
//! failing rank(s), and every rank exits with status 1. An error that cannot be agreed
//! (a collective that failed) ends the whole job at once (`zero_comm::abort`) with the
//! failing rank's message, rather than leave its peers waiting in a collective or in
//! MPI_Finalize until the watchdog.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use crate::config::Config;
use anyhow::{anyhow, Context};
use zero_comm::{CommError, Communicator};
use zero_core::checkpoint::{self, SaveOptions};
use zero_core::config::Stage;
use zero_core::{CheckpointError, Engine, EngineError};
use zero_kernels::device::HostDevice;
use zero_models::{Gpt, GptConfig};

use super::args::BenchArgs;
use crate::logging::outln;
use crate::train::launch::{agree, Failure};

/// The benchmark's own directory inside `--dir`.
const WORK_DIR: &str = "zero-ckpt-bench";

/// Run `ckpt bench`. On failure one rank prints the error, then every rank shuts MPI
/// down and exits with status 1.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let up = crate::world::init("ckpt bench")?;
    let (rank, world) = (up.comm.rank(), up.comm.size());
    crate::logging::init(Some((rank, world)));
    match bench(args, &up.comm) {
        Ok(()) => Ok(()),
        Err(f) => {
            // Before MPI_Finalize, as `train` does: finalising waits for every rank.
            if f.print {
                zero_comm::line_to_stderr(&format!("error: {}", crate::logging::chain(&f.error)));
            }
            // Every rank returned this failure at the same point: MPI_Finalize returns.
            drop(up);
            std::process::exit(f.code)
        }
    }
}

/// A collective of the bench itself failed: the ranks may be at different points, so
/// say why on this rank and end the whole job (returning would finalise MPI, which
/// waits for ranks that are elsewhere).
fn broken(what: &str, e: CommError) -> ! {
    zero_comm::abort(&format!("error: ckpt bench: {what}: {e}"), 1)
}

/// Seconds of `f` on the slowest rank (barrier before, agreement and max-reduce after).
/// When `f` fails on any rank, every rank returns the failure here.
fn timed<C: Communicator>(
    comm: &C,
    f: impl FnOnce() -> anyhow::Result<()>,
) -> Result<f64, Failure> {
    if let Err(e) = comm.barrier() {
        broken("the barrier before a timed part", e)
    }
    let t = Instant::now();
    let r = f();
    let mut secs = [t.elapsed().as_secs_f64()];
    agree(comm, r)?;
    if let Err(e) = comm.all_reduce(&mut secs[..], zero_comm::ReduceOp::Max) {
        broken("the slowest rank's time", e)
    }
    Ok(secs[0])
}

/// A save or load error. Those the checkpoint code agreed on (every rank returns one at
/// the same point) go on to [`timed`]'s agreement; any other (a failed collective inside)
/// may leave the ranks at different points, so this rank says why and ends the job.
fn checkpoint_error(e: CheckpointError, what: &str, world: usize) -> anyhow::Error {
    let agreed = world == 1
        || matches!(
            e,
            CheckpointError::Ranks { .. }
                | CheckpointError::Invalid(_)
                | CheckpointError::Differs { .. }
                | CheckpointError::Engine(
                    EngineError::Mismatch(_)
                        | EngineError::PeerImport { .. }
                        | EngineError::ImportIncomplete { .. }
                )
        );
    let e = anyhow::Error::new(e).context(what.to_string());
    if !agreed {
        zero_comm::abort(
            &format!("error: ckpt bench: {}", crate::logging::chain(&e)),
            1,
        )
    }
    e
}

/// Rank 0's part: `--dir` and the benchmark's own directory inside it.
fn make_work_dir(dir: &Path, work: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow!("creating --dir {}: {e}", dir.display()))?;
    std::fs::create_dir(work).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            anyhow!(
                "the benchmark's own directory {} exists already ({e}): remove one left by an interrupted bench, or choose another --dir",
                work.display()
            )
        } else {
            anyhow!(
                "creating the benchmark's own directory {}: {e}",
                work.display()
            )
        }
    })
}

/// `--repeat`: the rounds to take the best of, at least one.
fn rounds(repeat: usize) -> anyhow::Result<usize> {
    if repeat == 0 {
        return Err(anyhow!(
            "--repeat 0: give at least 1 round (the best of --repeat rounds is reported)"
        ));
    }
    Ok(repeat)
}

/// The bench on `comm`: every failure agreed, or the job aborted.
fn bench<C: Communicator>(args: &BenchArgs, comm: &C) -> Result<(), Failure> {
    let (rank, world) = (comm.rank(), comm.size());
    // From the command line: the same on every rank.
    let same = |error: anyhow::Error| Failure::same_everywhere(error, rank);
    let mut cfg = Config::default();
    cfg.zero.stage = match args.stage {
        0 => Stage::Zero0,
        1 => Stage::Zero1,
        2 => Stage::Zero2,
        3 => Stage::Zero3,
        s => return Err(same(anyhow!("--stage {s}: ZeRO stages are 0-3"))),
    };
    let repeat = rounds(args.repeat).map_err(same)?;
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
    // Agreed: allocation may fail on some ranks only.
    let model = agree(
        comm,
        Gpt::<HostDevice, f32>::new(&dev, gpt, 1).map_err(|e| anyhow!("model: {e}")),
    )?;
    let mut engine = agree(
        comm,
        Engine::new(&cfg.engine(), comm, &dev, &model).map_err(|e| anyhow!("engine: {e}")),
    )?;
    let bytes = (engine.layout().shard_numel() * 12) as u64;
    // What one rank loads: its own shard file, or at stage 0 every rank's (the whole
    // state, zero-core/src/checkpoint/load.rs), which its plain read matches.
    let files_read = if args.stage == 0 { world } else { 1 };
    let read_bytes = bytes * files_read as u64;
    // Everything goes into a directory of our own, made here and removed at the end:
    // `--dir` may be a real run's checkpoint root, which must not be touched.
    let work = args.dir.join(WORK_DIR);
    let made = if rank == 0 {
        make_work_dir(&args.dir, &work)
    } else {
        Ok(())
    };
    agree(comm, made)?;
    let result = measure(repeat, comm, &mut engine, &work, bytes, files_read);
    // Whether it succeeded or failed, `measure` ended in an agreement: every rank is done
    // with the files.
    if rank == 0 {
        if let Err(e) = std::fs::remove_dir_all(&work) {
            log::warn!("could not remove {}: {e}", work.display());
        }
    }
    let [save, load, write, read] = result?;
    if rank == 0 {
        outln!(
            "ckpt bench: {world} ranks, stage {}, {} parameters, {:.1} MB of fp32 master+m+v per rank ({:.1} MB in all), best of {}",
            args.stage,
            engine.layout().numel(),
            bytes as f64 / 1e6,
            (bytes * world as u64) as f64 / 1e6,
            repeat
        );
        if files_read > 1 {
            outln!(
                "# stage 0: each rank loads all {world} shard files ({:.1} MB), and its plain read reads all {world} plain files; load's MB/s count those bytes",
                read_bytes as f64 / 1e6
            );
        }
        outln!("             per rank MB/s   aggregate MB/s   vs plain");
        for (what, s, base, moved) in [
            ("save", save, write, bytes),
            ("load", load, read, read_bytes),
        ] {
            let mb = |s: f64| moved as f64 / s / 1e6;
            let plain_name = if what == "save" {
                "write+fsync"
            } else {
                "read"
            };
            outln!(
                "{what:<12} {:>14.0} {:>16.0} {:>10.2}x",
                mb(s),
                mb(s) * world as f64,
                base / s
            );
            outln!(
                "plain {plain_name:<6} {:>14.0} {:>16.0}",
                mb(base),
                mb(base) * world as f64
            );
        }
    }
    Ok(())
}

/// Rank 0 removes the previous round's checkpoint, each rank its previous plain file.
fn clear(rank: usize, root: &Path, plain: &Path) -> anyhow::Result<()> {
    if rank == 0 && root.exists() {
        std::fs::remove_dir_all(root).with_context(|| format!("removing {}", root.display()))?;
    }
    if plain.exists() {
        std::fs::remove_file(plain).with_context(|| format!("removing {}", plain.display()))?;
    }
    Ok(())
}

/// Rank `rank`'s plain file in `work`.
fn plain_file(work: &Path, rank: usize) -> std::path::PathBuf {
    work.join(format!("plain-rank-{rank:05}.bin"))
}

/// Read all of `path` into `buf` (allocated and touched before the timing, so that the
/// page faults of a fresh buffer are not timed), which must be exactly its size.
fn read_into(path: &Path, buf: &mut [u8]) -> anyhow::Result<()> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    f.read_exact(buf).with_context(|| {
        format!(
            "reading {} ({} bytes were written)",
            path.display(),
            buf.len()
        )
    })?;
    let mut more = [0u8; 1];
    let extra = f
        .read(&mut more)
        .with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        extra == 0,
        "{} is longer than the {} bytes written",
        path.display(),
        buf.len()
    );
    Ok(())
}

/// The best save, load, plain write and plain read seconds over `repeat` rounds (at
/// least one), all inside `work`. The plain read reads `files_read` plain files (this
/// rank's, or at stage 0 every rank's, as the load does). Every failure is agreed on
/// (every rank returns it at the same point).
fn measure<C: Communicator>(
    repeat: usize,
    comm: &C,
    engine: &mut Engine<'_, HostDevice, C>,
    work: &Path,
    bytes: u64,
    files_read: usize,
) -> Result<[f64; 4], Failure> {
    let (rank, world) = (comm.rank(), comm.size());
    let plain = plain_file(work, rank);
    let reads: Vec<_> = if files_read > 1 {
        (0..world).map(|r| plain_file(work, r)).collect()
    } else {
        vec![plain.clone()]
    };
    let root = work.join("ckpt");
    let payload = vec![0x5au8; bytes as usize];
    // Written through now (not left to page faults inside the timed read).
    let mut back = vec![0xa5u8; bytes as usize];
    let keep = SaveOptions {
        keep_last: 1,
        ..Default::default()
    };
    let (mut save, mut load, mut write, mut read) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..repeat {
        // Start from an empty root: removing the previous checkpoint is not the save's
        // cost, and the plain write below also starts from a fresh file.
        agree(comm, clear(rank, &root, &plain))?;
        save = save.min(timed(comm, || {
            checkpoint::save(engine, &root, &keep)
                .map(|_| ())
                .map_err(|e| checkpoint_error(e, "save", world))
        })?);
        load = load.min(timed(comm, || {
            checkpoint::load(engine, &root)
                .map(|_| ())
                .map_err(|e| checkpoint_error(e, "load", world))
        })?);
        write = write.min(timed(comm, || {
            let mut f = std::fs::File::create(&plain)
                .with_context(|| format!("creating {}", plain.display()))?;
            f.write_all(&payload)
                .with_context(|| format!("writing {}", plain.display()))?;
            f.sync_all()
                .with_context(|| format!("fsync of {}", plain.display()))
        })?);
        read = read.min(timed(comm, || {
            reads.iter().try_for_each(|p| read_into(p, &mut back))
        })?);
    }
    Ok([save, load, write, read])
}

#[cfg(test)]
mod tests {
    #[test]
    fn zero_rounds_are_refused_not_run_as_one() {
        let err = super::rounds(0).unwrap_err().to_string();
        assert!(
            err.contains("--repeat 0") && err.contains("at least 1"),
            "{err}"
        );
        assert_eq!(super::rounds(1).unwrap(), 1);
        assert_eq!(super::rounds(3).unwrap(), 3);
    }
}
