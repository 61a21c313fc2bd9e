"""A tensor-core dense uKernel with a symbolic M: Y[M,N] = X[M,K]·W[N,K]ᵀ, X and W float16 or bfloat16, fp32 out
(or `out_dtype`: the fp32 accumulators rounded in the final store; the ukernel path outputs the input dtype).

Issue 32 item 4. The schedule is TVM's own mma recipe (`tvm.testing.tir.mma_schedule`, the one its
`test_tir_schedule_tensorize_ldmatrix_mma_numeric.py` runs on sm_80) adapted to our calling convention and to a
symbolic M:

- `pad_einsum` pads M up to a multiple of the block tile bm inside the kernel (as `schedule_gemm` does); the
  X rows past M are zero-filled by predicated `cp.async` (`src-size 0`), so one binary serves every M.
- block tile bm×bn×bk, `(bm/wm)·(bn/wn)` warps (threadIdx.y), each warp owning a wm×wn tile of 16×16 fragments;
  X and W tiles go global → shared with 16-byte `cp.async` (LDGSTS), shared → registers with `ldmatrix.x4`
  (LDSM), and the math is `mma.sync.m16n8k16.row.col.f32.{f16,bf16}` (two per 16×16×16 fragment, HMMA).
- the shared tiles have a row pitch of bk + 8 elements (`storage_align(factor=32, offset=8)`, TVM's recipe):
  the 8 rows an `ldmatrix` 8×8 matrix reads then start in 8 different 16-byte bank groups — conflict-free.
- the k-loop over bk steps is an ALCOP-style software pipeline of `stages` stages (copies asynchronous, stage 0;
  math at stage `stages-1`); `build_tensorcore` sets `tirx.use_async_copy`.
- epilogue: the fp32 accumulators go through shared memory (StorageRewrite reuses the W tile's space for it)
  and are written to Y as `float4` rows guarded by `row < M` — coalesced, and nothing past M is written.
- split-K (`split_k > 1`, for weights whose N·M blocks leave most SMs idle: ffn_down's N = 768 gives 24 blocks
  at bn = 32 on 132 SMs): `rfactor` over blockIdx.z, as `schedule.py`'s SIMT split-K. Each z computes one K slice
  into fp32 partial sums Y_rf[split_k, M_pad, N] (the same epilogue, into its slice), and a second kernel adds
  the slices in order and writes Y (rows < M). Why not fp32 atomics into a zeroed Y: that needs a zeroing pass
  (a memset or a third kernel) anyway, and the sum order would change from call to call; this keeps it fixed.
  Y_rf is a module-internal global buffer: TVM's host code takes it from the CUDA device API's workspace pool
  (TVMBackendAllocWorkspace: per host thread, pages kept and reused), so cudaMalloc runs only the first time a
  size is needed, not per call, and a CUDA-graph replay reuses the captured address. The calling convention
  stays `main(X, W, Y)`.

TVM 0.27 registers the f16 intrinsics only. The tensor intrinsics are TVM's designs rebuilt here for a free dtype
(see "intrinsics" below): for float16 they equal TVM's registered ones; for bfloat16 they are the same with
`bfloat16` buffers and `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` (ldmatrix moves `.b16` either way).
TF32 for float32 inputs is not offered here: it changes numerics and must stay an explicit opt-in (not built).

API:

    tile = TensorCoreTile(bm=32, bn=64, bk=32, wm=16, wn=32, stages=3, split_k=1)
    tile.label() -> 'tc32x64x32_w16x32_s3' ('_sk4' when split_k = 4);  TensorCoreTile.from_label(label)
    tile.grid(n, m) -> (gridDim.x, .y, .z) of the mma kernel;  tile.k_steps(k)
    tensorcore_candidates(n, k, m, sm_count, dtype) -> list[TensorCoreTile]   what the GPU screen ranks
    tile.problem(n, k, dtype) -> str | None              why the tile cannot serve N, K (None = fine)
    tile.warps / tile.threads / tile.smem_bytes(dtype)
    schedule_tensorcore(tile, n, k, dtype="float16", m=None) -> s_tir.Schedule
    build_tensorcore(tile, n, k, target, dtype="float16", m=None) -> runtime.Module   main(X, W, Y)
    intrinsics(dtype) -> dict[str, str]                  the tensor intrinsics the schedule uses (registers them)

Nothing here needs a GPU (build, CUDA codegen, nvcc). Numerical correctness needs one: see
tests/tuning/gpu/test_tensorcore.py for what is checked statically.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from service.tuning.builder.cuda import cuda_target, pass_config, supports_async_copy
from service.tuning.cuda_toolchain import configure_cuda_compile
from service.tuning.tuners.pipeline.schedule import dense_module, inline_output_cast

__all__ = [
    "BLOCK_SHAPES",
    "DTYPES",
    "TensorCoreTile",
    "build_tensorcore",
    "cuda_target",
    "intrinsics",
    "register_intrinsics",
    "schedule_tensorcore",
    "tensorcore_candidates",
]

DTYPES = ("float16", "bfloat16")
MMA_M = MMA_N = MMA_K = 16  # one fragment: 16×16 output, k-step 16 (two m16n8k16 instructions)
WARP = 32
COPY_BYTES = 16  # one cp.async / one float4
SMEM_PAD = 8  # elements added to every shared row (storage_align factor 32, offset 8)
MAX_STATIC_SMEM = 48 * 1024
SUM_THREADS = 256  # split-K's slice-sum kernel: threads per block, one output each

# the intrinsics this module registers, per role (see "intrinsics" below); {t} = f16 | bf16
_NAMES = {
    "load_a": "kernelfleet_mma_ldmatrix_{t}_a",
    "load_b": "kernelfleet_mma_ldmatrix_{t}_b_trans",
    "compute": "kernelfleet_mma_{t}{t}f32_trans_b",
    "init": "kernelfleet_mma_fill_16x16_f32",
    "store": "kernelfleet_mma_store_16x16_f32_shared",
}
_PTX_TYPE = {"float16": "fp16", "bfloat16": "bf16"}
_SHORT = {"float16": "f16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class TensorCoreTile:
    """Block tile bm×bn, k-step bk, warp tile wm×wn (multiples of 16), pipeline depth."""

    bm: int = 32
    bn: int = 64
    bk: int = 32
    wm: int = 16
    wn: int = 32
    stages: int = 3
    split_k: int = 1  # K split over blockIdx.z: fp32 partial sums, then a second kernel adds them

    @property
    def warps(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn)

    @property
    def threads(self) -> int:
        return self.warps * WARP

    @property
    def row_pitch(self) -> int:
        """Elements between two rows of a shared X/W tile (conflict-free for ldmatrix)."""
        return self.bk + SMEM_PAD

    def smem_bytes(self, dtype: str = "float16") -> int:
        """Shared memory per block: `stages` X and W tiles; the fp32 epilogue tile reuses the W tiles when it
        fits there (StorageRewrite), else it adds bm·bn·4."""
        elem = 2 if dtype in DTYPES else 4
        x_tiles = max(self.stages, 1) * self.bm * self.row_pitch * elem
        w_tiles = max(self.stages, 1) * self.bn * self.row_pitch * elem
        epilogue = self.bm * self.bn * 4
        reused = epilogue <= w_tiles or epilogue <= x_tiles
        return x_tiles + w_tiles + (0 if reused else epilogue)

    def fragments_per_warp(self) -> int:
        """16×16 accumulator fragments per warp (8 fp32 registers per thread each)."""
        return (self.wm // MMA_M) * (self.wn // MMA_N)

    def problem(self, n: int, k: int, dtype: str = "float16") -> str | None:
        """Why this tile cannot serve an N×K weight of `dtype`, or None."""
        if dtype not in DTYPES:
            return f"dtype must be one of {DTYPES}, not {dtype!r}"
        if min(self.bm, self.bn, self.bk, self.wm, self.wn, self.stages, self.split_k) < 1:
            return "tile sizes, stages and split_k must be positive"
        if self.wm % MMA_M or self.wn % MMA_N or self.bk % MMA_K:
            return f"warp tile {self.wm}x{self.wn} and bk={self.bk} must be multiples of 16"
        if self.bm % self.wm or self.bn % self.wn:
            return f"warp tile {self.wm}x{self.wn} must divide block tile {self.bm}x{self.bn}"
        if not 1 <= self.threads <= 1024:
            return f"{self.threads} threads per block (1..1024 allowed)"
        per_copy = COPY_BYTES // 2  # 8 half-precision elements per cp.async
        for rows, name in ((self.bm, "X"), (self.bn, "W")):
            if (rows * self.bk) % (self.threads * per_copy):
                return f"the {rows}x{self.bk} {name} tile is not a whole number of 16-byte copies per thread"
        if (self.bm * self.bn) % (self.threads * 4):
            return f"the {self.bm}x{self.bn} fp32 epilogue is not a whole number of float4 stores per thread"
        if n % self.bn:
            return f"bn={self.bn} must divide N={n}"
        if k % (self.bk * self.split_k):
            return f"bk·split_k={self.bk * self.split_k} must divide K={k}"
        steps = self.k_steps(k)
        if self.stages > 1 and steps < self.stages:
            return f"{self.stages} stages need at least as many k-steps (K/(bk·split_k) = {steps})"
        if self.smem_bytes(dtype) > MAX_STATIC_SMEM:
            return f"{self.smem_bytes(dtype)} B of static shared memory (48 KiB allowed)"
        return None

    def k_steps(self, k: int) -> int:
        """Iterations of one block's pipelined k-loop: its slice of K (K / split_k) in bk steps."""
        return k // (self.bk * self.split_k)

    def grid(self, n: int, m: int) -> tuple[int, int, int]:
        """(gridDim.x, gridDim.y, gridDim.z) of the mma kernel at M = m: N blocks, M blocks, K slices."""
        return n // self.bn, -(-m // self.bm), self.split_k

    def label(self) -> str:
        """e.g. 'tc32x64x32_w16x32_s3', with '_sk<n>' when K is split."""
        sk = f"_sk{self.split_k}" if self.split_k > 1 else ""
        return f"tc{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}_s{self.stages}{sk}"

    @classmethod
    def from_label(cls, label: str) -> TensorCoreTile:
        """The tile a `label()` names, e.g. 'tc32x64x32_w16x32_s3' or 'tc16x32x64_w16x16_s3_sk4'."""
        found = _LABEL.fullmatch(label)
        if found is None:
            raise ValueError(f"not a tensor-core tile label: {label!r}")
        bm, bn, bk, wm, wn, stages, split_k = found.groups()
        return cls(int(bm), int(bn), int(bk), int(wm), int(wn), int(stages), int(split_k or 1))


_LABEL = re.compile(r"tc(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)_s(\d+)(?:_sk(\d+))?")


# the block shapes worth proposing (bench/gpu_ukernels.py measured the first eight on the H200): narrow blocks for
# small T (more blocks over N), wider ones for T = 64..128; each with the K splits `tensorcore_candidates` adds
BLOCK_SHAPES = (
    TensorCoreTile(32, 64, 32, 16, 32, 3),
    TensorCoreTile(64, 64, 32, 32, 32, 4),
    TensorCoreTile(16, 64, 64, 16, 16, 2),
    TensorCoreTile(16, 32, 64, 16, 16, 3),
    TensorCoreTile(16, 64, 32, 16, 32, 4),
    TensorCoreTile(32, 32, 64, 16, 16, 3),
    TensorCoreTile(64, 128, 32, 32, 64, 3),
    TensorCoreTile(128, 64, 32, 64, 32, 3),
)
SPLITS = (2, 4, 8)


def tensorcore_candidates(n: int, k: int, m: int, sm_count: int, dtype: str = "float16") -> list[TensorCoreTile]:
    """The tiles to rank for an N×K weight at M = m: every block shape that serves N, K, and for each the K splits
    that still leave SMs idle without them: split s is added while the blocks of split s/2 number fewer than the
    SMs (ffn_down, N = 768, at bn = 32: 24 blocks per row block, so 2, 4 and 8 on 132 SMs)."""
    found: list[TensorCoreTile] = []
    for shape in BLOCK_SHAPES:
        if shape.problem(n, k, dtype) is not None:
            continue
        found.append(shape)
        gx, gy, _ = shape.grid(n, max(m, 1))
        for split in SPLITS:
            if gx * gy * split // 2 >= sm_count:
                break
            tile = replace(shape, split_k=split)
            if tile.problem(n, k, dtype) is None:
                found.append(tile)
    return found


# ---------------------------------------------------------------- intrinsics
#
# TVM's designs (`tvm/s_tir/tensor_intrin/cuda.py`: get_ldmatrix_intrin, get_mma_intrin, get_mma_fill_intrin,
# get_mma_store_intrin) rebuilt here for a free dtype and registered under kernelfleet_* names: importing TVM's
# module registers every target's intrinsics (`tvm.s_tir.tensor_intrin` pulls in arm/x86/rocm/hexagon/riscv too),
# 15-40 s per process, while these five per dtype parse in well under a second. For float16 they are the same
# functions as TVM's registered `mma_ldmatrix_f16_a`, `mma_ldmatrix_f16_b_trans`, `mma_f16f16f32_trans_b`,
# `mma_fill_16x16_f32` and `mma_store_16x16_f32_shared_dyn_simple_` (shared scope); the test checks that.


def shared_16x16_to_ldmatrix_32x8_layout(i: Any, j: Any) -> tuple[Any, Any]:
    """(lane, register slot) of element (i, j) of a 16×16 fragment in the mma.m16n8k16 layout (TVM's map)."""
    thread_id = 4 * (i % 8) + (j % 8) // 2
    return thread_id, 4 * (j // 8) + (i // 8) * 2 + (j % 2)


def ldmatrix_32x8_to_shared_16x16_layout(thread_id: Any, local_id: Any) -> tuple[Any, Any]:
    """The inverse map: (row, column) of a lane's register slot."""
    row = 8 * (local_id % 4 // 2) + (thread_id // 4)
    col = 8 * (local_id // 4) + (thread_id % 4) * 2 + (local_id % 2)
    return row, col


def _ldmatrix_intrin(dtype: str, matrix: str) -> tuple[Any, Any]:
    """ldmatrix.x4 of a 16×16 shared tile into the mma fragment layout: A (X, row-major M×K) or B transposed
    (W, N×K). TVM's `get_ldmatrix_intrin(16, "float16", ...)` with the dtype left free (it asserts float16)."""
    from tvm.runtime import convert
    from tvm.script import tirx as T

    index_map = shared_16x16_to_ldmatrix_32x8_layout
    local_size = MMA_M * MMA_K // WARP  # 8 elements per thread
    half_warp = convert(WARP // 2)
    # A: rows 0..15 by lanes 0..15, columns 8..15 by lanes 16..31; B transposed: the same read, no .trans
    # (TVM: transpose_in_ldmatrix = not transposed for B) with lanes ordered for the B fragment
    if matrix == "A":

        def smem_offset(tx: Any, stride: Any) -> Any:
            return stride * (tx % half_warp) + 8 * (tx // half_warp)
    else:

        def smem_offset(tx: Any, stride: Any) -> Any:
            return stride * 8 * (tx // half_warp) + stride * (tx % 8) + 8 * ((tx % half_warp) // 8)

    @T.prim_func(s_tir=True)  # type: ignore[untyped-decorator]
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (16, 16), dtype, align=64, offset_factor=16, scope="shared")
        warp = T.match_buffer(warp_handle, (WARP, local_size), dtype, align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:16])
            T.writes(warp[0:WARP, 0:local_size])
            for ax0, ax1 in T.grid(16, 16):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(shared[v0, v1])
                    thread_id, local_id = T.meta_var(index_map(v0, v1))
                    T.writes(warp[thread_id, local_id])
                    warp[thread_id, local_id] = shared[v0, v1]

    @T.prim_func(s_tir=True)  # type: ignore[untyped-decorator]
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(
            shared_handle, (16, 16), dtype, align=64, offset_factor=16, scope="shared", strides=[s0, s1]
        )
        warp = T.match_buffer(warp_handle, (WARP, local_size), dtype, align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:16])
            T.writes(warp[0:WARP, 0:local_size])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(
                    T.ptx_legacy.ldmatrix(
                        False,
                        4,
                        ".b16",
                        warp.data,
                        warp.elem_offset + convert(local_size) * tx,
                        shared.access_ptr("r"),
                        smem_offset(tx, s0),
                        dtype=dtype,
                    )
                )

    return desc, impl


def _mma_trans_b_intrin(dtype: str, abbrv: str) -> tuple[Any, Any]:
    """C[16,16] (fp32) += A[16,16]·B[16,16]ᵀ as two mma.sync.m16n8k16.row.col; TVM's `get_mma_intrin(16, ...,
    b_transposed=True)` with `abbrv` ("bf16") as the PTX operand type."""
    from tvm.runtime import convert
    from tvm.script import tirx as T
    from tvm.tirx import Cast

    index_map = shared_16x16_to_ldmatrix_32x8_layout
    local = MMA_M * MMA_K // WARP
    local_out = MMA_M * MMA_N // WARP

    @T.prim_func(s_tir=True)  # type: ignore[untyped-decorator]
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, local), dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (WARP, local), dtype, align=64, offset_factor=16, scope="warp")
        C = T.match_buffer(c, (WARP, local_out), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:local_out], A[0:WARP, 0:local], B[0:WARP, 0:local])
            T.writes(C[0:WARP, 0:local_out])
            for i, j, k in T.grid(16, 16, 16):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    tc, lc = T.meta_var(index_map(vi, vj))
                    ta, la = T.meta_var(index_map(vi, vk))
                    tb, lb = T.meta_var(index_map(vj, vk))
                    T.reads(C[tc, lc], A[ta, la], B[tb, lb])
                    T.writes(C[tc, lc])
                    C[tc, lc] += Cast("float32", A[ta, la]) * Cast("float32", B[tb, lb])

    @T.prim_func(s_tir=True)  # type: ignore[untyped-decorator]
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, local), dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (WARP, local), dtype, align=64, offset_factor=16, scope="warp")
        C = T.match_buffer(c, (WARP, local_out), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:local_out], A[0:WARP, 0:local], B[0:WARP, 0:local])
            T.writes(C[0:WARP, 0:local_out])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(
                    T.ptx_legacy.mma(
                        "m16n8k16",
                        "row",
                        "col",
                        abbrv,
                        abbrv,
                        "fp32",
                        A.data,
                        A.elem_offset + tx * convert(local),
                        B.data,
                        B.elem_offset + tx * convert(local),
                        C.data,
                        C.elem_offset + tx * convert(local_out),
                        False,
                        dtype="float32",
                    )
                )
                T.evaluate(
                    T.ptx_legacy.mma(
                        "m16n8k16",
                        "row",
                        "col",
                        abbrv,
                        abbrv,
                        "fp32",
                        A.data,
                        A.elem_offset + tx * convert(local),
                        B.data,
                        B.elem_offset + tx * convert(local) + convert(local) // 2,
                        C.data,
                        C.elem_offset + tx * convert(local_out) + convert(local_out) // 2,
                        False,
                        dtype="float32",
                    )
                )

    return desc, impl


def _fill_intrin() -> tuple[Any, Any]:
    """Zero a 16×16 fp32 accumulator fragment (TVM's get_mma_fill_intrin("float32", 8))."""
    from tvm.script import tirx as T
    from tvm.tirx import IntImm

    local_size = 8
    zero = IntImm("int32", 0).astype("float32")
    index_map = shared_16x16_to_ldmatrix_32x8_layout

    @T.prim_func(s_tir=True)  # type: ignore[untyped-decorator]
    def desc(a: T.handle) -> None:
        C_warp = T.match_buffer(a, [WARP, local_size], dtype="float32", scope="warp")
        with T.sblock("root"):
            T.reads()
            T.writes(C_warp[0:WARP, 0:local_size])
            for i0, i1 in T.grid(16, 16):
                with T.sblock("C_warp"):
                    i, j = T.axis.remap("SS", [i0, i1])
                    thread_id, local_id = T.meta_var(index_map(i, j))
                    T.reads()
                    T.writes(C_warp[thread_id, local_id])
                    C_warp[thread_id, local_id] = zero

    @T.prim_func(s_tir=True)  # type: ignore[untyped-decorator]
    def impl(a: T.handle) -> None:
        C_warp = T.match_buffer(a, [WARP, local_size], dtype="float32", scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C_warp[0:WARP, 0:local_size])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):  # noqa: B007 (TVM's loop, same printed TIR)
                T.evaluate(T.cuda.mma_fill_legacy(local_size, C_warp.data, C_warp.elem_offset, dtype="float32"))

    return desc, impl


def _store_intrin() -> tuple[Any, Any]:
    """A 16×16 fp32 fragment → a shared tile, element by element (TVM's get_mma_store_intrin("float32", 8,
    scope, use_mma_store_intrinic=False)). The `mma_store` variant takes an access_ptr typed float32, which
    fails to lower ("tvm_access_ptr element type must match") once StorageRewrite places the epilogue tile in
    the float16 W tile's space."""
    from tvm.script import tirx as T

    local_size = 8
    index_map = shared_16x16_to_ldmatrix_32x8_layout
    index_map_rev = ldmatrix_32x8_to_shared_16x16_layout

    @T.prim_func(s_tir=True)  # type: ignore[untyped-decorator]
    def desc(a: T.handle, c: T.handle) -> None:
        C_warp = T.match_buffer(a, [WARP, local_size], dtype="float32", scope="warp")
        C = T.match_buffer(c, [16, 16], dtype="float32", scope="shared")
        with T.sblock("root"):
            T.reads(C_warp[0:WARP, 0:local_size])
            T.writes(C[0:16, 0:16])
            for i0, i1 in T.grid(16, 16):
                with T.sblock("C_warp"):
                    v0, v1 = T.axis.remap("SS", [i0, i1])
                    thread_id, local_id = T.meta_var(index_map(v0, v1))
                    T.reads(C_warp[thread_id, local_id])
                    T.writes(C[v0, v1])
                    C[v0, v1] = C_warp[thread_id, local_id]

    @T.prim_func(s_tir=True)  # type: ignore[untyped-decorator]
    def impl(a: T.handle, c: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        C_warp = T.match_buffer(a, [WARP, local_size], dtype="float32", scope="warp", offset_factor=1)
        C = T.match_buffer(c, [16, 16], dtype="float32", scope="shared", offset_factor=1, strides=[s0, s1])
        with T.sblock("root"):
            T.reads(C_warp[0:WARP, 0:local_size])
            T.writes(C[0:16, 0:16])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for local_id in T.serial(local_size):
                    row, col = T.meta_var(index_map_rev(tx, local_id))
                    C[row, col] = C_warp[tx, local_id]

    return desc, impl


_REGISTERED: set[str] = set()


def register_intrinsics(dtype: str) -> None:
    """Register the five intrinsics for X, W of `dtype` (idempotent within a process)."""
    if dtype in _REGISTERED:
        return
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    from tvm.s_tir import TensorIntrin

    names = {role: name.format(t=_SHORT[dtype]) for role, name in _NAMES.items()}
    TensorIntrin.register(names["load_a"], *_ldmatrix_intrin(dtype, "A"), override=True)
    TensorIntrin.register(names["load_b"], *_ldmatrix_intrin(dtype, "B"), override=True)
    TensorIntrin.register(names["compute"], *_mma_trans_b_intrin(dtype, _PTX_TYPE[dtype]), override=True)
    if not _REGISTERED:
        TensorIntrin.register(names["init"], *_fill_intrin(), override=True)
        TensorIntrin.register(names["store"], *_store_intrin(), override=True)
    _REGISTERED.add(dtype)


def intrinsics(dtype: str) -> dict[str, str]:
    """The registered tensor intrinsics (load_a, load_b, compute, init, store) for X, W of `dtype`."""
    register_intrinsics(dtype)
    return {role: name.format(t=_SHORT[dtype]) for role, name in _NAMES.items()}


# ---------------------------------------------------------------- schedule


def _fragment_layout(i: Any, j: Any) -> Any:
    return (i // 16, j // 16, *shared_16x16_to_ldmatrix_32x8_layout(i % 16, j % 16))


def _sliced_fragment_layout(z: Any, i: Any, j: Any) -> Any:
    """The same for split-K's [split_k, M, N] partial sums: the K slice stays the outermost axis."""
    return (z, *_fragment_layout(i, j))


def schedule_tensorcore(
    tile: TensorCoreTile,
    n: int,
    k: int,
    dtype: str = "float16",
    m: int | None = None,
    out_dtype: str = "float32",
) -> Any:
    """The scheduled, tensorized module (module docstring); ValueError when the tile cannot serve N, K."""
    problem = tile.problem(n, k, dtype)
    if problem:
        raise ValueError(problem)
    from tvm import s_tir

    intrin = intrinsics(dtype)
    sch = s_tir.Schedule(dense_module(n, k, m, dtype, out_dtype))
    blk = sch.get_sblock("Y")
    sch.pad_einsum(blk, [tile.bm, 1, 1])  # Y_pad[ceil(M/bm)·bm, N]; X rows past M read as 0
    inline_output_cast(sch)  # out_dtype ≠ fp32: the un-padding store rounds the accumulators
    producers = sch.get_producers(blk)
    xpad = producers[0] if producers else None
    consumers = sch.get_consumers(blk)
    ycopy = consumers[0] if consumers else None
    mma, summed = blk, None
    if tile.split_k > 1:
        # rfactor the outer K split into Y_rf[split_k, M_pad, N] (the mma kernel, K slice on blockIdx.z); `blk`
        # then adds the slices (a second kernel). Y_rf is staged in shared memory like Y_pad, for coalesced
        # float4 stores of the partial sums.
        i, j, kk = sch.get_loops(blk)
        ks, _ = sch.split(kk, [tile.split_k, None])
        mma, summed = sch.rfactor(ks, 0), blk
        ycopy = sch.cache_write(mma, 0, "shared")

    if summed is None:
        i, j, kk = sch.get_loops(mma)
        kz = None
    else:
        i, j, kz, kk = sch.get_loops(mma)  # rfactor keeps the loop order: the K slice sits above its k-loop
    bi, iw, i_frag, i_tc = sch.split(i, [None, tile.bm // tile.wm, tile.wm // MMA_M, MMA_M])
    bj, jw, j_frag, j_tc = sch.split(j, [None, tile.bn // tile.wn, tile.wn // MMA_N, MMA_N])
    k0, k1, k_tc = sch.split(kk, [None, tile.bk // MMA_K, MMA_K])
    order = [bj, bi, iw, jw, k0, k1, i_frag, j_frag, i_tc, j_tc, k_tc]
    sch.reorder(*([kz, *order] if kz is not None else order))
    outer = sch.blockize(i_tc)  # one 16×16×16 fragment product per block instance
    if kz is not None:
        sch.bind(kz, "blockIdx.z")  # one K slice per z
    sch.bind(bj, "blockIdx.x")  # consecutive blocks share X rows, stream different W rows
    sch.bind(bi, "blockIdx.y")
    warp = sch.fuse(iw, jw)
    sch.bind(warp, "threadIdx.y")

    per_copy = COPY_BYTES // 2
    for idx in (0, 1):
        shared = sch.cache_read(outer, idx, "shared")
        sch.compute_at(shared, k0)
        fused = sch.fuse(*sch.get_loops(shared)[-2:])
        _, ty, tx, vec = sch.split(fused, [None, tile.warps, WARP, per_copy])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)
        sch.storage_align(shared, 0, axis=-2, factor=32, offset=SMEM_PAD)
    if xpad is not None:
        sch.compute_inline(xpad)  # the padding becomes a predicate on the X copy (zero-filling cp.async)

    a_frag = sch.cache_read(outer, 0, "warp")
    b_frag = sch.cache_read(outer, 1, "warp")
    sch.compute_at(a_frag, k1)
    sch.compute_at(b_frag, k1)
    acc = sch.cache_write(outer, 0, "warp")
    sch.reverse_compute_at(acc, warp)
    ai, aj = sch.get_loops(acc)[-2:]
    aio, aii = sch.split(ai, [None, MMA_M])
    ajo, aji = sch.split(aj, [None, MMA_N])
    sch.reorder(aio, ajo, aii, aji)

    # epilogue: accumulators → shared Y tile → Y rows < M (split-K: the Y_rf slice), float4 per thread
    sch.set_scope(acc, 0, "shared")
    if ycopy is not None:
        sch.reverse_compute_at(ycopy, bi)
        fused = sch.fuse(*sch.get_loops(ycopy)[-2:])
        _, ty, tx, vec = sch.split(fused, [None, tile.warps, WARP, 4])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)

    sch.decompose_reduction(outer, k0)
    init = sch.get_sblock(f"{sch.get(mma).name_hint}_init")

    def fragment_loop(block: Any) -> Any:
        r, c = sch.get_loops(block)[-2:]
        r0, r1 = sch.split(r, [None, 16])
        c0, c1 = sch.split(c, [None, 16])
        sch.reorder(r0, c0, r1, c1)
        return r1

    load_a, load_b = fragment_loop(a_frag), fragment_loop(b_frag)
    sch.transform_layout(a_frag, ("write", 0), _fragment_layout)
    sch.transform_layout(b_frag, ("write", 0), _fragment_layout)
    sch.transform_layout(acc, ("read", 0), _fragment_layout if summed is None else _sliced_fragment_layout)
    sch.tensorize(load_a, intrin["load_a"])
    sch.tensorize(load_b, intrin["load_b"])
    sch.tensorize(sch.get_loops(mma)[-3], intrin["compute"])
    sch.tensorize(sch.get_loops(init)[-2], intrin["init"])
    sch.tensorize(sch.get_loops(acc)[-2], intrin["store"])

    if tile.stages > 1:  # [copy X, copy W, fragment loads + mma]: copies run stages-1 k-steps ahead
        sch.annotate(k0, "software_pipeline_stage", [0, 0, tile.stages - 1])
        sch.annotate(k0, "software_pipeline_order", [0, 1, 2])
        sch.annotate(k0, "software_pipeline_async_stages", [0])
    if summed is not None:
        _schedule_slice_sum(sch, summed)
    return sch


def _schedule_slice_sum(sch: Any, summed: Any) -> None:
    """Split-K's second kernel: each thread adds the split_k fp32 partial sums of one output (reading them in
    order: deterministic, unlike atomics) and writes it unpadded (rows < M), 256 threads per block."""
    consumers = sch.get_consumers(summed)
    i, j, _ = sch.get_loops(summed)
    bx, tx = sch.split(sch.fuse(i, j), [None, SUM_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if consumers:
        sch.reverse_compute_at(consumers[0], tx)
        sch.set_scope(summed, 0, "local")  # the sum lives in a register until the unpadded write


def build_tensorcore(
    tile: TensorCoreTile,
    n: int,
    k: int,
    target: Mapping[str, object],
    dtype: str = "float16",
    m: int | None = None,
    out_dtype: str = "float32",
) -> Any:
    """`tirx.build` under the async-copy PassContext; main(X, W, Y) like `build_gemm`. Needs sm_80+."""
    import tvm

    arch = str(target.get("arch", ""))
    if not supports_async_copy(arch):  # mma.m16n8k16 with bf16, ldmatrix and cp.async are all sm_80+
        raise ValueError(f"the tensor-core uKernel needs sm_80 or newer, not {arch!r}")
    sch = schedule_tensorcore(tile, n, k, dtype, m, out_dtype)
    tgt = tvm.target.Target(dict(target))
    configure_cuda_compile()
    with tgt, tvm.transform.PassContext(config=pass_config(arch)):
        return tvm.tirx.build(sch.mod, target=tgt)
