"""The bare-metal Gemmini C program a FireSim run executes: one call per candidate with explicit tile
factors, `read_cycles()` around it, a CPU reference check, and one fixed-format line per candidate:

    TUNE_RESULT id=<n> cycles=<N> correct=<0|1> saturated=<n>

`correct` is 1 only when every output equals the CPU reference bit for bit; `saturated` counts reference
outputs at the int8 limits, where a wrong accumulation would be clamped to the right answer (constant fills made
80 % of a QKV reference saturate, research note update 2026-11-27). Inputs are LCG fills whose span and density
are scaled by the reduction length so the reference's spread stays well inside int8 (`fill_params`).

Calls follow gemmini-rocc-tests' include/gemmini.h (research note §2.1): `tiled_matmul` (L1104) with
tile_I/J/K in DIM blocks, `tiled_conv` (L2168) with batches/porows/pocols/pochs/krows/kcols/kchs. It must be
compiled against the `gemmini_params.h` of the bitstream's generator config: `baremetal_build_cmd` is
gemmini-rocc-tests' bareMetalC/Makefile `%-baremetal` rule (its CFLAGS, riscv-tests' crt.S/syscalls.c/test.ld)
with that header first on the include path; `--specs=picolibc.specs` lets Debian's bare-metal GCC
(gcc-riscv64-unknown-elf + picolibc-riscv64-unknown-elf) find libc headers and libm. Checked against
gemmini-rocc-tests@180c4684 (with rocc-software@fddb795a) by tests/tuning/gemmini/test_firesim_contract.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import NamedTuple

from service.tuning.gemmini.model import resolve
from service.tuning.gemmini.space import HwConfig, Layer, Mapping

RESULT_RE = re.compile(r"^TUNE_RESULT id=(\d+) cycles=(\d+) correct=([01]) saturated=(\d+)\s*$")
CANDIDATE_RE = re.compile(r"^// KF_CANDIDATE (.*)$")  # a machine-readable manifest line per candidate


# the reference's target standard deviation: a sum of independent products is near-normal, so 127 is ~8 sigma
# away and even a million outputs stay far from the limits, while ~16 leaves many distinct values to compare
TARGET_STD = 16.0


class TuneResult(NamedTuple):
    cycles: int  # read_cycles() around the call: real cycles on FireSim, instruction counts on Spike
    correct: bool
    saturated: int


def fill_params(reduction: int) -> tuple[int, int]:
    """(span, keep): entries nonzero with probability keep/256, magnitude uniform in 1..span. One output sums
    `reduction` products of two such entries, so its std is sqrt(reduction)·E[x²], E[x²] = keep/256·(s+1)(2s+1)/6;
    the largest span (then density) keeping that within TARGET_STD."""
    bound = TARGET_STD / math.sqrt(max(1, reduction))
    for span in (4, 3, 2):
        if (span + 1) * (2 * span + 1) / 6 <= bound:
            return span, 256
    return 1, max(1, min(256, math.floor(256 * bound)))


def _fills(i: int, a: str, b: str, na: int, nb: int, reduction: int) -> str:
    span, keep = fill_params(reduction)
    one = "fill((elem_t*){}, {}, {}u, {}, {});"
    return one.format(a, na, 2 * i + 1, span, keep) + " " + one.format(b, nb, 2 * i + 2, span, keep)


def _report(i: int, out: str, ref: str, n: int) -> str:
    return (
        f'printf("TUNE_RESULT id={i} cycles=%llu correct=%d saturated=%lu\\n", (unsigned long long)(end - start),\n'
        f"         same((elem_t*){out}, (elem_t*){ref}, {n}), (unsigned long)saturated((elem_t*){ref}, {n}));"
    )


def _matmul(i: int, hw: HwConfig, lay: Layer, m: Mapping) -> str:
    dI, dJ, dK = lay.N, lay.K, lay.C
    ti, tj, tk = m.t("N") // hw.dim, m.t("K") // hw.dim, m.t("C") // hw.dim
    flow = resolve(hw, lay, m).flow  # the layer's tiled_matmul_type: the array's, or BOTH's per-layer pick
    return f"""
// KF_CANDIDATE id={i} op=gemm I={dI} J={dJ} K={dK} tile_I={ti} tile_J={tj} tile_K={tk} dataflow={flow}
static elem_t A{i}[{dI}][{dK}] row_align(1);
static elem_t B{i}[{dK}][{dJ}] row_align(1);
static elem_t C{i}[{dI}][{dJ}] row_align(1);
static elem_t R{i}[{dI}][{dJ}] row_align(1);
static void run{i}(void) {{
  {_fills(i, f"A{i}", f"B{i}", dI * dK, dK * dJ, dK)}
  gemmini_flush(0);
  uint64_t start = read_cycles();
  tiled_matmul({dI}, {dJ}, {dK}, (elem_t*)A{i}, (elem_t*)B{i}, NULL, (elem_t*)C{i}, {dK}, {dJ}, {dJ}, {dJ},
               MVIN_SCALE_IDENTITY, MVIN_SCALE_IDENTITY, MVIN_SCALE_IDENTITY, NO_ACTIVATION, ACC_SCALE_IDENTITY,
               0, false, {ti}, {tj}, {tk}, false, false, false, false, 0, {flow});
  gemmini_fence();
  uint64_t end = read_cycles();
  tiled_matmul_auto({dI}, {dJ}, {dK}, (elem_t*)A{i}, (elem_t*)B{i}, NULL, (elem_t*)R{i}, {dK}, {dJ}, {dJ}, {dJ},
                    MVIN_SCALE_IDENTITY, MVIN_SCALE_IDENTITY, MVIN_SCALE_IDENTITY, NO_ACTIVATION,
                    ACC_SCALE_IDENTITY, 0, false, false, false, false, false, 0, CPU);
  {_report(i, f"C{i}", f"R{i}", dI * dJ)}
}}
"""


def _conv(i: int, hw: HwConfig, lay: Layer, m: Mapping) -> str:
    if lay.R != lay.S or lay.P != lay.Q:
        raise ValueError(f"{lay.name}: tiled_conv takes square images and kernels")
    # the layer as given, padding and all (tiled_conv pads in the DMA); a Layer without recorded input dims is
    # run pre-padded, which computes the same outputs
    pad = lay.padding if lay.H else 0
    H, W = (lay.H, lay.W) if lay.H else (lay.in_rows(lay.P), lay.in_cols(lay.Q))
    n, c, k, r = lay.N, lay.C, lay.K, lay.R
    args = ", ".join(str(m.t(d)) for d in ("N", "P", "Q", "K", "R", "S", "C"))
    flow = "WS"  # tiled_conv exits on OS (gemmini.h L2217); fit never lets an OS conv through
    dims = f"{n}, {H}, {W}, {c}, {k}, {lay.P}, {lay.Q}, {lay.stride}, 1, 1, {pad}, {r}"
    shape = f"N={n} H={H} W={W} C={c} K={k} R={r} stride={lay.stride} padding={pad} P={lay.P}"
    return f"""
// KF_CANDIDATE id={i} op=conv {shape} tiles={args}
static elem_t In{i}[{n}][{H}][{W}][{c}] row_align(1);
static elem_t W{i}[{r * r * c}][{k}] row_align(1);
static elem_t O{i}[{n * lay.P * lay.Q}][{k}] row_align(1);
static elem_t OR{i}[{n * lay.P * lay.Q}][{k}] row_align(1);
static void run{i}(void) {{
  {_fills(i, f"In{i}", f"W{i}", n * H * W * c, r * r * c * k, r * r * c)}
  gemmini_flush(0);
  uint64_t start = read_cycles();
  tiled_conv({dims},
             {c}, {k}, {k}, false, false, false, false, false, {args},
             (elem_t*)In{i}, (elem_t*)W{i}, NULL, (elem_t*)O{i}, NO_ACTIVATION, ACC_SCALE_IDENTITY, 0, 0, 0, {flow});
  gemmini_fence();
  uint64_t end = read_cycles();
  tiled_conv_auto({dims},
                  false, false, false, false, false, (elem_t*)In{i}, (elem_t*)W{i}, NULL, (elem_t*)OR{i},
                  NO_ACTIVATION, ACC_SCALE_IDENTITY, 0, 0, 0, CPU);
  {_report(i, f"O{i}", f"OR{i}", n * lay.P * lay.Q * k)}
}}
"""


# bareMetalC/Makefile's CFLAGS + CFLAGS_BAREMETAL (gemmini-rocc-tests@180c4684)
MAKEFILE_CFLAGS = [
    "-DPREALLOCATE=1",
    "-DMULTITHREAD=1",
    "-mcmodel=medany",
    "-std=gnu99",
    "-O2",
    "-ffast-math",
    "-fno-common",
    "-fno-builtin-printf",
    "-fno-tree-loop-distribute-patterns",
    "-march=rv64gc",
    "-Wa,-march=rv64gc",
    "-DPRINT_TILE=0",
    "-DBAREMETAL=1",
]
# what newer GCCs make errors anyway: a wrong call must not slip through as a warning
STRICT_CFLAGS = [
    "-Werror=implicit-function-declaration",
    "-Werror=int-conversion",
    "-Werror=incompatible-pointer-types",
]


def baremetal_build_cmd(
    src: Path, out: Path, params_dir: Path, rocc_tests: Path, cc: str = "riscv64-unknown-elf-gcc", link: bool = True
) -> list[str]:
    """The compiler command building `src` into a bare-metal binary (or an object, link=False) against
    gemmini-rocc-tests at `rocc_tests` and the generated `params_dir`/include/gemmini_params.h."""
    common = rocc_tests / "riscv-tests" / "benchmarks" / "common"
    inc = [params_dir, rocc_tests / "riscv-tests", rocc_tests / "riscv-tests" / "env", rocc_tests, common]
    cmd = [cc, "--specs=picolibc.specs", *MAKEFILE_CFLAGS, *STRICT_CFLAGS, *(f"-I{p}" for p in inc)]
    if not link:
        return [*cmd, "-c", str(src), "-o", str(out)]
    return [
        *cmd,
        "-nostdlib",
        "-nostartfiles",
        "-static",
        "-T",
        str(common / "test.ld"),
        str(src),
        "-o",
        str(out),
        str(common / "syscalls.c"),
        str(common / "crt.S"),
        "-lm",
        "-lgcc",
    ]


def render_program(hw: HwConfig, candidates: list[tuple[Layer, Mapping]]) -> str:
    """The C source measuring `candidates` (all on `hw`), in order: candidate id = position."""
    bodies = [(_matmul if lay.op == "gemm" else _conv)(i, hw, lay, m) for i, (lay, m) in enumerate(candidates)]
    calls = "\n".join(f"  run{i}();" for i in range(len(candidates)))
    return f"""// generated by KernelFleet for Gemmini config {hw.key()}: {hw.generator_config()}
#include <stdint.h>
#include <stdio.h>
#include "include/gemmini.h"
#include "include/gemmini_testutils.h"

// Numerical Recipes' LCG: seeded per array, so every run (FireSim, Spike) sees the same inputs
static void fill(elem_t* p, size_t n, uint32_t s, unsigned span, unsigned keep) {{
  for (size_t i = 0; i < n; i++) {{
    s = s * 1664525u + 1013904223u;  // high bits are the LCG's good ones: keep, sign, magnitude from them
    const int v = (int)(((s >> 16) & 127u) % span) + 1;
    p[i] = (s >> 24) < keep ? (elem_t)((s >> 23) & 1u ? v : -v) : 0;
  }}
}}
static int same(const elem_t* a, const elem_t* b, size_t n) {{
  for (size_t i = 0; i < n; i++) if (a[i] != b[i]) return 0;
  return 1;
}}
static size_t saturated(const elem_t* ref, size_t n) {{
  size_t c = 0;
  for (size_t i = 0; i < n; i++) c += ref[i] == elem_t_max || ref[i] == elem_t_min;
  return c;
}}
{"".join(bodies)}
int main(void) {{
#ifndef BAREMETAL
  if (mlockall(MCL_CURRENT | MCL_FUTURE) != 0) exit(1);
#endif
  gemmini_flush(0);
{calls}
  exit(0);
}}
"""


def parse_uartlog(text: str, expected: int) -> dict[int, TuneResult]:
    """id → TuneResult from a uartlog (FireSim) or Spike's stdout; raises ValueError naming what is missing or
    malformed."""
    found: dict[int, TuneResult] = {}
    for line in text.splitlines():
        if line.startswith("TUNE_RESULT"):
            mt = RESULT_RE.match(line.strip())
            if not mt:
                raise ValueError(f"malformed result line in uartlog: {line.strip()[:120]!r}")
            found[int(mt.group(1))] = TuneResult(int(mt.group(2)), mt.group(3) == "1", int(mt.group(4)))
    missing = [i for i in range(expected) if i not in found]
    if missing:
        raise ValueError(f"uartlog has no TUNE_RESULT line for candidate(s) {missing} of {expected}")
    return found
