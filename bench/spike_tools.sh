#!/usr/bin/env bash
# Builds the Spike functional checker for Gemmini programs (service/tuning/gemmini/backends/spike.py) from
# sources into a git-ignored prefix. Pinned to the commits the research note (firesim.md, update 2026-11-27)
# ran bit-exact; libgemmini is only staged here because spike.py rebuilds it per hardware config (it compiles
# its own gemmini_params.h, so one .so serves one config).
#
# usage: bench/spike_tools.sh [PREFIX]    (default: <repo>/.spike-tools)
#   SPIKE_SRC       riscv-isa-sim checkout or bare git dir (default /work/.mirror/riscv-software-src+riscv-isa-sim/repo)
#   LIBGEMMINI_SRC  libgemmini checkout or bare git dir (default /work/.mirror/ucb-bar+libgemmini/repo)
#   ROCC_TESTS_SRC, ROCC_SOFTWARE_SRC, RISCV_TESTS_SRC, RISCV_TEST_ENV_SRC: bare git dirs of
#                   ucb-bar/gemmini-rocc-tests, IBM/rocc-software, riscv/riscv-tests, riscv/riscv-test-env; when all
#                   exist, PREFIX/src/gemmini-rocc-tests is assembled as docs/firesim.md §2 says (GEMMINI_ROCC_TESTS)
#   JOBS            make -j (default 2: the build shares the machine; ~10 min on 2 cores)
#   KEEP_SPIKE_BUILD=1 keeps Spike's 2.4 GB build tree
# then: export KERNELFLEET_RISCV=PREFIX (spike.py finds PREFIX/bin/spike and PREFIX/src/libgemmini)
# Needs g++, make, dtc (device-tree-compiler: Spike runs it at start-up) and, for the programs themselves,
# riscv64-unknown-elf-gcc + picolibc (Debian: gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf).
set -euo pipefail

SPIKE_COMMIT=3084a8e5
LIBGEMMINI_COMMIT=5b1254a
repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=$(realpath -m "${1:-$repo/.spike-tools}")
spike_src=${SPIKE_SRC:-/work/.mirror/riscv-software-src+riscv-isa-sim/repo}
lib_src=${LIBGEMMINI_SRC:-/work/.mirror/ucb-bar+libgemmini/repo}
jobs=${JOBS:-2}

for tool in g++ make dtc; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install g++ make device-tree-compiler)" >&2; exit 1; }
done

# a bare git dir (what the mirror holds) is exported at the pinned commit; a work tree is used as it is
stage() { # stage <src> <commit> <dest>
  rm -rf "$3" && mkdir -p "$3"
  if git --git-dir="$1" rev-parse --verify -q "$2^{commit}" >/dev/null 2>&1; then
    git --git-dir="$1" archive "$2" | tar -x -C "$3"
  else
    cp -a "$1"/. "$3"/
  fi
}

mkdir -p "$prefix/src"
if [[ -x "$prefix/bin/spike" ]]; then
  echo "spike already in $prefix/bin (remove it to rebuild)"
else
  stage "$spike_src" "$SPIKE_COMMIT" "$prefix/src/riscv-isa-sim"
  mkdir -p "$prefix/src/riscv-isa-sim/build"
  (cd "$prefix/src/riscv-isa-sim/build" && ../configure --prefix="$prefix" && make -j"$jobs" && make install)
  # the build tree is 2.4 GB of objects; the install (bin/, lib/, include/riscv/) is all libgemmini and runs need
  [[ -n "${KEEP_SPIKE_BUILD:-}" ]] || rm -rf "$prefix/src/riscv-isa-sim"
fi
stage "$lib_src" "$LIBGEMMINI_COMMIT" "$prefix/src/libgemmini"
echo "$SPIKE_COMMIT" >"$prefix/src/riscv-isa-sim.commit"
echo "$LIBGEMMINI_COMMIT" >"$prefix/src/libgemmini.commit"

# the programs' build tree (docs/firesim.md §2): only the parts the bare-metal build reads. riscv-tests' pinned
# c84daca8 is not in the mirror; HEAD's benchmarks/common (crt.S, syscalls.c, test.ld) serves the same role
m=/work/.mirror
rt_src=${ROCC_TESTS_SRC:-$m/ucb-bar+gemmini-rocc-tests/repo}
rs_src=${ROCC_SOFTWARE_SRC:-$m/IBM+rocc-software/repo}
tests_src=${RISCV_TESTS_SRC:-$m/riscv+riscv-tests/repo}
env_src=${RISCV_TEST_ENV_SRC:-$m/riscv+riscv-test-env/repo}
if [[ -d "$rt_src" && -d "$rs_src" && -d "$tests_src" && -d "$env_src" ]]; then
  rt=$prefix/src/gemmini-rocc-tests
  rm -rf "$rt" && mkdir -p "$rt/rocc-software" "$rt/riscv-tests"
  # (git names imagenet blobs the mirror lacks as "invalid object": those files are not archived or read)
  git --git-dir="$rt_src" archive 180c4684 include bareMetalC Makefrag | tar -x -C "$rt"
  git --git-dir="$rs_src" archive fddb795a | tar -x -C "$rt/rocc-software"
  git --git-dir="$tests_src" archive HEAD | tar -x -C "$rt/riscv-tests"
  git --git-dir="$env_src" archive HEAD | tar -x -C "$rt/riscv-tests/env"
  echo "gemmini-rocc-tests: export GEMMINI_ROCC_TESTS=$rt"
else
  echo "gemmini-rocc-tests sources not all present: GEMMINI_ROCC_TESTS left to you (docs/firesim.md §2)"
fi
echo "done: export KERNELFLEET_RISCV=$prefix"
