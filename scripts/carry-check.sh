#!/usr/bin/env bash
# The carried GPU build: zero-bench with CUDA and without MPI and HDF5, one binary that runs
# on a machine with only a GPU driver and the CUDA libraries (no MPI, no HDF5, no Rust; the
# CUDA libraries are loaded at run time). Builds it, strips a copy, and checks the copy:
#
#   - it needs (ELF NEEDED) no libmpi*, libhdf5* or libopen-* (Open MPI's libopen-pal/rte);
#   - the highest GLIBC_ symbol version it references is at most CARRY_MAX_GLIBC (2.34);
#   - it starts here (`--help`).
#
# Prints its size, what it needs and its highest GLIBC version; exits non-zero with the
# reason otherwise. The stripped copy is left at $CARRY_TARGET_DIR/carry/zero-bench.
#
#   scripts/carry-check.sh            # target-carry/, glibc <= 2.34
#   CARRY_MAX_GLIBC=2.31 scripts/carry-check.sh
set -euo pipefail
case "${1:-}" in
    -h | --help) sed -n '2,14s/^# \{0,1\}//p' "$0"; exit 0 ;;
    "") ;;
    *) echo "carry-check: unknown argument '$1' (see --help)" >&2; exit 1 ;;
esac
cd "$(dirname "$0")/.."

target=${CARRY_TARGET_DIR:-target-carry}
max_glibc=${CARRY_MAX_GLIBC:-2.34}

fail() {
    echo "carry-check: FAILED: $*" >&2
    exit 1
}

for tool in readelf objdump strip; do
    command -v "$tool" >/dev/null || fail "$tool not found (install binutils)"
done

echo "carry-check: cargo build -p zero-bench --release --no-default-features --features nccl (cuda + NCCL loaded at run time; into $target/)"
cargo build -p zero-bench --release --no-default-features --features nccl --target-dir "$target"

built="$target/release/zero-bench"
[ -x "$built" ] || fail "$built was not built"
out="$target/carry/zero-bench"
mkdir -p "$(dirname "$out")"
cp "$built" "$out"
strip --strip-all "$out"

# NEEDED entries: "0x... (NEEDED)  Shared library: [libc.so.6]".
needed=$(readelf -d "$out" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || fail "readelf -d found no NEEDED entry in $out (not a dynamic executable?)"
forbidden=$(grep -E '^lib(mpi|hdf5|open-)' <<<"$needed" || true)

# Version needs (readelf -V: "Name: GLIBC_2.34  Flags: none  Version: 5"), and the same from
# the dynamic symbol table (objdump -T: "(GLIBC_2.34) memcpy"), in case one misses some.
# (`|| true`: a grep that finds nothing, or objdump refusing a file, must not end the script
# under pipefail before the message below.)
versions=$( { readelf -V "$out" | grep -o 'Name: GLIBC_[0-9][0-9.]*' | sed 's/Name: //'
              objdump -T "$out" | grep -o 'GLIBC_[0-9][0-9.]*'; } | sort -u -V) || true
[ -n "$versions" ] || fail "no GLIBC_ version found in $out (readelf -V, objdump -T)"
highest=$(tail -n 1 <<<"$versions")
highest_num=${highest#GLIBC_}

size=$(stat -c %s "$out")
echo "carry-check: $out: $size bytes ($(( (size + 1048575) / 1048576 )) MiB) stripped, unstripped $(stat -c %s "$built") bytes"
echo "carry-check: NEEDED: $(tr '\n' ' ' <<<"$needed")"
echo "carry-check: highest GLIBC version referenced: $highest_num (limit $max_glibc)"
runpath=$(readelf -d "$out" | sed -n 's/.*(\(RPATH\|RUNPATH\)).*\[\(.*\)\]/\1 \2/p')
[ -z "$runpath" ] || echo "carry-check: note: $runpath"

if [ -n "$forbidden" ]; then
    fail "$out needs $(tr '\n' ' ' <<<"$forbidden")(MPI/HDF5 are not on the GPU machine): a crate links them without its feature; see 'cargo tree -p zero-bench --no-default-features --features nccl -i mpi' (or -i hdf5-metno)"
fi
if [ "$(printf '%s\n%s\n' "$highest_num" "$max_glibc" | sort -V | tail -n 1)" != "$max_glibc" ]; then
    symbols=$(objdump -T "$out" | grep -F "($highest)" | awk '{print $NF}' | sort -u | tr '\n' ' ')
    fail "$out references $highest (above $max_glibc, the GPU machine's): symbols ${symbols:-?}"
fi
"$out" --help >/dev/null || fail "$out --help did not run here"
# Training on the GPU from the carried binary: a short run where there is a GPU, else a
# clear error (exit 1, naming the missing driver or device), never a panic.
rc=0
train_out=$("$out" train --device cuda --config configs/tiny.toml --steps 2 --no-progress 2>&1) || rc=$?
if [ "$rc" -eq 0 ]; then
    echo "carry-check: train --device cuda: trained 2 steps on this machine's GPU"
elif [ "$rc" -eq 1 ] && grep -q -e 'no CUDA driver' -e 'requested but only' <<<"$train_out"; then
    echo "carry-check: train --device cuda without a GPU: exit 1, $(grep -o 'error: .*' <<<"$train_out" | head -n 1 | cut -c1-120)"
else
    fail "train --device cuda ended with status $rc and no clear reason: $train_out"
fi
echo "carry-check: OK: no MPI, no HDF5, glibc <= $max_glibc"
