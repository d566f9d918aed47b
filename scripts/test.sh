#!/usr/bin/env bash
# The README's test command: installs what is missing, starts a local two-node Slurm
# cluster (stopped again on exit, unless it was up before this run: then it is left
# running), then runs every test of the workspace in release mode.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh comm_` to filter).
# Environment: CARRY_TARGET_DIR (the carried build's target dir, default target-carry),
# ZERO_SLURM_DIR and ZERO_SLURM_PORT_BASE (scripts/slurm-cluster/start.sh), ZERO_VENV
# (scripts/setup.sh: where the ptxas of --cuda is, given to the tests as $PTXAS).
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,8s/^# \{0,1\}//p' "$0"; exit 0 ;;
esac
cd "$(dirname "$0")/.."
scripts/setup.sh --cuda --slurm --python
# ptxas from setup.sh's virtual environment, when the tests would not find one otherwise.
venv="${ZERO_VENV:-${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/zero-rs/venv}"
if [ -z "${PTXAS:-}" ] && ! command -v ptxas >/dev/null 2>&1 &&
  ! python3 -c 'import nvidia.cuda_nvcc' >/dev/null 2>&1 && [ -x "$venv/bin/ptxas" ]; then
  export PTXAS="$venv/bin/ptxas"
fi
# The full-disk test mounts a small tmpfs, which needs CAP_SYS_ADMIN: a container without
# it cannot run that test, which then fails unless told to skip (tests/src/lib.rs
# SKIP_VAR). Probe once and say so here, where the run's output shows it.
probe="$(mktemp -d)"
if mount -t tmpfs -o size=1m zero-probe "$probe" 2>/dev/null; then
  umount "$probe"
else
  echo "test.sh: cannot mount a tmpfs here (no CAP_SYS_ADMIN?): the full-disk test is skipped (ZERO_TESTS_SKIP=tmpfs)" >&2
  export ZERO_TESTS_SKIP="${ZERO_TESTS_SKIP:+$ZERO_TESTS_SKIP,}tmpfs"
fi
rmdir "$probe"
# Stop the cluster on exit only if this run started it (start.sh records the token only
# then): a cluster that was already up, perhaps another run's, is left alone.
owner="test.sh-$$-$(date +%s%N)"
scripts/slurm-cluster/start.sh --owner "$owner"
# CI keeps the Slurm logs for a failed run's post-mortem.
keep=""; [ "${CI:-}" = "true" ] && keep="--keep-logs"
# shellcheck disable=SC2064 # expanded now, on purpose
trap "scripts/slurm-cluster/stop.sh --owner '$owner' $keep" EXIT
# The CLI tests (tests/tests/*_cli.rs) run the real zero-bench binary of this profile.
cargo build --release -p zero-bench
# The TCP-world tests (tests/tests/tcp_world.rs) run the carried build, which links no MPI:
# the same command as scripts/carry-check.sh, so CI builds it once. Absolute, because the
# tests run in tests/, not here.
carry="${CARRY_TARGET_DIR:-target-carry}"
case "$carry" in /*) ;; *) carry="$PWD/$carry" ;; esac
export CARRY_TARGET_DIR="$carry"
cargo build --release -p zero-bench --no-default-features --features nccl --target-dir "$CARRY_TARGET_DIR"
cargo test --workspace --release "$@"
