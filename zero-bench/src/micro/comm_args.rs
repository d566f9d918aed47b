//! The options of `micro comm`, apart from the benchmark: `--help` lists them in every
//! build, the benchmark itself needs MPI (feature `mpi`).

use std::path::PathBuf;

use zero_comm::DType;

/// Options of `micro comm`.
#[derive(clap::Args, Debug)]
pub struct CommArgs {
    /// Smallest full-buffer size (bytes; suffixes KiB, MiB, GiB or K, M, G, all binary).
    #[arg(long, default_value = "1KiB", value_parser = parse_size)]
    pub min_size: usize,
    /// Largest full-buffer size; sizes double from --min-size.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    pub max_size: usize,
    /// Element type: f32, f64, bf16, f16, u8, i32, i64.
    #[arg(long, default_value = "f32")]
    pub dtype: DType,
    /// Timed ours/raw call pairs per size and collective at most (fewer for large sizes,
    /// see --bytes-per-point).
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed ours/raw pairs before each point.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Timed ours/raw call pairs per size and collective at least.
    #[arg(long, default_value_t = 5)]
    pub min_pairs: usize,
    /// Caps the timed pairs so that each side moves about this many bytes per point.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub bytes_per_point: usize,
    /// Collectives to measure (comma-separated: reduce_scatter, all_gather, all_reduce).
    #[arg(
        long,
        default_value = "reduce_scatter,all_gather,all_reduce",
        value_delimiter = ','
    )]
    pub ops: Vec<String>,
    /// Check every collective on every dtype against serial answers first.
    #[arg(long)]
    pub self_test: bool,
    /// A/A control: run the raw MPI call on both sides, to show how far the ratio strays
    /// from 1 by noise alone on this machine.
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
        "K" | "k" | "KiB" | "KB" | "kB" => 1 << 10,
        "M" | "MiB" | "MB" => 1 << 20,
        "G" | "GiB" | "GB" => 1 << 30,
        u => {
            return Err(format!(
                "unknown size unit '{u}' in '{s}' (use KiB, MiB, GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size '{s}' overflows"))
}
