"""A GEMV-family uKernel for small M (T <= 16 rows): Y[M,N] = X[M,K]·W[N,K]ᵀ over a symbolic M, one launch.

Issue 32 item 3 / gpu-first-light.md §4.4, §5: at T = 1..16 the GEMM-tile uKernels re-read every W element
from shared memory 8-16 times and take 25-45 µs on an H100, where reading W once takes 2.4-3.1 µs. This is
the kernel TVM 0.27's `dlight.gpu.LowBatchGEMV` emits for a dense with a symbolic M, with its parameters
exposed: each thread streams `tile_s` rows of W with 16-byte loads (`LDG.E.128`) straight into registers,
multiplies them by `bucket` rows of X, and the `tr` threads sharing an output reduce their partial sums with
warp shuffles (plus a shared-memory exchange of one word per warp when `tr` > 32). W never touches shared memory.

The schedule is dlight's: `_gemv_rule` subclasses `LowBatchGEMV`, whose own `apply` does the analysis, the M
padding (`pad_einsum` to a multiple of `bucket`) and the loop normalisation; only the CUDA parameter choice that
dlight fixes inside `sch_inner_reduction` comes from a `GemvTile`. `GemvTile.dlight(n, k)` is dlight's own
choice, and with it the schedule is structurally equal to `LowBatchGEMV(bucket)`'s (tests/tuning/gpu/test_gemv.py).
One addition, off by default: `stage=True` reads each k-step's W and X elements into registers first
(`cache_read` / the X padding block at "local", vectorized to 16 bytes), which gives fp16 and bf16 their 16-byte
W loads (dlight's 4-lane vectors are 8 bytes in a 2-byte type, and TVM 0.27's CUDA codegen cannot emit the 8-lane
fp32 accumulator vectors that 16-byte vectors would need) and loads X once per k-step rather than once per W row.
bfloat16 is the fp16 path with the other 2-byte type (issue 32: the H200 session had no bf16 GEMV, and bf16 at
small T ran on tensor-core tiles at 0.55-0.94x cuBLAS): the same tiles, fp32 accumulate, exact bf16 -> fp32 casts.

API (for the GPU tuner):

    tile = GemvTile(ts=8, tr=32, tile_s=1, tile_r=4, vec=4, bucket=4)
    tile.problem(n, k, dtype)   -> str | None      why the tile cannot serve N, K (None = fine)
    tile.threads / tile.grid(n, m) / tile.label() / GemvTile.from_label(label)
    GemvTile.dlight(n, k, max_threads=1024, bucket=4)  dlight's own parameters for this N, K (any dtype)
    default_gemv(n, k, dtype)   -> GemvTile         256 threads, <= 6 unrolled k-steps per thread, bucket 4
    gemv_candidates(n, k, dtype)-> list[GemvTile]   the default first, then neighbours (and dlight's own when it
                                                    has <= 256 threads), all valid for N, K
    schedule_gemv(tile, n, k, dtype, target)        -> s_tir.Schedule (not built)
    build_gemv(tile, n, k, target, dtype)           -> runtime.Module, as schedule.build_gemm builds

Its time is predicted by the same static model as every GPU kernel (service.tuning.gpu_model: DRAM share of
the busiest SM, L1 lines of its global loads, FFMA issue), from the schedule's lowered TIR.

Calling convention: the built module's `main(X, W, Y)` takes X[M, K] and W[N, K] in `dtype` (float32, float16 or
bfloat16) and Y[M, N] in fp32, M symbolic (read from X's shape, not a separate argument): the same as
`schedule.build_gemm`'s, so `kernelfleet.cuda_ukernel.CudaUKernel` launches it unchanged. It is correct for every M
>= 1 (M = 0 would be an empty grid, which CUDA rejects; CudaDispatcher answers S = 0 without a launch): M is padded
to a multiple of `bucket` inside the kernel (masked X loads, masked Y stores) and the grid is (N / (ts·tile_s),
ceil(M / bucket)) of ts×tr threads; past `max_rows` it stays correct but each further `bucket` rows read W again
(from L2).

Nothing here needs a GPU. Imports TVM lazily and only schedule.py of this package: GPU measurement hosts have
no pydantic.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service.tuning.builder.cuda import cuda_target, pass_config
from service.tuning.cuda_toolchain import configure_cuda_compile
from service.tuning.tuners.pipeline.schedule import dense_module

_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
WARP = 32
LOAD_BYTES = 16  # the widest global load: LDG.E.128
BLOCK_THREADS = 256  # the default and candidates: two blocks per SM at <= 128 registers (65536 per SM)
TARGET_K_STEPS = 6  # k-steps per thread the default aims for: fully unrolled, every W load in flight at once


@dataclass(frozen=True)
class GemvTile:
    """The parameters of dlight's inner-reduction GEMV schedule (`LowBatchGEMV.sch_inner_reduction`).

    A thread block of `ts`×`tr` threads (threadIdx.y × threadIdx.x) computes `ts·tile_s` outputs of Y for
    `bucket` rows of X: thread (y, x) owns the W rows `ts·tile_s·blockIdx.x + tile_s·y + [0, tile_s)` and, at each
    k-step of `tr·tile_r` elements, the `tile_r` consecutive elements `tile_r·x + [0, tile_r)` of each, loaded
    `vec` at a time (4 fp32 = 16 bytes = one LDG.E.128; `stage` loads 16 bytes at a time whatever `vec`). A warp's
    32 lanes thus read 32·tile_r consecutive elements of one W row per load: fully coalesced."""

    ts: int = 8  # threads along N (threadIdx.y)
    tr: int = 32  # threads along K sharing one output (threadIdx.x): the width of the reduction
    tile_s: int = 1  # W rows (outputs) per thread
    tile_r: int = 4  # consecutive K elements per thread per k-step
    vec: int = 4  # fp32 accumulator lanes (dlight's VEC_C); also the load width unless `stage`
    bucket: int = 4  # X rows per thread block: M is padded to a multiple of it, grid.y = ceil(M / bucket)
    stage: bool = False  # stage each k-step's W and X in registers with 16-byte loads (not in dlight)
    unroll: int = 256  # dlight's pragma_auto_unroll_max_step on the k-loop
    max_rows: int = 16  # the largest M this kernel is meant for (routing: correct beyond it, just slower)

    @property
    def threads(self) -> int:
        return self.ts * self.tr

    @property
    def rows_per_block(self) -> int:
        """Outputs along N per thread block."""
        return self.ts * self.tile_s

    def grid(self, n: int, m: int) -> tuple[int, int]:
        """(gridDim.x, gridDim.y) at M = m."""
        return n // self.rows_per_block, -(-m // self.bucket)

    def k_steps(self, k: int) -> int:
        """Iterations of a thread's k-loop."""
        return k // (self.tr * self.tile_r)

    def accumulators(self) -> int:
        """fp32 partial sums a thread keeps in registers (dlight's first rfactor): bucket·tile_s·vec."""
        return self.bucket * self.tile_s * self.vec

    def load_elements(self, dtype: str = "float32") -> int:
        """Elements of W per global load instruction."""
        return min(self.tile_r, LOAD_BYTES // _BYTES[dtype]) if self.stage else self.vec

    def load_bytes(self, dtype: str = "float32") -> int:
        """Bytes of W per global load instruction (16: LDG.E.128)."""
        return self.load_elements(dtype) * _BYTES[dtype]

    def problem(self, n: int, k: int, dtype: str = "float32") -> str | None:
        """Why this tile cannot serve an N×K weight, or None."""
        if dtype not in _BYTES:
            return f"dtype must be one of {sorted(_BYTES)}, not {dtype!r}"
        if min(self.ts, self.tr, self.tile_s, self.tile_r, self.vec, self.bucket, self.unroll, self.max_rows) < 1:
            return "all parameters must be positive"
        if self.tr % WARP:
            return f"tr={self.tr} must be a multiple of the warp ({WARP}): the reduction is warp shuffles"
        if not 1 <= self.threads <= 1024:
            return f"{self.threads} threads per block (1..1024 allowed)"
        if self.vec not in (1, 2, 4):
            # dlight's choice never exceeds 4; TVM 0.27 emits uncompilable code for 8-lane fp32 vectors
            return f"vec={self.vec}: fp32 accumulator vectors of 1, 2 or 4 lanes only"
        if self.tile_r % self.vec or self.tile_r % self.load_elements(dtype):
            return f"tile_r={self.tile_r} must be a multiple of vec={self.vec} and of the load width"
        if self.vec * _BYTES[dtype] > LOAD_BYTES:
            return f"vec={self.vec} {dtype} is wider than a 16-byte load"
        if n % self.rows_per_block:
            return f"ts·tile_s={self.rows_per_block} must divide N={n}"
        if k % (self.tr * self.tile_r):
            return f"tr·tile_r={self.tr * self.tile_r} must divide K={k}"
        if self.bucket > self.max_rows:
            return f"bucket={self.bucket} exceeds max_rows={self.max_rows}"
        return None

    def label(self) -> str:
        """e.g. 'gemv_8x32_s1_r4v4_b4', with '_st' when staged and '_u<n>' / '_m<n>' off the defaults."""
        return (
            f"gemv_{self.ts}x{self.tr}_s{self.tile_s}_r{self.tile_r}v{self.vec}_b{self.bucket}"
            f"{'_st' if self.stage else ''}{f'_u{self.unroll}' if self.unroll != 256 else ''}"
            f"{f'_m{self.max_rows}' if self.max_rows != 16 else ''}"
        )

    @classmethod
    def from_label(cls, label: str) -> GemvTile:
        found = _LABEL.fullmatch(label)
        if found is None:
            raise ValueError(f"not a GEMV uKernel label: {label!r}")
        ts, tr, tile_s, tile_r, vec, bucket, stage, unroll, max_rows = found.groups()
        return cls(
            int(ts), int(tr), int(tile_s), int(tile_r), int(vec), int(bucket), bool(stage),
            int(unroll or 256), int(max_rows or 16),
        )  # fmt: skip

    @classmethod
    def dlight(cls, n: int, k: int, max_threads: int = 1024, bucket: int = 4) -> GemvTile:
        """What `dlight.gpu.LowBatchGEMV(bucket)` picks itself for a CUDA target and a dense with constant N, K
        (in any dtype): 4×64 threads when N > K, else 16×32; 2 rows per thread; tile_r = the largest of
        tr·{8, 4, 2, 1} dividing K, over tr; 4-lane vectors (16 bytes in fp32, 8 in fp16)."""
        ts, tr = (4, 64) if n > k else (16, 32)
        while ts * tr > max_threads:
            if ts > 1:
                ts //= 2
            else:
                tr //= 2
        tile_r = max(_max_factor(k, [tr, tr * 2, tr * 4, tr * 8]) // tr, 1)
        vec = min(_max_factor(tile_r, [1, 2, 4, 8]), 4)
        return cls(ts=ts, tr=tr, tile_s=2, tile_r=tile_r, vec=vec, bucket=bucket, unroll=256)


_LABEL = re.compile(r"gemv_(\d+)x(\d+)_s(\d+)_r(\d+)v(\d+)_b(\d+)(_st)?(?:_u(\d+))?(?:_m(\d+))?")


def _max_factor(n: int, factors: list[int]) -> int:
    for factor in sorted(factors, reverse=True):
        if n % factor == 0:
            return factor
    return 1


def _tile(
    tr: int, dtype: str, tile_s: int = 1, bucket: int = 4, stage: bool = False, threads: int = BLOCK_THREADS
) -> GemvTile:
    """A tile of `threads` threads, `tr` lanes per output and 16-byte loads (staged in fp16 and bf16, where
    dlight's 4-lane vectors are 8 bytes)."""
    elems = LOAD_BYTES // _BYTES[dtype]
    return GemvTile(
        ts=max(1, threads // tr), tr=tr, tile_s=tile_s, tile_r=elems, vec=min(elems, 4), bucket=bucket,
        stage=stage or elems > 4,
    )  # fmt: skip


def default_gemv(n: int, k: int, dtype: str = "float32") -> GemvTile:
    """256 threads, one W row per thread, 16-byte loads, bucket 4, and the fewest lanes per output (tr, from 32
    up) that leave each thread at most TARGET_K_STEPS k-steps, so the k-loop unrolls and all of a thread's W loads
    can be in flight together (fp32: K = 768 → tr = 32, 288 blocks for N = 2304; K = 3072 → tr = 128, 384 blocks
    for N = 768). ValueError when no such tile divides N and K."""
    valid = [t for t in (_tile(tr, dtype) for tr in (32, 64, 128, 256)) if t.problem(n, k, dtype) is None]
    if not valid:
        raise ValueError(f"no {BLOCK_THREADS}-thread GEMV tile with 16-byte loads divides N={n}, K={k}")
    short = [t for t in valid if t.k_steps(k) <= TARGET_K_STEPS]
    return short[0] if short else valid[-1]


def gemv_candidates(n: int, k: int, dtype: str = "float32") -> list[GemvTile]:
    """The tiles worth measuring for an N×K weight, each valid for N, K and of at most 256 threads: the default;
    the same with bucket 8 (M = 5..8 in one grid row, W read once); with half and with twice the lanes per output;
    two W rows per thread with X staged in registers (X loaded once per k-step for both rows: half the L1 traffic
    at M = 16); and dlight's own choice when it has at most 256 threads (qkv: yes; ffn_down: 16×32 = 512, no)."""
    found: list[GemvTile] = []
    try:
        base: GemvTile | None = default_gemv(n, k, dtype)
    except ValueError:
        base = None
    if base is not None:
        found += [base, _tile(base.tr, dtype, bucket=8)]
        found += [_tile(tr, dtype) for tr in (base.tr // 2, base.tr * 2) if tr >= WARP]
        found.append(_tile(base.tr, dtype, tile_s=2, stage=True))
    own = GemvTile.dlight(n, k)
    if own.threads <= BLOCK_THREADS:
        found.append(own)
    unique: list[GemvTile] = []
    for tile in found:
        if tile not in unique and tile.problem(n, k, dtype) is None:
            unique.append(tile)
    return unique


def _gemv_rule(tile: GemvTile) -> Any:
    """dlight's LowBatchGEMV with the CUDA parameter choice of `sch_inner_reduction` replaced by `tile`.

    `apply` (analysis, pad_einsum to `bucket`, normalisation) is dlight's own; `sch_inner_reduction` runs
    `_schedule_inner_reduction`, dlight 0.27's closure for the case a dense with a symbolic M reaches on CUDA."""
    from tvm.s_tir.dlight.gpu import LowBatchGEMV

    class GemvRule(LowBatchGEMV):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(bucket=tile.bucket)

        def sch_inner_reduction(
            self,
            sch: Any,
            target: Any,
            block: Any,
            dequantize_block: Any,
            pad_input_block: Any,
            vector_input_buffers: Any,
            epilogue_info: Any,
            batch_pad: int,
        ) -> Any:
            if dequantize_block is not None or epilogue_info is not None:
                raise ValueError("the GEMV uKernel schedules a plain dense (no dequantize block, no epilogue)")
            _schedule_inner_reduction(sch, block, pad_input_block, tile, batch_pad)
            return sch

    return GemvRule()


def _schedule_inner_reduction(sch: Any, gemv: Any, pad_input_block: Any, tile: GemvTile, batch_pad: int) -> None:
    """dlight 0.27's inner-reduction GEMV schedule (`LowBatchGEMV.sch_inner_reduction`'s `apply`), the same
    primitives in the same order, for what a dense with a symbolic M is on CUDA: no dequantize block, X not
    staged in shared memory (dlight stages the vector input only when its size is a constant), and the
    un-padding copy Y_pad → Y as the (non-broadcast) epilogue. `tile.stage` adds the register staging."""
    ts_, tr_, tile_s_, tile_r_, vec_c, unroll = tile.ts, tile.tr, tile.tile_s, tile.tile_r, tile.vec, tile.unroll
    # rfactor: reduce to tx * vec_c
    _, s, r = sch.get_loops(block=gemv)
    bx, ts, tile_s = sch.split(s, factors=[None, ts_, tile_s_], preserve_unit_iters=True)
    r, tr, tile_r_vec_n, vec = sch.split(r, factors=[None, tr_, tile_r_ // vec_c, vec_c], preserve_unit_iters=True)
    sch.reorder(r, tile_r_vec_n, tr, vec)
    tr_vec_c = sch.fuse(tr, vec)
    rf = sch.rfactor(tr_vec_c, 0)
    # rfactor: reduce to tx
    _, bx, ts, tile_s, tr_vec_c = sch.get_loops(block=gemv)
    tr, vec = sch.split(tr_vec_c, factors=[tr_, None], preserve_unit_iters=True)
    rf2 = sch.rfactor(tr, 0)
    # bind, vectorize compute
    batch_loop, bx, ts, tile_s, r, tile_r_vec_n, tr_vec_c = sch.get_loops(block=rf)
    tr, vec = sch.split(tr_vec_c, factors=[tr_, None], preserve_unit_iters=True)
    sch.reorder(bx, ts, tr, r, tile_s, tile_r_vec_n, vec)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ts, "threadIdx.y")
    sch.bind(tr, "threadIdx.x")
    sch.vectorize(vec)
    by, batch = sch.split(batch_loop, factors=[None, batch_pad])
    sch.bind(by, "blockIdx.y")
    sch.reorder(bx, ts, tr, r, batch)
    if tile.stage:
        # not dlight: this k-step's W (tile_s × tile_r) and X (bucket × tile_r, zero past M) in registers,
        # loaded 16 bytes at a time, before the FFMAs
        if pad_input_block is None:
            raise ValueError("register staging expects pad_einsum's X padding block (a symbolic M)")
        load = tile.load_elements(str(sch.get(pad_input_block).writes[0].source.dtype))
        w_local = sch.cache_read(rf, 1, "local")
        for block in (w_local, pad_input_block):
            if block is pad_input_block:
                sch.set_scope(block, 0, "local")
            sch.compute_at(block, r, preserve_unit_loops=True)
            _, v = sch.split(sch.get_loops(block)[-1], factors=[None, load])
            sch.vectorize(v)
    elif pad_input_block is not None:
        sch.compute_inline(pad_input_block)
    # reduce tile_s * tr * vec to tile_s * tr
    sch.reverse_compute_at(rf2, loop=bx, preserve_unit_loops=True)
    tr, vec, batch_loop, *ts_tile_s = sch.get_loops(block=rf2)[2:]
    ts_tile_s = sch.fuse(*ts_tile_s)
    ts_o, ts_i, tile_s = sch.split(ts_tile_s, factors=[None, ts_, tile_s_], preserve_unit_iters=True)
    tile_s, vec_s = sch.split(tile_s, factors=[None, _max_factor(tile_s_, [1, 2, 4, 8])], preserve_unit_iters=True)
    ts = sch.fuse(ts_o, ts_i)
    sch.reorder(ts, tr, tile_s, batch_loop, vec_s, vec)
    sch.bind(ts, "threadIdx.y")
    sch.bind(tr, "threadIdx.x")
    sch.vectorize(vec_s)
    # reduce tile_s * tr to tile_s
    sch.reverse_compute_at(gemv, loop=bx, preserve_unit_loops=True)
    tr, batch_loop, *ts_tile_s = sch.get_loops(block=gemv)[2:]
    ts_tile_s = sch.fuse(*ts_tile_s)
    ts_o, ts_i, tile_s = sch.split(ts_tile_s, factors=[None, ts_, tile_s_], preserve_unit_iters=True)
    ts = sch.fuse(ts_o, ts_i)
    sch.reorder(tile_s, batch_loop, ts, tr)
    sch.bind(ts, "threadIdx.y")
    sch.bind(tr, "threadIdx.x")
    sch.decompose_reduction(rf, loop=sch.get_loops(block=rf)[4])
    sch.decompose_reduction(rf2, loop=sch.get_loops(block=rf2)[-1])
    sch.set_scope(rf, buffer_index=0, storage_scope="local")
    sch.set_scope(rf2, buffer_index=0, storage_scope="local")
    for block in (rf, rf2):
        loop = sch.get_loops(block)[4]
        sch.annotate(block_or_loop=loop, ann_key="pragma_auto_unroll_max_step", ann_val=unroll)
        sch.annotate(block_or_loop=loop, ann_key="pragma_unroll_explicit", ann_val=1)
    # the epilogue: the un-padding copy, one thread row per output, the result in a register until then
    for epilogue in sch.get_consumers(gemv):
        sch.reverse_compute_at(epilogue, bx, preserve_unit_loops=True)
        sch.fuse(*sch.get_loops(epilogue)[3:])
        ts_o, ts_i, _ = sch.split(sch.get_loops(epilogue)[-1], factors=[None, ts_, tile_s_], preserve_unit_iters=True)
        sch.bind(sch.fuse(ts_o, ts_i), "threadIdx.y")
        sch.set_scope(gemv, 0, "local")


def schedule_gemv(
    tile: GemvTile,
    n: int,
    k: int,
    dtype: str = "float32",
    target: Mapping[str, object] | None = None,
    out_dtype: str = "float32",
) -> Any:
    """The scheduled dense (symbolic M) for `tile` (target: a `cuda_target` dict, sm_90 when None);
    ValueError when the tile cannot serve N, K. With an `out_dtype` other than fp32, dlight's normalisation folds
    dense_module's rounding block into the un-padding store (the epilogue below), as it does for its own GEMVs."""
    problem = tile.problem(n, k, dtype)
    if problem:
        raise ValueError(problem)
    import tvm

    tgt = tvm.target.Target(dict(target or cuda_target("sm_90")))
    sch = _gemv_rule(tile).apply(dense_module(n, k, None, dtype, out_dtype)["main"], tgt, False)
    if sch is None:
        raise ValueError("dlight's LowBatchGEMV does not take this dense for a GEMV")
    return sch


def build_gemv(
    tile: GemvTile, n: int, k: int, target: Mapping[str, object], dtype: str = "float32", out_dtype: str = "float32"
) -> Any:
    """Compile with `tirx.build` under the same target and PassContext as `schedule.build_gemm` (nvcc through
    TVM's callback where a CUDA runtime is present; CUDA source only otherwise). `main(X, W, Y)`, M symbolic."""
    import tvm

    arch = str(target.get("arch", ""))
    sch = schedule_gemv(tile, n, k, dtype, target, out_dtype)
    tgt = tvm.target.Target(dict(target))
    configure_cuda_compile()  # nvcc through TVM's callback, as on a GPU worker
    with tgt, tvm.transform.PassContext(config=pass_config(arch)):
        return tvm.tirx.build(sch.mod, target=tgt)
