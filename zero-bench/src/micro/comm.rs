//! `zero-bench micro comm` (being built; owned by the comm work).

/// Options of `micro comm`.
#[derive(clap::Args, Debug)]
pub struct CommArgs {}

/// Run the benchmark.
pub fn run(_args: &CommArgs) -> anyhow::Result<()> {
    anyhow::bail!("micro comm is not built yet")
}
