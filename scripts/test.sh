#!/usr/bin/env bash
# The README's test command: installs what is missing, starts a local two-node Slurm
# cluster (stopped again on exit), then runs every test of the workspace in release mode.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh comm_` to filter).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --cuda --slurm --python
scripts/slurm-cluster/start.sh
# CI keeps the Slurm logs for a failed run's post-mortem.
keep=""; [ "${CI:-}" = "true" ] && keep="--keep-logs"
trap "scripts/slurm-cluster/stop.sh $keep" EXIT
# The CLI tests (tests/tests/*_cli.rs) run the real zero-bench binary of this profile.
cargo build --release -p zero-bench
# The TCP-world tests (tests/tests/tcp_world.rs) run the carried build, which links no MPI:
# the same command as scripts/carry-check.sh, so CI builds it once.
cargo build --release -p zero-bench --no-default-features --features nccl --target-dir "${CARRY_TARGET_DIR:-target-carry}"
cargo test --workspace --release "$@"
