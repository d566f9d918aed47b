#!/usr/bin/env bash
# The README's main job: build zero-bench (release) and train a small GPT (~0.4M
# parameters, configs/demo.toml) on the built-in corpus on 4 MPI ranks of this machine,
# once per ZeRO stage 0, 1, 2, 3. Each stage prints its per-rank memory ledger next to the
# ZeRO paper's formula (every byte of difference explained) and its communication per
# step, then trains while the loss falls from ln 64 = 4.16 towards the corpus's floor;
# a table compares the stages (step time vs stage 0, tokens/s, memory, peak RSS, bytes).
# Extra arguments go to `zero-bench train`, e.g. --precision fp16, --metrics m.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p zero-bench
bin="${CARGO_TARGET_DIR:-target}/release/zero-bench"
exec scripts/mpirun.sh 4 "$bin" train --config configs/demo.toml --stages 0,1,2,3 "$@"
