"""The bare-metal Gemmini C program a FireSim run executes: one call per candidate with explicit tile
factors, `read_cycles()` around it, a CPU reference check, and one fixed-format line per candidate:

    TUNE_RESULT id=<n> cycles=<N> correct=<0|1>

Calls follow gemmini-rocc-tests' include/gemmini.h (research note §2.1): `tiled_matmul` (L1104) with
tile_I/J/K in DIM blocks, `tiled_conv` (L2168) with batches/porows/pocols/pochs/krows/kcols/kchs. It must be
compiled against the `gemmini_params.h` of the bitstream's generator config: `baremetal_build_cmd` is
gemmini-rocc-tests' bareMetalC/Makefile `%-baremetal` rule (its CFLAGS, riscv-tests' crt.S/syscalls.c/test.ld)
with that header first on the include path; `--specs=picolibc.specs` lets Debian's bare-metal GCC
(gcc-riscv64-unknown-elf + picolibc-riscv64-unknown-elf) find libc headers and libm. Checked against
gemmini-rocc-tests@180c4684 (with rocc-software@fddb795a) by tests/tuning/gemmini/test_firesim_contract.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from service.tuning.gemmini.model import resolve
from service.tuning.gemmini.space import HwConfig, Layer, Mapping

RESULT_RE = re.compile(r"^TUNE_RESULT id=(\d+) cycles=(\d+) correct=([01])\s*$")
CANDIDATE_RE = re.compile(r"^// KF_CANDIDATE (.*)$")  # a machine-readable manifest line per candidate


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
  fill((elem_t*)A{i}, {dI * dK}); fill((elem_t*)B{i}, {dK * dJ});
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
  printf("TUNE_RESULT id={i} cycles=%llu correct=%d\\n", (unsigned long long)(end - start),
         same((elem_t*)C{i}, (elem_t*)R{i}, {dI * dJ}));
}}
"""


def _conv(i: int, hw: HwConfig, lay: Layer, m: Mapping) -> str:
    if lay.R != lay.S or lay.P != lay.Q:
        raise ValueError(f"{lay.name}: tiled_conv takes square images and kernels")
    H = lay.in_rows(lay.P)
    n, c, k, r = lay.N, lay.C, lay.K, lay.R
    args = ", ".join(str(m.t(d)) for d in ("N", "P", "Q", "K", "R", "S", "C"))
    flow = "WS"  # tiled_conv exits on OS (gemmini.h L2217); fit never lets an OS conv through
    return f"""
// KF_CANDIDATE id={i} op=conv N={n} H={H} C={c} K={k} R={r} stride={lay.stride} P={lay.P} tiles={args}
static elem_t In{i}[{n}][{H}][{H}][{c}] row_align(1);
static elem_t W{i}[{r * r * c}][{k}] row_align(1);
static elem_t O{i}[{n * lay.P * lay.P}][{k}] row_align(1);
static elem_t OR{i}[{n * lay.P * lay.P}][{k}] row_align(1);
static void run{i}(void) {{
  fill((elem_t*)In{i}, {n * H * H * c}); fill((elem_t*)W{i}, {r * r * c * k});
  gemmini_flush(0);
  uint64_t start = read_cycles();
  tiled_conv({n}, {H}, {H}, {c}, {k}, {lay.P}, {lay.P}, {lay.stride}, 1, 1, 0, {r},
             {c}, {k}, {k}, false, false, false, false, false, {args},
             (elem_t*)In{i}, (elem_t*)W{i}, NULL, (elem_t*)O{i}, NO_ACTIVATION, ACC_SCALE_IDENTITY, 0, 0, 0, {flow});
  gemmini_fence();
  uint64_t end = read_cycles();
  tiled_conv_auto({n}, {H}, {H}, {c}, {k}, {lay.P}, {lay.P}, {lay.stride}, 1, 1, 0, {r},
                  false, false, false, false, false, (elem_t*)In{i}, (elem_t*)W{i}, NULL, (elem_t*)OR{i},
                  NO_ACTIVATION, ACC_SCALE_IDENTITY, 0, 0, 0, CPU);
  printf("TUNE_RESULT id={i} cycles=%llu correct=%d\\n", (unsigned long long)(end - start),
         same((elem_t*)O{i}, (elem_t*)OR{i}, {n * lay.P * lay.P * k}));
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

static void fill(elem_t* p, size_t n) {{ for (size_t i = 0; i < n; i++) p[i] = (elem_t)((i * 7 + 3) % 5 - 2); }}
static int same(const elem_t* a, const elem_t* b, size_t n) {{
  for (size_t i = 0; i < n; i++) if (a[i] != b[i]) return 0;
  return 1;
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


def parse_uartlog(text: str, expected: int) -> dict[int, tuple[int, bool]]:
    """id → (cycles, correct) from a uartlog; raises ValueError naming what is missing or malformed."""
    found: dict[int, tuple[int, bool]] = {}
    for line in text.splitlines():
        if line.startswith("TUNE_RESULT"):
            mt = RESULT_RE.match(line.strip())
            if not mt:
                raise ValueError(f"malformed result line in uartlog: {line.strip()[:120]!r}")
            found[int(mt.group(1))] = (int(mt.group(2)), mt.group(3) == "1")
    missing = [i for i in range(expected) if i not in found]
    if missing:
        raise ValueError(f"uartlog has no TUNE_RESULT line for candidate(s) {missing} of {expected}")
    return found
