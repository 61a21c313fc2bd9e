"""The GEMV-family uKernel for small M (service/tuning/tuners/pipeline/gemv.py), checked without a GPU.

What runs here: dlight's schedule and ours side by side (structural equality), the host launch TVM builds, nvcc
to a cubin for sm_90a (`-Xptxas -v`: registers, stack frame, spills, shared memory) and cuobjdump's SASS (128-bit
global loads, warp shuffles, no shared-memory reads of W), and the numbers: the generated CUDA of the fp32 kernels
executed on the CPU by a small emulator (below) and compared with numpy. What does not: timing, or anything of
the GPU's own (memory ordering, warp divergence as hardware does it); tests/tuning/gpu/test_on_gpu.py has those.

The emulator: the kernel's CUDA source, from its `extern "C"` declaration on, compiled with g++ against a shim that
defines the few CUDA features it uses. Each CUDA thread of a block is a ucontext run round-robin on one OS thread;
`__syncthreads` and each half of a warp shuffle yield to the next thread, so every thread reaches a barrier before
any passes it. Blocks run one after another (so `__shared__` arrays are function statics). A thread that finishes
while another still waits at a barrier fails the run (the kernels here meet the same barriers in the same order).
fp16 and bf16 kernels are not emulated (the shim has no half type).
"""

from __future__ import annotations

import importlib
import math
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.tuning.builder.cuda import cuda_target, pass_config
from service.tuning.cuda_toolchain import nvcc_path
from service.tuning.gpu_model.access import analyze
from service.tuning.gpu_model.arch import sm_spec
from service.tuning.gpu_model.bound import predict
from service.tuning.gpu_model.cubin import compile_listing, opcode_counts, parse_ptxas, tool_path
from service.tuning.tuners.pipeline.gemv import (
    BLOCK_THREADS,
    GemvTile,
    build_gemv,
    default_gemv,
    gemv_candidates,
    schedule_gemv,
)
from service.tuning.tuners.pipeline.schedule import (
    GemmTile,
    compile_cuda,
    cuda_source,
    dense_module,
    schedule_gemm,
)

LAYERS = {"qkv": (2304, 768), "ffn_down": (768, 3072)}
ARCH = "sm_90a"


needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="no nvcc (pip install -e .[dev] brings the pinned wheel)")
needs_cuobjdump = pytest.mark.skipif(
    nvcc_path() is None or tool_path("cuobjdump") is None,
    reason="no nvcc or cuobjdump (pip install -e .[dev] brings nvidia-cuda-cuobjdump)",
)
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulator of the kernels needs g++")


def _fp32_candidates() -> list[tuple[str, str]]:
    return [(layer, tile.label()) for layer, (n, k) in LAYERS.items() for tile in gemv_candidates(n, k)]


# --- the schedule is dlight's ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", sorted(LAYERS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("bucket", [4, 8])
def test_dlight_parameters_give_dlights_own_schedule(layer: str, dtype: str, bucket: int) -> None:
    import tvm
    import tvm_ffi
    from tvm.s_tir.dlight.gpu import LowBatchGEMV

    n, k = LAYERS[layer]
    target = tvm.target.Target(cuda_target(ARCH))
    theirs = LowBatchGEMV(bucket).apply(dense_module(n, k, None, dtype)["main"], target, False)
    ours = schedule_gemv(GemvTile.dlight(n, k, bucket=bucket), n, k, dtype, cuda_target(ARCH))
    assert tvm_ffi.structural_equal(ours.mod, theirs.mod)


def test_tiles_labels_defaults_and_problems() -> None:
    assert default_gemv(*LAYERS["qkv"]).label() == "gemv_8x32_s1_r4v4_b4"
    assert default_gemv(*LAYERS["ffn_down"]).label() == "gemv_2x128_s1_r4v4_b4"
    assert default_gemv(*LAYERS["qkv"], "float16").label() == "gemv_8x32_s1_r8v4_b4_st"
    assert default_gemv(*LAYERS["ffn_down"], "float16").label() == "gemv_4x64_s1_r8v4_b4_st"
    for layer, (n, k) in LAYERS.items():  # bf16: the same 2-byte elements, so the same tiles as fp16
        assert gemv_candidates(n, k, "bfloat16") == gemv_candidates(n, k, "float16"), layer
    assert GemvTile.dlight(*LAYERS["qkv"]) == GemvTile(4, 64, 2, 4, 4, 4)
    assert GemvTile.dlight(*LAYERS["ffn_down"]) == GemvTile(16, 32, 2, 8, 4, 4)
    for layer, (n, k) in LAYERS.items():
        for dtype in ("float32", "float16", "bfloat16"):
            tiles = gemv_candidates(n, k, dtype)
            assert len(tiles) >= 4 and len(set(tiles)) == len(tiles), (layer, dtype)
            for tile in tiles:
                assert tile.problem(n, k, dtype) is None and tile.threads <= BLOCK_THREADS
                assert GemvTile.from_label(tile.label()) == tile
                assert tile.max_rows == 16 and tile.bucket <= tile.max_rows
    odd = GemvTile(ts=8, tr=32, tile_s=1, tile_r=4, vec=4, bucket=4, stage=True, unroll=64, max_rows=8)
    assert GemvTile.from_label(odd.label()) == odd
    n, k = LAYERS["qkv"]
    assert "multiple of the warp" in str(GemvTile(tr=48).problem(n, k))
    assert "must divide N" in str(GemvTile(ts=7).problem(n, k))
    assert "must divide K" in str(GemvTile(ts=1, tr=512, tile_r=4).problem(n, k))
    assert "1, 2 or 4 lanes" in str(GemvTile(tile_r=8, vec=8).problem(n, k, "float16"))
    assert "exceeds max_rows" in str(GemvTile(bucket=32).problem(n, k))
    with pytest.raises(ValueError, match="must divide N"):
        schedule_gemv(GemvTile(ts=7), n, k)


def test_calling_convention_is_the_gemm_ukernels() -> None:
    """`main(X, W, Y)`: the same buffers, shapes, dtypes and symbolic M as schedule.build_gemm's."""
    n, k = LAYERS["qkv"]

    def params(func: Any) -> list[tuple[str, list[str], str]]:
        return [(str(b.name), [str(s) for s in b.shape], str(b.dtype)) for b in func.params]

    gemm = params(schedule_gemm(GemmTile(8, 32, 32, 1, 1, 2), n, k).mod["main"])
    for dtype in ("float32", "float16", "bfloat16"):
        ours = params(schedule_gemv(default_gemv(n, k, dtype), n, k, dtype).mod["main"])
        assert ours == [("X", ["M", str(k)], dtype), ("W", [str(n), str(k)], dtype), ("Y", ["M", str(n)], "float32")]
        if dtype == "float32":
            assert ours == gemm
    module = build_gemv(default_gemv(n, k), n, k, cuda_target(ARCH))
    assert [m.kind for m in module.imports] == ["cuda"] and module["main"] is not None
    kernel = cuda_source(module)
    assert len(re.findall(r"__global__ void .*\) \{", kernel)) == 1  # one kernel: one launch
    assert "int M" in kernel.split("main_kernel(", 1)[1].split(")", 1)[0]  # one binary for every M


def _host_launch(tile: GemvTile, n: int, k: int, m: int, dtype: str = "float32") -> tuple[list[int], dict[str, int]]:
    """The int arguments and launch extents TVM's host code passes to the kernel at M = m, read from the host
    function of the lowered module (the expressions are printed as Python: M, //, %, +, *)."""
    import tvm

    target = tvm.target.Target(cuda_target(ARCH)).with_host(tvm.target.Target("llvm"))
    with target, tvm.transform.PassContext(config=pass_config(ARCH)):
        mod = tvm.tirx.transform.BindTarget(target)(schedule_gemv(tile, n, k, dtype).mod)
        pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(target)
        host, _ = importlib.import_module("tvm.tirx.build").split_host_device_mods(pipeline(mod))
    text = host.script()
    env: dict[str, int] = {"M": m}
    for name, expr in re.findall(r"^\s*(\w+): T\.let\[T\.int32\] = (.+)$", text, re.MULTILINE):
        if name != "M" and "T." not in expr:  # the launch's own integers, not the argument unpacking
            env[name] = int(eval(expr, {"__builtins__": {}}, env))  # TVM's printed integer arithmetic, no builtins
    call = re.search(r'T\.call_ffi_kernel\("main_kernel", (.*), launch_params=\[(.*?)\]', text)
    assert call is not None, text
    args = [a.strip() for a in call.group(1).split(",")]
    names = [p.strip().strip('"') for p in call.group(2).split(",")]
    values = [int(eval(a, {"__builtins__": {}}, env)) for a in args if not a.endswith(".data")]
    ints, extents = values[: len(values) - len(names)], values[len(values) - len(names) :]
    return ints, dict(zip(names, extents, strict=True))


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_the_launch_is_the_grid_formula(layer: str) -> None:
    n, k = LAYERS[layer]
    tile = default_gemv(n, k)
    for m in (1, 4, 5, 16, 17, 100):
        ints, extents = _host_launch(tile, n, k, m)
        assert ints[0] == m  # the kernel's M
        gx, gy = tile.grid(n, m)
        assert extents == {"blockIdx.x": gx, "blockIdx.y": gy, "threadIdx.x": tile.tr, "threadIdx.y": tile.ts}
        assert gx == n // (tile.ts * tile.tile_s) and gy == math.ceil(m / tile.bucket)


# --- what nvcc and ptxas make of it ------------------------------------------------------------------------------


def _ptxas(source: str, arch: str = ARCH) -> dict[str, int]:
    """`nvcc -cubin -arch=sm_90a -O3 -Xptxas -v` on the source: registers, stack frame, spills, static shared."""
    log, _ = compile_listing(source, arch)
    (figures,) = parse_ptxas(log).values()
    return {
        "registers": figures["registers"],
        "smem": figures["shared_bytes"],
        "stack": figures["stack_bytes"],
        "spill_stores": figures["spill_stores"],
        "spill_loads": figures["spill_loads"],
    }


def _shipped(source: str, workdir: Path) -> tuple[dict[str, int], Counter[str]]:
    """The cubin as the worker builds it (schedule.compile_cuda: TVM's nvcc flags): cuobjdump's resource usage
    (REG, STACK, SHARED, LOCAL) and the SASS opcode counts (static: each instruction once)."""
    cubin = workdir / "kernel.cubin"
    cubin.write_bytes(compile_cuda(source, ARCH, "cubin"))
    tool = str(tool_path("cuobjdump"))
    res = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    usage = {key: int(value) for key, value in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", res)}
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return usage, sum(opcode_counts(sass).values(), Counter())


def _family(ops: Counter[str], prefix: str) -> int:
    return sum(count for op, count in ops.items() if op == prefix or op.startswith(prefix + "."))


def _expected_sass(tile: GemvTile, k: int, dtype: str) -> dict[str, int]:
    """The fully unrolled kernel's static instruction counts, from the tile alone."""
    load = tile.load_elements(dtype)
    w_loads = tile.tile_s * tile.tile_r // load
    x_loads = tile.bucket * tile.tile_r // load * (1 if tile.stage else tile.tile_s)
    outputs = tile.bucket * tile.tile_s
    cross_warp = tile.tr > 32
    return {
        "LDG.128": tile.k_steps(k) * (w_loads + x_loads),  # every W and X load 16 bytes, masked X rows included
        "FFMA": tile.k_steps(k) * tile.bucket * tile.tile_s * tile.tile_r,
        "SHFL.DOWN": outputs * (5 + int(math.log2(tile.tr // 32))),  # 32 → 1 within the warp, then across warps
        "SHFL.IDX": 0 if cross_warp else outputs,  # lane 0's sum broadcast to the warp
        "LDS": 2 * outputs if cross_warp else 0,  # one word per warp to a staging array, the result back
        "STS": 2 * outputs if cross_warp else 0,
    }


def _check_kernel(tile: GemvTile, n: int, k: int, dtype: str, workdir: Path) -> dict[str, Any]:
    source = cuda_source(build_gemv(tile, n, k, cuda_target(ARCH), dtype))
    usage, ops = _shipped(source, workdir)
    found = {
        "LDG.128": sum(c for op, c in ops.items() if op.startswith("LDG.E.128")),
        "LDG.narrower": sum(c for op, c in ops.items() if op.startswith("LDG") and not op.startswith("LDG.E.128")),
        "FFMA": _family(ops, "FFMA"),
        "SHFL.DOWN": _family(ops, "SHFL.DOWN"),
        "SHFL.IDX": _family(ops, "SHFL.IDX"),
        "LDS": sum(c for op, c in ops.items() if op.startswith("LDS")),
        "STS": sum(c for op, c in ops.items() if op.startswith("STS")),
        "LDL/STL": _family(ops, "LDL") + _family(ops, "STL"),
        "LDGSTS": _family(ops, "LDGSTS"),
    }
    expected = _expected_sass(tile, k, dtype)
    assert {key: found[key] for key in expected} == expected, (tile.label(), found)
    assert found["LDG.narrower"] == 0 and found["LDGSTS"] == 0, (tile.label(), found)  # no cp.async: no smem copy
    assert found["LDL/STL"] == 0 and usage["STACK"] == 0 and usage["LOCAL"] == 0, (tile.label(), usage)
    # two blocks of 256 threads per SM: 65536 registers / (2 · 256) = 128 per thread at most
    assert usage["REG"] <= 128 and sm_spec("sm_90").resident_blocks(tile.threads, usage["REG"], 0) >= 2, usage
    verbose = _ptxas(source)
    assert verbose["stack"] == 0 and verbose["spill_stores"] == 0 and verbose["spill_loads"] == 0, verbose
    assert verbose["registers"] <= 128, verbose
    # shared memory: the cross-warp reduction's few words (64-byte aligned arrays), never W (one k-step of a
    # block's W alone is rows·tr·tile_r elements, 2 KB and up)
    assert set(re.findall(r"__shared__[^;]*?(\w+)\[\d+\];", source)) <= {"red_buf_staging_ptr", "red_result_ptr"}
    assert verbose["smem"] <= 128 < tile.rows_per_block * tile.tr * tile.tile_r * 2, verbose
    if tile.tr == 32:
        assert verbose["smem"] == 0 and usage["SHARED"] == 0
    return {"usage": usage, "ptxas": verbose, "sass": found}


@needs_cuobjdump
@pytest.mark.parametrize(("layer", "label"), _fp32_candidates())
def test_fp32_kernels_stream_w_into_registers(layer: str, label: str, tmp_path: Path) -> None:
    n, k = LAYERS[layer]
    _check_kernel(GemvTile.from_label(label), n, k, "float32", tmp_path)


_HALF_HEADERS = {"float16": ("cuda_fp16.h", "half* h) { h[0] = __float2half(1.f); }"),
                 "bfloat16": ("cuda_bf16.h", "nv_bfloat16* h) { h[0] = __float2bfloat16(1.f); }")}  # fmt: skip


def _half_headers_reason(dtype: str = "float16") -> str | None:
    """Why nvcc cannot compile TVM's fp16 / bf16 CUDA here (cuda_fp16.h and cuda_bf16.h include CCCL's
    <nv/target>, which the pinned wheels lack without nvidia-cuda-cccl), or None."""
    path = nvcc_path()
    if path is None or tool_path("cuobjdump") is None:
        return "no nvcc or cuobjdump"
    import tempfile

    header, kernel = _HALF_HEADERS[dtype]
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.cu"
        probe.write_text(f"#include <{header}>\n__global__ void k({kernel}\n")
        done = subprocess.run(
            [str(path), "-cubin", f"-arch={ARCH}", "-o", str(Path(tmp) / "p.cubin"), str(probe)],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode:
        return f"nvcc cannot compile {header} here (<nv/target> missing: pip install 'nvidia-cuda-cccl==13.0.*')"
    return None


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_half_precision_kernels_stream_w_into_registers(layer: str, dtype: str, tmp_path: Path) -> None:
    """fp16 and bf16 (2-byte elements, fp32 accumulate): the staged candidates load W and X 16 bytes at a time,
    with no stack, spills or local memory (`_check_kernel`), for sm_90a."""
    reason = _half_headers_reason(dtype)
    if reason:
        pytest.skip(reason)
    n, k = LAYERS[layer]
    for tile in gemv_candidates(n, k, dtype):
        if tile.stage:  # dlight's own (unstaged) tile loads W 8 bytes at a time in 2-byte types, as dlight does
            _check_kernel(tile, n, k, dtype, tmp_path)


@needs_nvcc
@pytest.mark.parametrize(("dtype", "ctype"), [("float16", "half"), ("bfloat16", "nv_bfloat16")])
def test_half_precision_codegen_builds(dtype: str, ctype: str) -> None:
    """fp16 / bf16 in, fp32 accumulate and out: the CUDA source generates (compiling it needs cuda_fp16.h /
    cuda_bf16.h, above)."""
    n, k = LAYERS["qkv"]
    source = cuda_source(build_gemv(default_gemv(n, k, dtype), n, k, cuda_target(ARCH), dtype))
    signature = source.split("main_kernel(", 1)[1].split(")", 1)[0]
    assert f"{ctype}* __restrict__ W_ptr" in signature and "float* __restrict__ Y_ptr" in signature
    assert "uint4" in source  # 16-byte vectors of 8 two-byte elements


@pytest.mark.parametrize(("dtype", "ctype"), [("float16", "half"), ("bfloat16", "nv_bfloat16")])
def test_the_ukernel_path_rounds_y_to_the_inputs_dtype_in_the_store(dtype: str, ctype: str) -> None:
    """What a half-precision ukernel job builds (gpu_kernels.build_module): dlight folds the rounding block into
    the un-padding store, so Y is in the inputs' dtype (as F.linear's is) with no pass of its own, and the kernel
    keeps no stack, spills or local memory."""
    from service.tuning.tuners.ukernel.gpu_kernels import build_module

    reason = _half_headers_reason(dtype)
    if reason:
        pytest.skip(reason)
    n, k = LAYERS["qkv"]
    source = cuda_source(build_module(default_gemv(n, k, dtype), n, k, cuda_target(ARCH), dtype))
    signature = source.split("main_kernel(", 1)[1].split(")", 1)[0]
    assert f"{ctype}* __restrict__ Y_out_ptr" in signature and "float*" not in signature
    verbose = _ptxas(source)
    assert verbose["stack"] == 0 and verbose["spill_stores"] == 0 and verbose["spill_loads"] == 0, verbose


# --- the numbers, on the CPU -------------------------------------------------------------------------------------

_SHIM = r"""
#include <ucontext.h>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
struct kf_dim3 { unsigned x = 0, y = 0, z = 0; };
static kf_dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define uint unsigned int
#define uchar unsigned char
#define ushort unsigned short
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct int2 { int x, y; };
struct int4 { int x, y, z, w; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline int2 make_int2(int a, int b) { return {a, b}; }
inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
static ucontext_t kf_main;
static std::vector<ucontext_t> kf_ctx;
static std::vector<kf_dim3> kf_tidx;
static std::vector<uint64_t> kf_lanes;
static std::vector<int> kf_done;
static unsigned kf_current = 0;
static inline void kf_yield() {
  unsigned me = kf_current;
  swapcontext(&kf_ctx[me], &kf_main);
  threadIdx = kf_tidx[me];
}
static inline unsigned kf_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline void __syncthreads() { kf_yield(); }
inline unsigned __activemask() { return 0xffffffffu; }
template <class T> static T kf_exchange(T v, int src_lane) {
  static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
  unsigned tid = kf_tid(), warp = tid / 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  kf_lanes[tid] = bits;
  kf_yield();  // every lane has written
  T out = v;
  if (src_lane >= 0) std::memcpy(&out, &kf_lanes[warp * 32 + unsigned(src_lane)], sizeof(T));
  kf_yield();  // every lane has read
  return out;
}
template <class T> T __shfl_down_sync(unsigned, T v, int delta, int width = 32) {
  int lane = int(kf_tid() % 32);
  return kf_exchange(v, (lane % width) + delta < width ? lane + delta : -1);
}
template <class T> T __shfl_sync(unsigned, T v, int src, int width = 32) {
  int lane = int(kf_tid() % 32);
  return kf_exchange(v, (lane / width) * width + (src % width));
}
"""

_MAIN = r"""
static std::vector<std::vector<float>> kf_bufs;
static std::vector<int> kf_ints;
static void kf_entry(unsigned t) {
  kf_current = t;
  threadIdx = kf_tidx[t];
  KERNEL_CALL;
  kf_done[t] = 1;
}
int main(int argc, char** argv) {
  // gridDim.x gridDim.y blockDim.x blockDim.y, the int parameters, per pointer parameter (signature order) a file
  // of fp32 and its element count, and last the file the OUT pointer's buffer is written to
  unsigned gx = atoi(argv[1]), gy = atoi(argv[2]), tx = atoi(argv[3]), ty = atoi(argv[4]);
  int a = 5;
  for (int i = 0; i < NINTS; ++i) kf_ints.push_back(atoi(argv[a++]));
  for (int i = 0; i < NPTRS; ++i) {
    const char* path = argv[a++];
    size_t n = strtoull(argv[a++], nullptr, 10);
    std::vector<float> b(n, 0.0f);
    FILE* f = fopen(path, "rb");
    if (!f || fread(b.data(), 4, n, f) != n) return 2;
    fclose(f);
    kf_bufs.push_back(std::move(b));
  }
  blockDim = {tx, ty, 1};
  gridDim = {gx, gy, 1};
  unsigned threads = tx * ty;
  kf_ctx.resize(threads);
  kf_tidx.resize(threads);
  kf_lanes.assign(threads, 0);
  kf_done.assign(threads, 0);
  std::vector<std::vector<char>> stacks(threads, std::vector<char>(1 << 16));
  for (unsigned t = 0; t < threads; ++t) kf_tidx[t] = {t % tx, t / tx, 0};
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
      blockIdx = {bx, by, 0};
      for (unsigned t = 0; t < threads; ++t) {
        kf_done[t] = 0;
        getcontext(&kf_ctx[t]);
        kf_ctx[t].uc_stack.ss_sp = stacks[t].data();
        kf_ctx[t].uc_stack.ss_size = stacks[t].size();
        kf_ctx[t].uc_link = &kf_main;
        makecontext(&kf_ctx[t], (void (*)())kf_entry, 1, t);
      }
      for (unsigned alive = threads; alive;) {
        alive = 0;
        for (unsigned t = 0; t < threads; ++t) {
          if (kf_done[t]) continue;
          kf_current = t;
          threadIdx = kf_tidx[t];
          swapcontext(&kf_main, &kf_ctx[t]);
          alive += !kf_done[t];
        }
        if (alive && alive != threads) { fprintf(stderr, "threads of a block diverged at a barrier\n"); return 3; }
      }
    }
  FILE* f = fopen(argv[argc - 1], "wb");
  if (!f || fwrite(kf_bufs[OUT].data(), 4, kf_bufs[OUT].size(), f) != kf_bufs[OUT].size()) return 4;
  fclose(f);
  return 0;
}
"""

_SIGNATURE = re.compile(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\(([^)]*)\) \{')
_PARAM = re.compile(r"(float|int)(\*)?\s*(?:__restrict__\s+)?(\w+)")


class Emulated:
    """An fp32 CUDA kernel's source compiled for the CPU (see the module docstring); `run` launches it."""

    def __init__(self, source: str, workdir: Path) -> None:
        found = _SIGNATURE.search(source)
        assert found is not None, "no kernel signature"
        params = [_PARAM.fullmatch(p.strip()) for p in found.group(2).split(",")]
        assert all(params), found.group(2)
        self.pointers = [p.group(3).removesuffix("_ptr") for p in params if p and p.group(2)]
        call, pointers, ints = [], 0, 0
        for p in params:
            if p and p.group(2):
                call.append(f"kf_bufs[{pointers}].data()")
                pointers += 1
            else:
                call.append(f"kf_ints[{ints}]")
                ints += 1
        body = source[source.index('extern "C"') :]
        body = re.sub(r"__shared__\s+alignas\((\d+)\)", r"alignas(\1) static", body).replace("__shared__", "static")
        main = (
            _MAIN.replace("KERNEL_CALL", f"{found.group(1)}({', '.join(call)})")
            .replace("NINTS", str(ints))
            .replace("NPTRS", str(pointers))
            .replace("OUT", str(self.pointers.index("Y")))
        )
        self.workdir = workdir
        self.exe = workdir / "kernel"
        (workdir / "kernel.cpp").write_text(_SHIM + body + main)
        compiled = subprocess.run(
            [
                "g++",
                "-std=c++17",
                "-O1",
                "-fno-strict-aliasing",
                "-w",
                "-o",
                str(self.exe),
                str(workdir / "kernel.cpp"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert compiled.returncode == 0, compiled.stderr[-3000:]

    def run(self, arrays: dict[str, np.ndarray], ints: list[int], extents: dict[str, int]) -> np.ndarray:
        dims = [extents.get(name, 1) for name in ("blockIdx.x", "blockIdx.y", "threadIdx.x", "threadIdx.y")]
        argv = [str(self.exe), *map(str, dims), *map(str, ints)]
        for name in self.pointers:
            path = self.workdir / f"{name}.bin"
            np.ascontiguousarray(arrays[name], dtype=np.float32).tofile(path)
            argv += [str(path), str(arrays[name].size)]
        argv.append(str(self.workdir / "out.bin"))
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        return np.fromfile(self.workdir / "out.bin", dtype=np.float32).reshape(arrays["Y"].shape)


def _emulated_error(tile: GemvTile, n: int, k: int, rows: list[int], workdir: Path, source: str | None = None) -> float:
    """The largest error relative to max|Y| over the given M, of the emulated kernel against numpy in float64.
    Y starts as NaN, so an output the kernel never writes shows as NaN."""
    emulated = Emulated(source or cuda_source(build_gemv(tile, n, k, cuda_target(ARCH))), workdir)
    rng = np.random.default_rng(n + k)
    w = rng.standard_normal((n, k), dtype=np.float32)
    worst = 0.0
    for m in rows:
        x = rng.standard_normal((m, k), dtype=np.float32)
        ints, extents = _host_launch(tile, n, k, m)
        y = emulated.run({"X": x, "W": w, "Y": np.full((m, n), np.nan, dtype=np.float32)}, ints, extents)
        want = x.astype(np.float64) @ w.astype(np.float64).T
        error = float(np.max(np.abs(y - want)) / np.max(np.abs(want)))
        worst = error if math.isnan(error) else max(worst, error)
        if math.isnan(worst):
            break
    return worst


@needs_gxx
@pytest.mark.parametrize(("layer", "label"), _fp32_candidates())
def test_emulated_kernels_compute_x_wt_for_every_m(layer: str, label: str, tmp_path: Path) -> None:
    """Each fp32 candidate's kernel at its layer's K with N = two blocks' worth of rows (the same code as at the
    layer's N but for N's constants), at M = 1..5, 8, 13, 16 and past max_rows (17, 33)."""
    tile = GemvTile.from_label(label)
    _, k = LAYERS[layer]
    n = 2 * tile.rows_per_block
    assert _emulated_error(tile, n, k, [1, 2, 3, 4, 5, 8, 13, 16, 17, 33], tmp_path) < 1e-5


@needs_gxx
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_emulated_default_kernel_at_the_layers_shape(layer: str, tmp_path: Path) -> None:
    n, k = LAYERS[layer]
    assert _emulated_error(default_gemv(n, k), n, k, [1], tmp_path) < 1e-5


@needs_gxx
def test_the_emulator_catches_a_broken_reduction(tmp_path: Path) -> None:
    tile = default_gemv(*LAYERS["ffn_down"])  # 4 warps per output: shuffles, then the shared-memory exchange
    n, k = 2 * tile.rows_per_block, LAYERS["ffn_down"][1]
    source = cuda_source(build_gemv(tile, n, k, cuda_target(ARCH)))
    variants = {
        "as built": source,
        "shuffle offset 8 for 16": source.replace("red_buf0_ptr[0], 16, 32)", "red_buf0_ptr[0], 8, 32)", 1),
        "first __syncthreads dropped": source.replace("__syncthreads();", "", 1),
    }
    for i, (name, variant) in enumerate(variants.items()):
        workdir = tmp_path / str(i)
        workdir.mkdir()
        error = _emulated_error(tile, n, k, [3], workdir, variant)
        if name == "as built":
            assert error < 1e-5
        else:
            assert variant != source and not error < 1e-5, name  # wrong (or NaN: outputs never written)


# --- the static model (service.tuning.gpu_model) on the GEMV family ----------------------------------------------


def test_the_model_bounds_each_gemv_by_reading_w_once_and_sees_no_w_in_shared_memory() -> None:
    spec = sm_spec("sm_90a", 132)
    for layer, (n, k) in LAYERS.items():
        tile = default_gemv(n, k)
        access = analyze(schedule_gemv(tile, n, k).mod, cuda_target("sm_90a"), pass_config("sm_90a"))
        assert all(load.buffer != "W" for kernel in access.kernels for load in kernel.shared_loads)
        assert any(load.buffer == "W" and load.width_bytes == 16 for load in access.kernels[0].global_loads)
        floor = n * k * 4 / spec.dram_bytes_per_s
        previous = 0.0
        for m in (1, 2, 4, 8, 16):
            p = predict(access, m, spec)
            assert floor <= p.dram_s <= p.high_s < 12e-6, (layer, m, p.to_dict())
            assert p.high_s >= previous
            previous = p.high_s
        # dlight's own ffn_down choice: 24 blocks of 512 threads, the busiest SM streams 1/24 of W alone
        own = analyze(schedule_gemv(GemvTile.dlight(n, k), n, k).mod, cuda_target("sm_90a"), pass_config("sm_90a"))
        if layer == "ffn_down":
            assert own.kernels[0].grid(1) == 24 and predict(own, 1, spec).high_s > 4 * predict(access, 1, spec).high_s
