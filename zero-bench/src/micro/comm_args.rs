//! The options of `micro comm`, apart from the benchmark: `--help` lists them in every
//! build, the benchmark itself needs MPI (feature `mpi`).

use std::path::PathBuf;

use zero_comm::DType;

/// Options of `micro comm`.
#[derive(clap::Args, Debug)]
pub struct CommArgs {
    /// Smallest full-buffer size in bytes: KiB, MiB, GiB (or K, M, G) are 1024-based,
    /// kB, MB, GB 1000-based as in train --mem-limit and plan --gpu-mem.
    #[arg(long, default_value = "1KiB", value_parser = parse_size)]
    pub min_size: usize,
    /// Largest full-buffer size; sizes double from --min-size.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    pub max_size: usize,
    /// Element type: f32, f64, bf16, f16, u8, u32, i32, i64.
    #[arg(long, default_value = "f32")]
    pub dtype: DType,
    /// Timed ours/raw call pairs per size and collective at most (>= 1). Each point runs
    /// --bytes-per-point / size pairs, kept within --min-pairs..=--iters: small sizes
    /// run --iters pairs, large ones fewer, never fewer than --min-pairs.
    #[arg(long, default_value_t = 20, value_parser = parse_pairs)]
    pub iters: usize,
    /// Untimed ours/raw pairs before each point.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Timed ours/raw call pairs per size and collective at least, however large the
    /// size (>= 1, and at most --iters). Default: 5, or --iters where that is fewer.
    #[arg(long, value_parser = parse_pairs)]
    pub min_pairs: Option<usize>,
    /// Caps the timed pairs so that each side moves about this many bytes per point.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub bytes_per_point: usize,
    /// Collectives to measure (comma-separated: reduce_scatter, all_gather, all_reduce).
    #[arg(
        long,
        default_value = "reduce_scatter,all_gather,all_reduce",
        value_delimiter = ',',
        value_parser = Op::parse
    )]
    pub ops: Vec<Op>,
    /// Check every collective on every dtype against serial answers first.
    #[arg(long)]
    pub self_test: bool,
    /// A/A control: run the raw MPI call on both sides, to show how far the ratio strays
    /// from 1 by noise alone on this machine (host buffers only).
    #[arg(long)]
    pub raw_vs_raw: bool,
    /// Where the buffers live: host (MPI on host memory), cuda or cuda:N (this rank's GPU: its
    /// node-local rank's, or GPU N), sim-gpu (the simulated GPU: a test tool, its times
    /// measure nothing). With device buffers, --comm picks the transport and the raw
    /// column is its baseline (see --comm).
    #[arg(long, default_value = "host")]
    pub device: crate::device::DeviceChoice,
    /// The transport of device buffers: mpi-staged (host staging; raw = MPI on host
    /// buffers), mpi-cuda (MPI on device pointers; raw = MPI on host buffers), nccl (raw =
    /// the bare NCCL call on the same buffers). Host buffers: mpi (the default, auto).
    #[arg(long, default_value = "auto", value_name = "BACKEND")]
    pub comm: zero_comm::CommChoice,
    /// Time zero-comm's TCP world (`SocketComm`, the world of the build without MPI: a
    /// star through rank 0) as "ours" against raw MPI on the same host buffers. The
    /// ranks meet through a file in the working directory, which every rank must see.
    #[arg(long, conflicts_with = "raw_vs_raw")]
    pub tcp: bool,
    /// Also write the table as CSV here (rank 0).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Also write the table as JSON here (rank 0).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `--min-pairs` when not given (or `--iters` where that is fewer).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
const DEFAULT_MIN_PAIRS: usize = 5;

// Read by the benchmark, which a build without MPI does not have.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
impl CommArgs {
    /// The fewest and the most timed pairs of a point: `--min-pairs` (default
    /// [`DEFAULT_MIN_PAIRS`], or `--iters` where that is fewer) and `--iters`. An error
    /// when `--min-pairs` is above `--iters`.
    pub fn pair_bounds(&self) -> anyhow::Result<(usize, usize)> {
        let most = self.iters;
        match self.min_pairs {
            Some(least) if least > most => anyhow::bail!(
                "--min-pairs {least} is above --iters {most}: --iters is the most timed pairs per point and --min-pairs the fewest; give --min-pairs <= --iters"
            ),
            Some(least) => Ok((least, most)),
            None => Ok((DEFAULT_MIN_PAIRS.min(most), most)),
        }
    }
}

/// A collective of `--ops`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `reduce_scatter`.
    ReduceScatter,
    /// `all_gather`.
    AllGather,
    /// `all_reduce`.
    AllReduce,
}

impl Op {
    /// `reduce_scatter`, `all_gather` or `all_reduce` (as the command line reads them,
    /// before MPI starts: every rank refuses a bad name alike).
    pub fn parse(s: &str) -> Result<Op, String> {
        Ok(match s.trim() {
            "reduce_scatter" => Op::ReduceScatter,
            "all_gather" => Op::AllGather,
            "all_reduce" => Op::AllReduce,
            o => {
                return Err(format!(
                    "unknown collective '{o}' (reduce_scatter, all_gather, all_reduce)"
                ))
            }
        })
    }

    /// The name `--ops` and the table use.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub fn name(self) -> &'static str {
        match self {
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
            Op::AllReduce => "all_reduce",
        }
    }
}

/// `--iters`, `--min-pairs`: a count of timed pairs, at least 1.
fn parse_pairs(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("0 pairs: give at least 1 timed pair".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "'{s}' is not a count of pairs (a whole number >= 1)"
        )),
    }
}

/// `16MiB` -> 16777216.
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 1024, 64KiB, 16MiB, 1GiB)"))?;
    let mult: usize = match unit.trim() {
        "" | "B" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        // Decimal, as every other size of the command line reads them.
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        u => {
            return Err(format!(
                "unknown size unit '{u}' in '{s}' (use KiB, MiB, GiB (1024) or kB, MB, GB (1000))"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size '{s}' overflows"))
}

#[cfg(test)]
mod tests {
    use super::{CommArgs, Op};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        c: CommArgs,
    }

    fn parse(args: &[&str]) -> Result<CommArgs, String> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .map(|c| c.c)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn ops_and_pair_counts_are_checked_as_the_command_line_is_read() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.ops, [Op::ReduceScatter, Op::AllGather, Op::AllReduce]);
        assert_eq!(a.pair_bounds().unwrap(), (5, 20));
        assert_eq!(
            parse(&["--ops", "all_reduce"]).unwrap().ops,
            [Op::AllReduce]
        );
        let err = parse(&["--ops", "all_reduce,foo"]).unwrap_err();
        assert!(err.contains("unknown collective 'foo'"), "{err}");
        for flag in ["--iters", "--min-pairs"] {
            let err = parse(&[flag, "0"]).unwrap_err();
            assert!(err.contains("at least 1"), "{flag}: {err}");
        }
        // --iters is the most, --min-pairs the fewest; the default fewest follows --iters.
        assert_eq!(
            parse(&["--iters", "3"]).unwrap().pair_bounds().unwrap(),
            (3, 3)
        );
        let a = parse(&["--min-pairs", "2", "--iters", "5"]).unwrap();
        assert_eq!(a.pair_bounds().unwrap(), (2, 5));
        let a = parse(&["--min-pairs", "100", "--iters", "5"]).unwrap();
        let err = a.pair_bounds().unwrap_err().to_string();
        assert!(err.contains("--min-pairs 100 is above --iters 5"), "{err}");
    }

    #[test]
    fn sizes_read_kb_mb_gb_as_the_rest_of_the_command_line_does() {
        use super::parse_size;
        assert_eq!(parse_size("16MB"), Ok(16_000_000));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("64kB"), Ok(64_000));
        assert_eq!(parse_size("64KB"), Ok(64_000));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(
            parse_size("16MB").map(|b| b as u64),
            crate::plan::parse_mem("16MB")
        );
    }
}
