#!/usr/bin/env bash
# Install what zero-rs needs to build and test on Debian/Ubuntu, only what is missing.
# Idempotent: a second run installs nothing and says so. Needs root (or sudo) only when a
# system package is missing.
#
#   scripts/setup.sh            system packages (Open MPI, HDF5, libclang, pkg-config, hdf5-tools)
#   scripts/setup.sh --cuda     also ptxas (checks our PTX) and NVRTC (regenerates it): the PyPI
#                               wheels nvidia-cuda-nvcc-cu12 and nvidia-cuda-nvrtc-cu12, in the
#                               virtual environment $ZERO_VENV (default ~/.cache/zero-rs/venv;
#                               its bin/ptxas is what scripts/test.sh gives the tests as $PTXAS)
#   scripts/setup.sh --slurm    also Slurm (slurmctld, slurmd, clients, PMIx plugin) for the local test cluster
#   scripts/setup.sh --python   also h5py and numpy for the `python3` on PATH (tests read our HDF5
#                               files as users do): apt's python3-h5py python3-numpy for the
#                               system Python, pip for your own (pyenv, conda, an active venv)
#
# With --cuda or --python, python3 (and python3-venv) come from apt when missing. Nothing is
# ever pip-installed into the system Python (Debian 12 and Ubuntu >= 23.04 refuse it: PEP 668).
set -euo pipefail

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

want_cuda=0
want_slurm=0
want_python=0
for arg in "$@"; do
  case "$arg" in
    --cuda) want_cuda=1 ;;
    --slurm) want_slurm=1 ;;
    --python) want_python=1 ;;
    -h|--help) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown option '$arg' (see --help)" ;;
  esac
done

# --- the system must be Debian or Ubuntu: we install with apt ---
if [ ! -r /etc/os-release ]; then
  die "cannot read /etc/os-release; this script supports Debian and Ubuntu only. Install by hand: Open MPI (dev), HDF5 (dev, serial), libclang, pkg-config, hdf5-tools."
fi
. /etc/os-release
case " ${ID:-} ${ID_LIKE:-} " in
  *" debian "*|*" ubuntu "*) ;;
  *) die "unsupported system '${PRETTY_NAME:-$ID}': this script uses apt (Debian/Ubuntu). Install by hand: Open MPI (dev), HDF5 (dev, serial), libclang, pkg-config, hdf5-tools." ;;
esac

# Root (or sudo) is needed only to install system packages, and asked for only then: on a
# machine an administrator provisioned, an ordinary user runs this script as a check.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "not root and no sudo, and system packages are missing: run as root to install them."
  fi
}

# True when the Debian package $1 is installed. (Captured, not piped into grep -q: under
# pipefail a writer that outlives grep -q fails with SIGPIPE.)
installed() {
  local status
  status="$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)"
  [ "$status" = "install ok installed" ]
}

# apt-get install the packages given that are missing; says which.
apt_updated=0
apt_install() {
  local p missing=()
  for p in "$@"; do installed "$p" || missing+=("$p"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  say "installing: ${missing[*]}"
  # `env` passes DEBIAN_FRONTEND through sudo, whose env_reset would drop it.
  if [ "$apt_updated" -eq 0 ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  say "installed: ${missing[*]}"
}

packages=(libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools libclang-dev pkg-config)
# Slurm for scripts/slurm-cluster/start.sh; the PMIx plugin (srun --mpi=pmix) is in
# slurm-wlm-basic-plugins. munge comes as a dependency; the test cluster uses auth/none.
if [ "$want_slurm" -eq 1 ]; then packages+=(slurm-wlm slurm-wlm-basic-plugins); fi
# The tests run `python3` (h5py, numpy); the PyPI wheels of --cuda go into a venv made by it.
if { [ "$want_cuda" -eq 1 ] || [ "$want_python" -eq 1 ]; } && ! command -v python3 >/dev/null 2>&1; then
  packages+=(python3)
fi
missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then
  say "system packages already installed: ${packages[*]}"
else
  apt_install "${missing[@]}"
fi

command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust (https://rustup.rs) and re-run."
command -v mpirun >/dev/null 2>&1 || die "mpirun not on PATH after installing openmpi-bin."

# True when the python3 on PATH imports the modules $1 (e.g. 'h5py, numpy').
py_has() { python3 -c "import $1" >/dev/null 2>&1; }
# The virtual environment for PyPI wheels (never the system Python, see above); set with
# --cuda.
venv=""
venv_py=""
# A venv runs its python: one that another user could have planted is refused.
venv_checked=0
venv_check() {
  [ "$venv_checked" -eq 0 ] && [ -n "$venv" ] || return 0
  if [ -e "$venv" ] || [ -L "$venv" ]; then
    [ ! -L "$venv" ] && [ -d "$venv" ] && [ -O "$venv" ] ||
      die "$venv is not a directory of yours (a symlink, or another user's): remove it, or set ZERO_VENV."
  fi
  venv_checked=1
}
venv_has() { venv_check; [ -n "$venv" ] && [ -x "$venv_py" ] && "$venv_py" -c "import $1" >/dev/null 2>&1; }

# The python3 on PATH is the system's (apt manages its packages) when it is /usr's and
# not a virtual environment.
system_python() {
  python3 -c 'import sys; sys.exit(0 if sys.prefix == sys.base_prefix == "/usr" else 1)' 2>/dev/null
}

# Make $venv usable (created, or re-created when a failed creation left it without pip) and
# pip-install the PyPI packages given into it.
venv_install() {
  [ -n "$venv" ] || die "HOME is not set: set ZERO_VENV to a directory for the virtual environment."
  venv_check
  if ! { [ -x "$venv_py" ] && "$venv_py" -m pip --version >/dev/null 2>&1; }; then
    if system_python && ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
      # Debian's python3 makes venvs with pip only with python3-venv.
      apt_install python3-venv
    fi
    say "creating the virtual environment $venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv --clear "$venv" ||
      die "python3 -m venv $venv failed (on Debian/Ubuntu: apt-get install python3-venv)."
    "$venv_py" -m pip --version >/dev/null 2>&1 ||
      die "the virtual environment $venv has no pip (on Debian/Ubuntu: apt-get install python3-venv, then re-run)."
  fi
  say "installing into $venv (PyPI): $*"
  "$venv_py" -m pip install -q --disable-pip-version-check "$@" || die "pip install $* into $venv failed."
}

if [ "$want_python" -eq 1 ]; then
  command -v python3 >/dev/null 2>&1 || die "python3 is not on PATH after installing it."
  if py_has 'h5py, numpy'; then
    say "h5py and numpy already available ($(command -v python3))"
  elif system_python; then
    apt_install python3-h5py python3-numpy
    py_has 'h5py, numpy' || die "python3 still cannot import h5py and numpy after installing python3-h5py python3-numpy."
  else
    # Your own Python (pyenv, conda, an active venv): pip installs into it, as its owner.
    say "installing h5py and numpy into $(command -v python3) (PyPI)"
    python3 -m pip install -q --disable-pip-version-check h5py numpy ||
      die "pip install h5py numpy into $(command -v python3) failed (install them there, or put the system's python3 first on PATH)."
  fi
fi

if [ "$want_cuda" -eq 1 ]; then
  # ptxas checks the checked-in PTX (cargo test -p zero-kernels, which finds it as $PTXAS, on
  # PATH, or in the python3 on PATH); NVRTC regenerates it
  # (cargo run -p zero-kernels --features cuda --bin zero-kernels-ptx [-- --check]).
  command -v python3 >/dev/null 2>&1 || die "python3 is not on PATH after installing it."
  if [ -n "${ZERO_VENV:-}" ]; then
    venv="$ZERO_VENV"
  elif [ -n "${XDG_CACHE_HOME:-}${HOME:-}" ]; then
    venv="${XDG_CACHE_HOME:-$HOME/.cache}/zero-rs/venv"
  fi
  [ -z "$venv" ] || venv_py="$venv/bin/python3"
  wheels=()
  if [ -n "${PTXAS:-}" ] || command -v ptxas >/dev/null 2>&1 || py_has nvidia.cuda_nvcc; then
    say "ptxas already available (${PTXAS:-$(command -v ptxas 2>/dev/null || echo "python3's nvidia.cuda_nvcc")})"
  elif venv_has nvidia.cuda_nvcc; then
    say "ptxas already available in $venv"
  else
    wheels+=(nvidia-cuda-nvcc-cu12)
  fi
  if py_has nvidia.cuda_nvrtc || venv_has nvidia.cuda_nvrtc; then
    say "NVRTC already available"
  else
    wheels+=(nvidia-cuda-nvrtc-cu12)
  fi
  if [ ${#wheels[@]} -gt 0 ]; then venv_install "${wheels[@]}"; fi
  if venv_has nvidia.cuda_nvcc; then
    # A fixed path for the tests: scripts/test.sh exports PTXAS=$venv/bin/ptxas.
    ln -sfn "$("$venv_py" -c 'import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])')/bin/ptxas" "$venv/bin/ptxas"
    "$venv/bin/ptxas" --version >/dev/null 2>&1 || die "$venv/bin/ptxas does not run."
    if [ -z "${PTXAS:-}" ] && ! command -v ptxas >/dev/null 2>&1 && ! py_has nvidia.cuda_nvcc; then
      say "for cargo test without scripts/test.sh: export PTXAS=$venv/bin/ptxas"
    fi
  fi
  if py_has nvidia.cuda_nvrtc; then nvrtc_py=python3; else nvrtc_py="$venv_py"; fi
  nvrtc_lib=$("$nvrtc_py" -c 'import nvidia.cuda_nvrtc as m; print(list(m.__path__)[0] + "/lib")')
  say "to regenerate PTX: export LD_LIBRARY_PATH=$nvrtc_lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
fi
say "ready: $(mpirun --version 2>/dev/null | head -n 1), $(cargo --version)"
