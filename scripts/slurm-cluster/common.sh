# Shared by start.sh and stop.sh (sourced, not run): where the local test cluster lives
# and how to talk to it. Everything the cluster writes stays under $ZERO_SLURM_DIR, so
# stop.sh can remove it whole; the marker file guards that removal.

# Scratch directory of the cluster (override with ZERO_SLURM_DIR=/some/dir).
ZERO_SLURM_DIR="${ZERO_SLURM_DIR:-/tmp/zero-slurm}"
# slurmctld listens on BASE, node n1 on BASE+1, n2 on BASE+2 (override ZERO_SLURM_PORT_BASE).
# Away from Slurm's defaults (6817/6818) so a site's own Slurm is not disturbed.
ZERO_SLURM_PORT_BASE="${ZERO_SLURM_PORT_BASE:-16817}"
# Emulated nodes and the CPUs each declares (more than the machine has is fine:
# SlurmdParameters=config_overrides).
ZERO_SLURM_NODES=(n1 n2)
ZERO_SLURM_CPUS="${ZERO_SLURM_CPUS:-4}"

CONF="$ZERO_SLURM_DIR/slurm.conf"
ENV_FILE="$ZERO_SLURM_DIR/env"
MARKER="$ZERO_SLURM_DIR/.zero-slurm-cluster"
PID_DIR="$ZERO_SLURM_DIR/pids"
LOG_DIR="$ZERO_SLURM_DIR/log"

say() { printf '[slurm-cluster] %s\n' "$*"; }
die() { printf '[slurm-cluster] error: %s\n' "$*" >&2; exit 1; }

# Root writes slurm.conf (which its slurmd obeys) into $ZERO_SLURM_DIR and kills the pids
# recorded there: a directory another user made, or a symlink, is refused, as is one that
# others may write to. (Under the sticky /tmp, nobody else can replace ours once it is.)
check_dir() {
  [ -e "$ZERO_SLURM_DIR" ] || [ -L "$ZERO_SLURM_DIR" ] || return 0
  [ ! -L "$ZERO_SLURM_DIR" ] || die "$ZERO_SLURM_DIR is a symlink: refused (another user may have planted it); remove it, or choose another ZERO_SLURM_DIR."
  [ -d "$ZERO_SLURM_DIR" ] || die "$ZERO_SLURM_DIR is not a directory; remove it, or choose another ZERO_SLURM_DIR."
  [ -O "$ZERO_SLURM_DIR" ] || die "$ZERO_SLURM_DIR belongs to another user ($(stat -c %U "$ZERO_SLURM_DIR")): refused; remove it, or choose another ZERO_SLURM_DIR."
  [ -z "$(find "$ZERO_SLURM_DIR" -maxdepth 0 -perm /022)" ] || die "$ZERO_SLURM_DIR is writable by group or others: refused; remove it, or choose another ZERO_SLURM_DIR."
}

# True when pid file $1 names a live process whose command is $2 (slurmctld/slurmd) and
# whose command line names our slurm.conf (`-f $CONF`): a recycled pid never counts as
# ours, nor another Slurm's daemon (a site's own slurmd), nor a zombie (state Z) left for
# a PID 1 that does not reap.
pid_alive() {
  local f="$1" name="$2" pid stat args nl=$'\n'
  [ -r "$f" ] || return 1
  pid="$(cat "$f" 2>/dev/null)"
  case "$pid" in ''|*[!0-9]*) return 1 ;; esac
  [ -r "/proc/$pid/comm" ] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 1
  args="$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  case "$nl$args$nl" in *"$nl-f$nl$CONF$nl"*) ;; *) return 1 ;; esac
  stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
  # Field 3 of /proc/PID/stat, after the parenthesised command name.
  [ "$(printf '%s' "${stat##*) }" | cut -d' ' -f1)" != Z ]
}

# The daemon name a pid file of ours is for.
daemon_of() {
  case "$(basename "$1")" in slurmctld.pid) echo slurmctld ;; *) echo slurmd ;; esac
}

# True when slurmctld answers and every node is in one of the sinfo states given as a
# regex: 'idle' right after a start, 'idle|mix|alloc|comp' for "up, maybe busy". A
# suffix (idle* = not responding, idle~ = powered off, drain...) never matches.
nodes_in_state() {
  [ -r "$CONF" ] || return 1
  # Outputs are captured before grep reads them: `scontrol ... | grep -q` under pipefail
  # fails when scontrol is still writing as grep exits at its match (SIGPIPE), which read
  # a healthy cluster as down once the config output passed a pipe buffer.
  local out states n
  out="$(SLURM_CONF="$CONF" timeout 5 scontrol ping 2>/dev/null)" || return 1
  grep -q 'is UP' <<<"$out" || return 1
  # The controller answering must be ours, not another one on the same port.
  out="$(SLURM_CONF="$CONF" timeout 5 scontrol show config 2>/dev/null)" || return 1
  want="$ZERO_SLURM_DIR/state" awk 'sub(/^StateSaveLocation *= */, "") && $0 == ENVIRON["want"] { found = 1 }
    END { exit !found }' <<<"$out" || return 1
  states="$(SLURM_CONF="$CONF" timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null)" || return 1
  states="$(sort -u <<<"$states")"
  for n in "${ZERO_SLURM_NODES[@]}"; do
    grep -Eqx "$n ($1)" <<<"$states" || return 1
  done
}
cluster_ready() { nodes_in_state 'idle'; }
# True when something listens on 127.0.0.1:$1 (bash's /dev/tcp, no extra tools).
port_in_use() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }
cluster_up() { nodes_in_state 'idle|mix|alloc|comp'; }

# Stop the daemons we started (by their recorded pids): SIGTERM to all at once (each
# takes ~2 s to shut down), SIGKILL to any still there after 10 s.
stop_daemons() {
  local f pid i left
  for f in "$PID_DIR"/*.pid; do
    [ -e "$f" ] || continue
    pid_alive "$f" "$(daemon_of "$f")" && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  for i in $(seq 1 100); do
    left=0
    for f in "$PID_DIR"/*.pid; do
      [ -e "$f" ] || continue
      pid_alive "$f" "$(daemon_of "$f")" && left=1
    done
    [ "$left" -eq 0 ] && break
    sleep 0.1
  done
  for f in "$PID_DIR"/*.pid; do
    [ -e "$f" ] || continue
    if pid_alive "$f" "$(daemon_of "$f")"; then
      say "$(daemon_of "$f") ($(cat "$f")) ignored SIGTERM for 10 s; killing it"
      kill -KILL "$(cat "$f")" 2>/dev/null || true
    fi
    rm -f "$f"
  done
}
