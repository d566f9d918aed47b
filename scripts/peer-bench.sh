#!/usr/bin/env bash
# The peer benchmark: zero-rs against PyTorch (DDP, ZeroRedundancyOptimizer, FSDP2, one
# process; fp32 and bf16 autocast) on the same GPT-2 shapes, batch and precision, in
# interleaved rounds; prints step-time ratios as medians (scripts/peer_bench/run.py).
# PyTorch is not a dependency of zero-rs: it lives in a throwaway virtual environment,
# made from PyPI only when asked (--install).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
usage: scripts/peer-bench.sh [--install] [--venv DIR] [--out DIR] [--quick] [RUN.PY OPTIONS]

  --install     create the virtual environment (if missing) and install torch from PyPI
                into it (several GB with its CUDA wheels; a few minutes)
  --venv DIR    the virtual environment with torch (default /tmp/zero-peer-venv)
  --out DIR     configs, metrics and peer-bench.json (default peer-bench-out)
  --quick       a small shape, 1 round, fp32 only: checks the set-up in a minute or two
  RUN.PY OPTIONS  --shapes v4096,v50257  --precisions fp32,bf16  --stages 0,1,2,3
                --threads 1,2  --rounds 3  --steps 8  --warmup 2
                (scripts/peer_bench/run.py --help explains them)

Keep ranks x threads <= cores: the 2-rank cases use 1 thread per rank, the 1-rank cases
the thread counts of --threads. On a shared machine, use more rounds.
USAGE
}

venv=/tmp/zero-peer-venv
out=peer-bench-out
install=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --install) install=1 ;;
    --venv) venv="${2:?--venv needs a directory}"; shift ;;
    --out) out="${2:?--out needs a directory}"; shift ;;
    --quick) extra+=(--shapes mini --precisions fp32 --rounds 1 --steps 5) ;;
    *) extra+=("$1") ;;
  esac
  shift
done

py="$venv/bin/python"
if [ "$install" = 1 ]; then
  [ -x "$py" ] || python3 -m venv "$venv" || {
    echo "peer-bench: could not create the virtual environment $venv (on Debian: apt-get install python3-venv)" >&2; exit 1; }
  echo "peer-bench: installing torch from PyPI into $venv" >&2
  "$py" -m pip install -q --upgrade pip >/dev/null
  "$py" -m pip install -q torch numpy
fi
if ! [ -x "$py" ] || ! "$py" -c 'import torch' 2>/dev/null; then
  echo "peer-bench: no torch in $venv; run again with --install (PyTorch from PyPI into that venv), or give --venv DIR" >&2
  exit 1
fi

cargo build --release -q -p zero-bench
bin="${CARGO_TARGET_DIR:-target}/release/zero-bench"
exec python3 scripts/peer_bench/run.py --python "$py" --zero-bench "$bin" --out "$out" "${extra[@]}"
