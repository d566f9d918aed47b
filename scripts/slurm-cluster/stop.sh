#!/usr/bin/env bash
# Stop the local test cluster started by start.sh and remove its scratch directory.
# Idempotent: with no cluster it says so and succeeds. Running jobs are cancelled first
# (bounded wait), then slurmd and slurmctld get SIGTERM (SIGKILL after 10 s).
#
#   scripts/slurm-cluster/stop.sh              (same ZERO_SLURM_DIR as start.sh)
#   scripts/slurm-cluster/stop.sh --keep-logs  leave $ZERO_SLURM_DIR/log for inspection
#   scripts/slurm-cluster/stop.sh --owner TOKEN  stop only a cluster that `start.sh --owner
#                                              TOKEN` started (scripts/test.sh: a cluster that
#                                              was up before it, it leaves running)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/common.sh"

keep_logs=0
owner=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
    --keep-logs) keep_logs=1 ;;
    --owner) owner="${2:?--owner needs a token}"; shift ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done

check_dir
if [ ! -e "$MARKER" ]; then
  say "no cluster in $ZERO_SLURM_DIR; nothing to stop"
  exit 0
fi
if [ -n "$owner" ] && [ "$(cat "$ZERO_SLURM_DIR/owner" 2>/dev/null || true)" != "$owner" ]; then
  say "the cluster in $ZERO_SLURM_DIR was not started by this run (--owner $owner); leaving it running"
  exit 0
fi

# Cancel jobs while slurmd still runs, so their job steps are torn down by Slurm.
# (Captured, not piped into grep -q: see nodes_in_state in common.sh.)
if ping_out="$(SLURM_CONF="$CONF" timeout 5 scontrol ping 2>/dev/null)" && grep -q 'is UP' <<<"$ping_out"; then
  jobs="$(SLURM_CONF="$CONF" timeout 5 squeue -h -o %i 2>/dev/null || true)"
  if [ -n "$jobs" ]; then
    say "cancelling jobs: $(echo $jobs)"
    # shellcheck disable=SC2086
    SLURM_CONF="$CONF" scancel $jobs 2>/dev/null || true
    for _ in $(seq 1 50); do
      [ -z "$(SLURM_CONF="$CONF" timeout 5 squeue -h -o %i 2>/dev/null || true)" ] && break
      sleep 0.2
    done
  fi
fi

stop_daemons
if [ "$keep_logs" -eq 1 ]; then
  find "$ZERO_SLURM_DIR" -mindepth 1 -maxdepth 1 ! -name log ! -name "$(basename "$MARKER")" -exec rm -rf {} +
  say "stopped; logs kept in $LOG_DIR"
else
  rm -rf "${ZERO_SLURM_DIR:?}"
  say "stopped and removed $ZERO_SLURM_DIR"
fi
