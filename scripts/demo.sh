#!/usr/bin/env bash
# The README's main job: build zero-bench (release) and train a small GPT (~0.4M
# parameters, configs/demo.toml) on the built-in corpus on 4 MPI ranks of this machine,
# once per ZeRO stage 0, 1, 2, 3. Each stage prints its per-rank memory ledger next to the
# ZeRO paper's formula (every byte of difference explained) and its communication per
# step, then trains while the loss falls from ln 64 = 4.16 towards the corpus's floor;
# a table compares the stages (step time vs stage 0, tokens/s, memory, peak RSS, bytes).
# Extra arguments go to `zero-bench train`, e.g. --precision fp16, --metrics m.jsonl
# (relative paths are the current directory's).
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,9s/^# \{0,1\}//p' "$0"; exit 0 ;;
esac
# Not a cd: the caller's relative paths (--metrics m.jsonl) stay the caller's.
root="$(cd "$(dirname "$0")/.." && pwd)"
# The binary cargo built, wherever its target dir is (CARGO_TARGET_DIR, .cargo/config.toml).
bin=$(cd "$root" && cargo build --release -q -p zero-bench --message-format=json-render-diagnostics |
  sed -n 's/.*"executable":"\([^"]*\/zero-bench\)".*/\1/p' | tail -n 1)
[ -x "$bin" ] || { echo "demo: cargo build did not name the zero-bench binary" >&2; exit 1; }
exec "$root/scripts/mpirun.sh" 4 "$bin" train --config "$root/configs/demo.toml" --stages 0,1,2,3 "$@"
