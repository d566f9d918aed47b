//! `zero-bench micro adam` (being built; owned by the adam work).

/// Options of `micro adam`.
#[derive(clap::Args, Debug)]
pub struct AdamArgs {}

/// Run the benchmark.
pub fn run(_args: &AdamArgs) -> anyhow::Result<()> {
    anyhow::bail!("micro adam is not built yet")
}
