#!/usr/bin/env bash
# Install what zero-rs needs to build and test on Debian/Ubuntu, only what is missing.
# Idempotent: a second run installs nothing and says so. Run as root (or with sudo).
#
#   scripts/setup.sh            system packages (Open MPI, HDF5, libclang, pkg-config, hdf5-tools)
#   scripts/setup.sh --cuda     also ptxas (checks our PTX) and NVRTC (regenerates it), both from PyPI
#   scripts/setup.sh --slurm    also Slurm (slurmctld, slurmd, clients, PMIx plugin) for the local test cluster
#   scripts/setup.sh --python   also h5py and numpy (PyPI): tests read our HDF5 files as users do
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
    -h|--help) sed -n '2,8s/^# \{0,1\}//p' "$0"; exit 0 ;;
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

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "not root and no sudo: run as root to install packages."
  SUDO="sudo"
fi

packages=(libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools libclang-dev pkg-config)
# Slurm for scripts/slurm-cluster/start.sh; the PMIx plugin (srun --mpi=pmix) is in
# slurm-wlm-basic-plugins. munge comes as a dependency; the test cluster uses auth/none.
if [ "$want_slurm" -eq 1 ]; then packages+=(slurm-wlm slurm-wlm-basic-plugins); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  say "system packages already installed: ${packages[*]}"
else
  say "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  say "installed: ${missing[*]}"
fi

command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust (https://rustup.rs) and re-run."
command -v mpirun >/dev/null 2>&1 || die "mpirun not on PATH after installing openmpi-bin."

if [ "$want_cuda" -eq 1 ]; then
  # ptxas checks the checked-in PTX (cargo test -p zero-kernels); NVRTC regenerates it
  # (cargo run -p zero-kernels --features cuda --bin zero-kernels-ptx [-- --check]).
  command -v python3 >/dev/null 2>&1 || die "python3 is needed to install ptxas and NVRTC from PyPI (nvidia-cuda-nvcc-cu12, nvidia-cuda-nvrtc-cu12)."
  if command -v ptxas >/dev/null 2>&1 || python3 -c 'import nvidia.cuda_nvcc' >/dev/null 2>&1; then
    say "ptxas already available"
  else
    say "installing ptxas (PyPI nvidia-cuda-nvcc-cu12)"
    python3 -m pip install -q nvidia-cuda-nvcc-cu12 || die "pip install nvidia-cuda-nvcc-cu12 failed."
  fi
  if python3 -c 'import nvidia.cuda_nvrtc' >/dev/null 2>&1; then
    say "NVRTC already available"
  else
    say "installing NVRTC (PyPI nvidia-cuda-nvrtc-cu12)"
    python3 -m pip install -q nvidia-cuda-nvrtc-cu12 || die "pip install nvidia-cuda-nvrtc-cu12 failed."
  fi
  nvrtc_lib=$(python3 -c 'import nvidia.cuda_nvrtc as m; print(list(m.__path__)[0] + "/lib")')
  say "to regenerate PTX: export LD_LIBRARY_PATH=$nvrtc_lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
fi
if [ "$want_python" -eq 1 ]; then
  command -v python3 >/dev/null 2>&1 || die "python3 is needed for h5py (the tests read HDF5 files with it)."
  if python3 -c 'import h5py, numpy' >/dev/null 2>&1; then
    say "h5py and numpy already available"
  else
    say "installing h5py and numpy (PyPI)"
    python3 -m pip install -q h5py numpy || die "pip install h5py numpy failed."
  fi
fi
say "ready: $(mpirun --version 2>/dev/null | head -n 1), $(cargo --version)"
