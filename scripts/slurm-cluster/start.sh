#!/usr/bin/env bash
# Start a single-host Slurm cluster for tests: one slurmctld and two slurmd emulating
# nodes n1 and n2 (4 CPUs each by default), so that `srun --mpi=pmix` runs MPI across
# two "nodes". Idempotent: when the cluster is already up it says so and changes nothing.
#
#   scripts/slurm-cluster/start.sh        then:  source /tmp/zero-slurm/env   (SLURM_CONF)
#   scripts/slurm-cluster/stop.sh
#   scripts/slurm-cluster/start.sh --owner TOKEN   records TOKEN as the starter when it starts
#                                                  the cluster (not when it was up already);
#                                                  `stop.sh --owner TOKEN` then stops only that
#
# Environment: ZERO_SLURM_DIR (scratch dir, default /tmp/zero-slurm; must be yours, not a
# symlink, not writable by others), ZERO_SLURM_PORT_BASE (default 16817; uses BASE..BASE+2),
# ZERO_SLURM_CPUS (per node, default 4).
# Needs root and Slurm 22.05 (scripts/setup.sh --slurm). No systemd, no munge: the
# cluster uses auth/none, which is fine on one host and never for a real cluster.
# What each setting is for: slurm/README.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/common.sh"

owner=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 0 ;;
    --owner) owner="${2:?--owner needs a token}"; shift ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done

[ "$(id -u)" -eq 0 ] || die "run as root: slurmd starts job steps as the submitting user and needs root for that."
check_dir
for tool in slurmctld slurmd scontrol sinfo srun sbatch; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found: install Slurm with 'scripts/setup.sh --slurm' (apt-get install slurm-wlm slurm-wlm-basic-plugins)."
done
plugin_dir=/usr/lib/x86_64-linux-gnu/slurm-wlm
[ -d "$plugin_dir" ] || plugin_dir="$(dirname "$(find /usr/lib* -name mpi_pmix.so -print -quit 2>/dev/null || true)")"
[ -e "$plugin_dir/mpi_pmix.so" ] || die "Slurm's PMIx plugin (mpi_pmix.so) not found: install slurm-wlm-basic-plugins."

# Up, possibly running jobs: leave it alone.
if cluster_up; then
  say "already up (SLURM_CONF=$CONF)"
  cat "$ENV_FILE"
  exit 0
fi

# Anything half-started by an earlier run is stopped and its state wiped: a fresh start
# is ~1 s, cheaper than diagnosing stale state.
if [ -e "$MARKER" ]; then
  say "found a stopped or unhealthy cluster in $ZERO_SLURM_DIR; restarting it from scratch"
  stop_daemons
  rm -rf "${ZERO_SLURM_DIR:?}"/{state,spool,tmp,vader,log,pids,run,owner}
fi
if [ -d "$ZERO_SLURM_DIR" ] && [ ! -e "$MARKER" ] && [ -n "$(ls -A "$ZERO_SLURM_DIR")" ]; then
  die "$ZERO_SLURM_DIR exists, is not empty and was not made by this script; choose another ZERO_SLURM_DIR."
fi

for port in $(seq "$ZERO_SLURM_PORT_BASE" $((ZERO_SLURM_PORT_BASE + ${#ZERO_SLURM_NODES[@]}))); do
  port_in_use "$port" && die "port $port is in use (another Slurm cluster, or another program): stop it, or choose other ports with ZERO_SLURM_PORT_BASE (uses BASE..BASE+${#ZERO_SLURM_NODES[@]})."
done

if [ ! -e "$ZERO_SLURM_DIR" ] && [ ! -L "$ZERO_SLURM_DIR" ]; then
  mkdir -p "$(dirname "$ZERO_SLURM_DIR")"
  # Not -p: a directory someone made meanwhile fails here, and check_dir looks at it.
  mkdir -m 0755 "$ZERO_SLURM_DIR" || die "cannot create $ZERO_SLURM_DIR"
fi
check_dir
mkdir -p "$ZERO_SLURM_DIR"/{state,log,pids,run}
touch "$MARKER"
if [ -n "$owner" ]; then printf '%s\n' "$owner" > "$ZERO_SLURM_DIR/owner"; fi
for n in "${ZERO_SLURM_NODES[@]}"; do
  mkdir -p "$ZERO_SLURM_DIR/spool/slurmd-$n" "$ZERO_SLURM_DIR/tmp/$n" "$ZERO_SLURM_DIR/vader/$n"
done
# Job steps of any user write PMIx and Open MPI files here, as under /tmp.
chmod 1777 "$ZERO_SLURM_DIR"/tmp/* "$ZERO_SLURM_DIR"/vader/*

# TaskProlog: its `export` lines land in every task's environment. Both emulated nodes
# share one host and so one /dev/shm: without a per-node backing directory the Open MPI
# shared-memory (vader) segments of n1 and n2 collide and ranks segfault.
cat > "$ZERO_SLURM_DIR/task_prolog.sh" <<PROLOG
#!/bin/sh
echo "export OMPI_MCA_btl_vader_backing_directory=$ZERO_SLURM_DIR/vader/\$SLURMD_NODENAME"
PROLOG
chmod 755 "$ZERO_SLURM_DIR/task_prolog.sh"

host="$(hostname -s 2>/dev/null || uname -n)"
ctld_port="$ZERO_SLURM_PORT_BASE"
{
  cat <<CONF
# Written by scripts/slurm-cluster/start.sh: a two-node test cluster on one host.
ClusterName=zero-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
# One host, no munge key to share: no authentication (test clusters only).
AuthType=auth/none
CredType=cred/none
# No cgroups in containers/CI: track processes by parent pid, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$ZERO_SLURM_DIR/task_prolog.sh
# Debian's Open MPI initialises only through PMIx (pmi2/none abort in MPI_Init).
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Lets a node declare more CPUs than the machine has.
SlurmdParameters=config_overrides
# Nodes return to service by themselves after a restart.
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# A node is declared down only after 5 minutes without an answer: both slurmds share
# this machine's cores with the jobs, and under a loaded step (ranks spinning in MPI
# waits) a slurmd answered late, its node was declared down after 30 s and the job was
# cancelled "due to node failure" and requeued (tests/tests/slurm_sweep.rs's tune job,
# 2026-12-06). No test needs a node declared down. Finished jobs are purged soon after.
SlurmdTimeout=300
InactiveLimit=0
MinJobAge=60
KillWait=5
StateSaveLocation=$ZERO_SLURM_DIR/state
SlurmdSpoolDir=$ZERO_SLURM_DIR/spool/slurmd-%n
SlurmctldPidFile=$ZERO_SLURM_DIR/run/slurmctld.pid
SlurmdPidFile=$ZERO_SLURM_DIR/run/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PluginDir=$plugin_dir
# Per-node TmpFS (%n = node name): PMIx puts its rendezvous files there, and the two
# emulated nodes' files collide otherwise.
TmpFS=$ZERO_SLURM_DIR/tmp/%n
CONF
  port=$((ctld_port + 1))
  for n in "${ZERO_SLURM_NODES[@]}"; do
    echo "NodeName=$n NodeAddr=127.0.0.1 NodeHostname=$host Port=$port CPUs=$ZERO_SLURM_CPUS State=UNKNOWN"
    port=$((port + 1))
  done
  nodes="$(IFS=,; echo "${ZERO_SLURM_NODES[*]}")"
  echo "PartitionName=debug Nodes=$nodes Default=YES MaxTime=INFINITE State=UP"
} > "$CONF"

printf 'export SLURM_CONF=%s\n' "$CONF" > "$ENV_FILE"

export SLURM_CONF="$CONF"
start_s=$(date +%s.%N)
# -D: stay in the foreground of our own background process, so the pid we record is the
# daemon's; setsid: detach from this shell's session so the daemons outlive it.
setsid slurmctld -D -f "$CONF" </dev/null >>"$LOG_DIR/slurmctld.stdout" 2>&1 &
echo $! > "$PID_DIR/slurmctld.pid"
for n in "${ZERO_SLURM_NODES[@]}"; do
  setsid slurmd -D -N "$n" -f "$CONF" </dev/null >>"$LOG_DIR/slurmd-$n.stdout" 2>&1 &
  echo $! > "$PID_DIR/slurmd-$n.pid"
done

# Bounded wait: slurmctld answering and both nodes idle (~1-2 s when healthy).
deadline=$((SECONDS + ${ZERO_SLURM_START_TIMEOUT:-60}))
until cluster_ready; do
  for f in "$PID_DIR"/*.pid; do
    pid_alive "$f" "$(daemon_of "$f")" || { failed="$(basename "$f" .pid) exited"; break 2; }
  done
  if [ "$SECONDS" -ge "$deadline" ]; then failed="not ready after ${ZERO_SLURM_START_TIMEOUT:-60} s"; break; fi
  sleep 0.2
done
if [ -n "${failed:-}" ]; then
  {
    echo "[slurm-cluster] error: cluster failed to start: $failed"
    echo "--- scontrol ping ---"; timeout 5 scontrol ping 2>&1 || true
    echo "--- sinfo ---"; timeout 5 sinfo -N 2>&1 || true
    for f in "$LOG_DIR"/*; do echo "--- tail $f ---"; tail -n 20 "$f"; done
  } >&2
  stop_daemons
  die "logs kept in $LOG_DIR; fix and re-run, or run scripts/slurm-cluster/stop.sh to clean up."
fi
took=$(awk -v a="$start_s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
say "up in ${took} s: nodes ${ZERO_SLURM_NODES[*]} idle, ${ZERO_SLURM_CPUS} CPUs each; logs in $LOG_DIR"
say "use it with:"
cat "$ENV_FILE"
