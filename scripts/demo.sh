#!/usr/bin/env bash
# The README's main job: build zero-bench (release) and run it on 4 MPI ranks of this
# machine. Today: the communication self-test and benchmark (every collective checked
# against a serial answer, then bus bandwidth next to raw MPI).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p zero-bench
exec scripts/mpirun.sh 4 target/release/zero-bench micro comm --self-test --max-size 16MiB "$@"
