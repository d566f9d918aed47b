#!/usr/bin/env bash
# The peer benchmark: zero-rs against PyTorch (DDP, ZeroRedundancyOptimizer, FSDP2, one
# process; fp32 and bf16 autocast) on the same GPT-2 shapes, batch and precision, in
# interleaved rounds; prints step-time ratios as medians (scripts/peer_bench/run.py).
# PyTorch is not a dependency of zero-rs: it lives in a throwaway virtual environment,
# made from PyPI only when asked (--install).
set -euo pipefail
# Not a cd: the caller's relative --venv and --out stay the caller's.
root="$(cd "$(dirname "$0")/.." && pwd)"
default_venv="${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/zero-rs/peer-venv"

usage() {
  cat <<'USAGE'
usage: scripts/peer-bench.sh [--install] [--venv DIR] [--out DIR] [--quick] [RUN.PY OPTIONS]

  --install     create the virtual environment (if missing) and install torch from PyPI
                into it (several GB with its CUDA wheels; a few minutes)
  --venv DIR    the virtual environment with torch (default ~/.cache/zero-rs/peer-venv);
                it must be yours (not a symlink, not another user's)
  --out DIR     configs, metrics and peer-bench.json (default peer-bench-out in the repository)
  --quick       a small shape, 1 round, fp32 only: checks the set-up in a minute or two
  RUN.PY OPTIONS  --shapes v4096,v50257  --precisions fp32,bf16  --stages 0,1,2,3
                --threads 1,2  --rounds 3  --steps 8  --warmup 2
                (scripts/peer_bench/run.py --help explains them)

Keep ranks x threads <= cores: the 2-rank cases use 1 thread per rank, the 1-rank cases
the thread counts of --threads. On a shared machine, use more rounds.
USAGE
}

venv="$default_venv"
out="$root/peer-bench-out"
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

die() { echo "peer-bench: $*" >&2; exit 1; }
# Absolute (the caller's directory), as run.py gets them.
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac

# We run the venv's python: one that another user could have planted is refused.
if [ -e "$venv" ] || [ -L "$venv" ]; then
  [ ! -L "$venv" ] && [ -d "$venv" ] && [ -O "$venv" ] ||
    die "$venv is not a directory of yours (a symlink, or another user's): remove it, or give --venv DIR"
fi
py="$venv/bin/python"
if [ "$install" = 1 ]; then
  # A venv whose creation failed half-way (no python3-venv: ensurepip missing) has a python
  # but no pip: made again from scratch.
  if ! { [ -x "$py" ] && "$py" -m pip --version >/dev/null 2>&1; }; then
    mkdir -p "$(dirname "$venv")"
    if ! { python3 -m venv --clear "$venv" && "$py" -m pip --version >/dev/null 2>&1; }; then
      die "could not create the virtual environment $venv with pip (on Debian/Ubuntu: apt-get install python3-venv)"
    fi
  fi
  echo "peer-bench: installing torch from PyPI into $venv" >&2
  "$py" -m pip install -q --upgrade pip >/dev/null || die "pip install --upgrade pip into $venv failed"
  "$py" -m pip install -q torch numpy || die "pip install torch numpy into $venv failed"
fi
if ! [ -x "$py" ] || ! "$py" -c 'import torch' 2>/dev/null; then
  die "no torch in $venv; run again with --install (PyTorch from PyPI into that venv), or give --venv DIR"
fi

# The binary cargo built, wherever its target dir is (CARGO_TARGET_DIR, .cargo/config.toml).
bin=$(cd "$root" && cargo build --release -q -p zero-bench --message-format=json-render-diagnostics |
  sed -n 's/.*"executable":"\([^"]*\/zero-bench\)".*/\1/p' | tail -n 1)
[ -x "$bin" ] || die "cargo build did not name the zero-bench binary"
# (${a[@]+"${a[@]}"}: an empty array is "unbound" under set -u in bash < 4.4.)
exec python3 "$root/scripts/peer_bench/run.py" --python "$py" --zero-bench "$bin" --out "$out" ${extra[@]+"${extra[@]}"}
