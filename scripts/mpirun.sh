#!/usr/bin/env bash
# mpirun for a workstation or CI box: handles running as root and more ranks than cores,
# so the README's commands work as they are. On a cluster, use srun (see slurm/).
#
#   scripts/mpirun.sh N PROGRAM [ARGS...]
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,5s/^# \{0,1\}//p' "$0"; exit 0 ;;
esac
if [ $# -lt 2 ]; then
  echo "usage: $0 N PROGRAM [ARGS...]   (runs PROGRAM on N MPI ranks of this machine)" >&2
  exit 2
fi
n="$1"; shift
case "$n" in ''|*[!0-9]*) echo "error: N must be a positive integer, got '$n'" >&2; exit 2 ;; esac
command -v mpirun >/dev/null 2>&1 || { echo "error: mpirun not found; run scripts/setup.sh" >&2; exit 2; }
# Open MPI refuses root unless told it is intended (containers and CI run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun -n "$n" --oversubscribe --mca btl self,vader "$@"
