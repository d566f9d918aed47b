#!/usr/bin/env bash
# The GPU check, in two halves: `prepare` here (where Rust and the sources are), `run` on
# the GPU machine (which needs only a driver and the CUDA libraries of a pip install).
#
#   scripts/gpu-check.sh prepare [DIR]         build the carried zero-bench (CUDA, no MPI, no
#                                              HDF5, stripped) and the CPU reference runs into
#                                              DIR (default .gpu-check/, git ignores it), with
#                                              a copy of this script; checks DIR < 64 MiB
#   DIR/gpu-check.sh run [DIR] [OUTDIR] [ARGS] on the GPU machine: finds the CUDA libraries in
#                                              Python's site-packages (nvidia/*/lib) and the
#                                              driver's libcuda, runs every check (killed at
#                                              GPU_CHECK_TIMEOUT, 480 s; no check starts after
#                                              --budget-s, that less 60 s unless ARGS give it),
#                                              one line each and a summary; results JSON in
#                                              OUTDIR (default DIR/results)
#   scripts/gpu-check.sh dry-run [DIR] [ARGS]  here, without a GPU: prepare if needed, the CUDA
#                                              run (which must say "no GPU"), then the same
#                                              checks on the simulated GPU (which must pass)
#
# ARGS go to `zero-bench gpu-check run` (e.g. --quick); DIR and OUTDIR are the arguments
# before the first that starts with '-'. Exit status: 0 passed, 2 a correctness check
# failed, 3 no GPU (`run`), 4 only performance goals missed, 124 out of time (the budget
# left checks out, or the timeout killed the run), 1 anything else.
# GPU_CHECK_FEATURES (default: cuda) are the zero-bench features of the build; with `cuda`
# the build is scripts/carry-check.sh's (which also checks the binary carries).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
limit_bytes=$((64 * 1024 * 1024))
run_timeout=${GPU_CHECK_TIMEOUT:-480}

say() { echo "gpu-check.sh: $*"; }
die() {
    echo "gpu-check.sh: error: $*" >&2
    exit 1
}
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }

# Files and folders removed on exit (prepare's half-written ones, the NCCL link folder).
cleanup=()
# shellcheck disable=SC2317 # run by the trap
on_exit() { if [ ${#cleanup[@]} -gt 0 ]; then rm -rf "${cleanup[@]}"; fi; }
trap on_exit EXIT

# True when $1 is a positional argument (DIR, OUTDIR), not the first of ARGS.
positional() { [ -n "${1:-}" ] && [ "${1#-}" = "$1" ]; }

# The repository root (prepare and dry-run build there).
repo_root() {
    local root
    root=$(cd "$here/.." && pwd)
    [ -f "$root/Cargo.toml" ] && [ -d "$root/zero-bench" ] ||
        die "run '$1' from the repository's scripts/ (it builds zero-bench)"
    echo "$root"
}

prepare() {
    local root dir features bin script
    case "${1:-}" in -h | --help) usage; exit 0 ;; esac
    root=$(repo_root prepare)
    dir=$root/.gpu-check
    if positional "${1:-}"; then dir=$1; shift; fi
    [ $# -eq 0 ] || die "prepare takes only [DIR], got '$*'"
    features=${GPU_CHECK_FEATURES-cuda}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    cd "$root"
    # Everything is written as .tmp first and renamed at the end: a failed prepare leaves
    # the previous binary and reference together (or neither), never a mix.
    rm -rf "$dir/zero-bench.tmp" "$dir/ref.tmp" "$dir/gpu-check.sh.tmp"
    cleanup+=("$dir/zero-bench.tmp" "$dir/ref.tmp" "$dir/gpu-check.sh.tmp")
    if [ "$features" = cuda ] && [ -x scripts/carry-check.sh ]; then
        say "building the carried binary (scripts/carry-check.sh)"
        scripts/carry-check.sh
        bin="${CARRY_TARGET_DIR:-target-carry}/carry/zero-bench"
        cp "$bin" "$dir/zero-bench.tmp"
    else
        say "cargo build -p zero-bench --release --no-default-features${features:+ --features $features}"
        # The binary cargo built, wherever its target dir is (CARGO_TARGET_DIR, .cargo/config.toml).
        bin=$(cargo build -q -p zero-bench --release --no-default-features ${features:+--features "$features"} \
            --message-format=json-render-diagnostics | sed -n 's/.*"executable":"\([^"]*\/zero-bench\)".*/\1/p' | tail -n 1)
        [ -x "$bin" ] || die "cargo build did not name the zero-bench binary"
        cp "$bin" "$dir/zero-bench.tmp"
        if command -v strip >/dev/null; then
            strip --strip-all "$dir/zero-bench.tmp"
        else
            say "strip not found: the copy keeps its symbols"
        fi
    fi
    say "CPU reference runs"
    "$dir/zero-bench.tmp" gpu-check prepare --out "$dir/ref.tmp"
    # The repository's script (also when this is a prepared copy run as `prepare`); a new
    # file renamed over the old, never the running script rewritten in place.
    script=$root/scripts/gpu-check.sh
    [ -f "$script" ] || script=$here/gpu-check.sh
    cp "$script" "$dir/gpu-check.sh.tmp"
    rm -rf "$dir/ref"
    mv "$dir/zero-bench.tmp" "$dir/zero-bench"
    mv "$dir/ref.tmp" "$dir/ref"
    mv "$dir/gpu-check.sh.tmp" "$dir/gpu-check.sh"
    local bytes
    bytes=$(du -sb "$dir" | cut -f1)
    if [ "$bytes" -ge "$limit_bytes" ]; then
        die "$dir holds $bytes bytes, over the 64 MiB a carried folder may hold"
    fi
    say "ready: $dir ($((bytes / 1024)) KiB: zero-bench, gpu-check.sh, ref/); on the GPU machine: $dir/gpu-check.sh run $dir"
}

# Site-packages folders of every Python here (system, user, virtual environment).
site_packages() {
    local py
    for py in python3 python; do
        command -v "$py" >/dev/null || continue
        "$py" - <<'EOF' 2>/dev/null || true
import site, sysconfig
seen = []
paths = [sysconfig.get_paths().get(k) for k in ("purelib", "platlib")]
try:
    paths += site.getsitepackages()
except Exception:
    pass
try:
    paths.append(site.getusersitepackages())
except Exception:
    pass
for p in paths:
    if p and p not in seen:
        seen.append(p)
        print(p)
EOF
    done | awk '!seen[$0]++'
}

# Prints a new folder for scratch files: under $1 (the results folder, writable wherever
# the results can be written), else under TMPDIR or /tmp; nothing (and a note) if neither
# works. (Run in $(...): the caller adds it to `cleanup`.)
scratch_dir() {
    local d
    for d in "$1" "${TMPDIR:-/tmp}"; do
        if mkdir -p "$d" 2>/dev/null && d=$(mktemp -d "$d/.zero-gpu-check.XXXXXX" 2>/dev/null); then
            echo "$d"
            return 0
        fi
    done
    say "cannot make a scratch folder in $1 or ${TMPDIR:-/tmp}" >&2
    return 0
}

# Where libnccl.so.2 is when no libnccl.so can be loaded: the folders in $@, then
# LD_LIBRARY_PATH, then ldconfig's cache (a system NCCL without its -dev package).
nccl_so2() {
    local d
    local IFS=:
    # shellcheck disable=SC2086 # split LD_LIBRARY_PATH at ':'
    for d in "$@" ${LD_LIBRARY_PATH:-}; do
        if [ -n "$d" ] && [ -e "$d/libnccl.so" ]; then
            return 0
        fi
    done
    for d in "$@" ${LD_LIBRARY_PATH:-}; do
        if [ -n "$d" ] && [ -e "$d/libnccl.so.2" ]; then
            echo "$d/libnccl.so.2"
            return 0
        fi
    done
    unset IFS
    local cache
    cache=$(ldconfig -p 2>/dev/null || true)
    if grep 'libnccl\.so ' >/dev/null <<<"$cache"; then
        return 0
    fi
    # (sed quits at the first: no `| head`, whose early exit pipefail would see.)
    sed -n '/^[[:space:]]*libnccl\.so\.2 .*=> /{s/.*=> //p;q;}' <<<"$cache"
}

# Put the CUDA libraries on LD_LIBRARY_PATH: nvidia/*/lib of the pip wheels (cu13, cublas,
# cuda_runtime, nccl, ...), and the driver's libcuda where ldconfig does not know it; a
# link libnccl.so -> libnccl.so.2 in a scratch folder under $1 (or TMPDIR) where only the
# latter exists.
cuda_libs() {
    local scratch_parent=$1
    local sp d found=()
    while IFS= read -r sp; do
        [ -d "$sp/nvidia" ] || continue
        for d in "$sp"/nvidia/*/lib "$sp"/nvidia/*/lib64 "$sp"/nvidia/cu13/lib; do
            [ -d "$d" ] && found+=("$d")
        done
    done < <(site_packages)
    # (grep -q would close the pipe early: under pipefail ldconfig's SIGPIPE reads as
    # "not found".)
    if ! ldconfig -p 2>/dev/null | grep 'libcuda\.so' >/dev/null; then
        for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu \
            /usr/lib64 /usr/lib/wsl/lib /usr/local/cuda/compat /usr/local/cuda/lib64; do
            if compgen -G "$d/libcuda.so*" >/dev/null; then
                found+=("$d")
                break
            fi
        done
    fi
    local uniq=() seen=" "
    # (${a[@]+"${a[@]}"}: an empty array is "unbound" under set -u in bash < 4.4.)
    for d in ${found[@]+"${found[@]}"}; do
        case "$seen" in *" $d "*) ;; *)
            uniq+=("$d")
            seen="$seen$d "
            ;;
        esac
    done
    if [ ${#uniq[@]} -eq 0 ]; then
        say "no CUDA libraries found in Python's site-packages (pip install nvidia-cublas nvidia-cuda-runtime, or the cu13 wheels)"
    fi
    # cudarc loads NCCL as libnccl.so, which the wheel (and a system NCCL without its -dev
    # package) does not have, only libnccl.so.2: a folder with that link goes first. No
    # folder for it is no reason to stop: the NCCL checks then say NCCL is missing.
    local so2 lib
    so2=$(nccl_so2 ${uniq[@]+"${uniq[@]}"})
    if [ -n "$so2" ]; then
        lib=$(scratch_dir "$scratch_parent")
        [ -z "$lib" ] || cleanup+=("$lib")
        if [ -n "$lib" ] && ln -s "$so2" "$lib/libnccl.so" 2>/dev/null; then
            uniq=("$lib" ${uniq[@]+"${uniq[@]}"})
        else
            say "could not link libnccl.so -> $so2: the NCCL checks will not find NCCL"
        fi
    fi
    [ ${#uniq[@]} -gt 0 ] || return 0
    local joined
    joined=$(
        IFS=:
        echo "${uniq[*]}"
    )
    export LD_LIBRARY_PATH="$joined${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    say "CUDA libraries: ${uniq[*]}"
}

# The count $1 of the summary in the results JSON $2 ("fail", "fail_performance",
# "out_of_time"; only the summary has them as numbers), or nothing.
summary_count() {
    # (sed quits at the first: no `| head`, whose early exit pipefail would see.)
    sed -n "/^[[:space:]]*\"$1\": [0-9][0-9]*,\{0,1\}\$/{s/[^0-9]//g;p;q;}" "$2" 2>/dev/null || true
}

# Run the checks with the binary and reference of DIR; returns the binary's status.
run_checks() {
    local dir=$1 out=$2
    shift 2
    [ -x "$dir/zero-bench" ] || die "$dir/zero-bench is missing: run 'scripts/gpu-check.sh prepare $dir' first"
    [ -f "$dir/ref/reference.json" ] || die "$dir/ref/reference.json is missing: run 'scripts/gpu-check.sh prepare $dir' first"
    local rc=0 budget=()
    # No check starts after the budget, a minute before the timeout kills the run (so
    # that it ends with its summary), unless ARGS give their own.
    case " $* " in *" --budget-s "* | *" --budget-s="*) ;; *)
        budget=(--budget-s $((run_timeout > 120 ? run_timeout - 60 : run_timeout * 3 / 4)))
        ;;
    esac
    export GPU_CHECK_TIMEOUT=$run_timeout
    timeout --kill-after=10 "$run_timeout" "$dir/zero-bench" gpu-check run --ref "$dir/ref" --out "$out" \
        ${budget[@]+"${budget[@]}"} "$@" || rc=$?
    case $rc in
    0) say "PASSED: every check passed; results in $out/gpu-check.json" ;;
    2) say "FAILED: some checks failed (the FAIL lines above); results in $out/gpu-check.json" ;;
    4) say "PASSED every correctness check, MISSED performance goals (the FAIL lines above); results in $out/gpu-check.json" ;;
    3) say "no GPU: this machine has no usable GPU (reason above); nothing was checked" ;;
    124 | 137)
        if [ "$rc" -eq 124 ] && grep '"finished": true' "$out/gpu-check.json" >/dev/null 2>&1; then
            local missed left_out
            left_out=$(summary_count out_of_time "$out/gpu-check.json")
            missed=$(summary_count fail_performance "$out/gpu-check.json")
            if [ "${missed:-0}" -gt 0 ]; then
                missed="; $missed performance goals missed (the FAIL lines above)"
            else
                missed=
            fi
            say "INCOMPLETE: the budget ran out before every check ran (${left_out:-some} checks 'out of time'); no correctness check that ran failed$missed; results in $out/gpu-check.json"
        else
            say "TIMED OUT after ${run_timeout} s; the checks done so far are in $out/gpu-check.json ('running' names the one killed)"
        fi
        ;;
    *) say "ERROR: zero-bench exited with status $rc" ;;
    esac
    return "$rc"
}

# OUTDIR made and made absolute (the checks' processes run in other folders), or die.
results_dir() {
    mkdir -p "$1" 2>/dev/null || die "cannot create the results folder $1"
    (cd "$1" && pwd) || die "cannot enter the results folder $1"
}

# The driver's compiled-PTX cache (every device the checks open loads the PTX, compiled
# for this GPU once): CUDA_CACHE_PATH if set, else in TMPDIR (or /tmp), else, where that
# cannot be written, in a scratch folder under $1.
jit_cache() {
    local d=${TMPDIR:-/tmp}/zero-cuda-cache
    if [ -n "${CUDA_CACHE_PATH:-}" ]; then
        return
    fi
    if mkdir -p "$d" 2>/dev/null && [ -w "$d" ]; then
        export CUDA_CACHE_PATH=$d
        return
    fi
    d=$(scratch_dir "$1")
    if [ -n "$d" ]; then
        cleanup+=("$d")
        export CUDA_CACHE_PATH=$d
    else
        say "no writable folder for the driver's PTX cache: every device open compiles the PTX again"
    fi
}

run() {
    local dir out
    case "${1:-}" in -h | --help) usage; exit 0 ;; esac
    # Inside a prepared folder the binary is next to this script; in the repository, .gpu-check/.
    dir=$here
    [ -x "$here/zero-bench" ] || dir=$here/../.gpu-check
    if positional "${1:-}"; then dir=$1; shift; fi
    out=$dir/results
    if positional "${1:-}"; then out=$1; shift; fi
    out=$(results_dir "$out")
    cuda_libs "$out"
    # Where it can be written (HOME may be read-only).
    jit_cache "$out"
    run_checks "$dir" "$out" "$@"
}

dry_run() {
    local root dir rc=0
    case "${1:-}" in -h | --help) usage; exit 0 ;; esac
    root=$(repo_root dry-run)
    dir=$root/.gpu-check
    if positional "${1:-}"; then dir=$1; shift; fi
    # Absolute now: prepare changes to the repository root.
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ ! -x "$dir/zero-bench" ] || [ ! -f "$dir/ref/reference.json" ]; then
        prepare "$dir"
    fi
    say "1/2: the CUDA run (expects no GPU here)"
    local out
    out=$(results_dir "$dir/results-cuda")
    cuda_libs "$out"
    run_checks "$dir" "$out" "$@" || rc=$?
    if [ "$rc" -eq 0 ]; then
        say "there is a GPU here and every check passed on it"
    elif [ "$rc" -ne 3 ]; then
        say "dry run FAILED: the CUDA run ended with status $rc (not 'no GPU')"
        return "$rc"
    fi
    say "2/2: the same checks on the simulated GPU"
    rc=0
    out=$(results_dir "$dir/results-sim")
    run_checks "$dir" "$out" --device sim "$@" || rc=$?
    if [ "$rc" -ne 0 ]; then
        say "dry run FAILED"
        return "$rc"
    fi
    say "dry run passed"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
prepare) prepare "$@" ;;
run) run "$@" ;;
dry-run) dry_run "$@" ;;
-h | --help | help) usage ;;
*)
    usage >&2
    exit 1
    ;;
esac
