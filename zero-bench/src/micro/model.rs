//! `zero-bench micro model` (being built; owned by the model work).

/// Options of `micro model`.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {}

/// Run the benchmark.
pub fn run(_args: &ModelArgs) -> anyhow::Result<()> {
    anyhow::bail!("micro model is not built yet")
}
