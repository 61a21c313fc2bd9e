"""A software-pipelined, tiled CUDA GEMM with a symbolic M: Y[M,N] = X[M,K]·W[N,K]ᵀ (fp32 or fp16 in, fp32 out
by default; `out_dtype` rounds the fp32 accumulators to another dtype in the final store).

One binary serves every M (DietCode's padding recipe that ran on an H100, ../shared/research/gpu.md §2):
`pad_einsum` pads M up to a multiple of the block tile inside the kernel, the accumulator lives in
registers (`local`), X and W tiles are staged through shared memory at the k-loop, and the k-loop is
annotated as an ALCOP-style software pipeline of `stages` stages whose copies are asynchronous
(`cp.async`, needs `tirx.use_async_copy` in the PassContext; `build_gemm` sets it).

API (imported by the ALCOP tuner in this package, keep it stable):

    tile = GemmTile(bm=8, bn=24, bk=48, tm=4, tn=1, stages=4, async_copy=True, split_k=1)
    tile.problem(n, k)                      -> str | None      why the tile cannot serve N, K (None = fine)
    tile.threads / tile.smem_bytes(dtype) / tile.registers_estimate()
    dense_module(n, k, m=None, dtype, out_dtype="float32") -> IRModule   m=None: symbolic M; fp32 accumulation
    schedule_gemm(tile, n, k, m=None, dtype, out_dtype)   -> s_tir.Schedule  (not built; inspect or build it)
    (cuda_target, pass_config and supports_async_copy are the builder's: service.tuning.builder.cuda)
    build_gemm(tile, n, k, target, m=None, dtype, out_dtype) -> runtime.Module  tirx.build, pipeline PassContext
    cuda_source(module)                     -> str             the generated .cu text
    compile_cuda(source, arch, fmt="cubin") -> bytes           nvcc (no GPU needed)
    pipeline_structure(source)              -> PipelineStructure  stage-sized shared buffers, cp.async copies,
                                                                commit/wait groups, as found in the source

Split-K (`split_k > 1`) splits the reduction over blockIdx.z with `rfactor`: each z-slice writes a
partial [split_k, M, N] sum and a second kernel adds them. It is for small M·N, where the output alone
gives too few thread blocks to fill the SMs (gpu.md §5).

Nothing here needs a GPU: building, CUDA codegen and nvcc run on a CPU host. Running needs one.
Imports only TVM (lazily): GPU measurement hosts have no pydantic, so nothing from kernelfleet/service.models.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service.tuning.builder.cuda import pass_config, supports_async_copy
from service.tuning.cuda_toolchain import configure_cuda_compile

_BYTES = {"float32": 4, "float16": 2}


@dataclass(frozen=True)
class GemmTile:
    """Thread-block tile bm×bn, k-step bk, per-thread tile tm×tn, pipeline depth, async copies, split-K."""

    bm: int
    bn: int
    bk: int
    tm: int = 1
    tn: int = 1
    stages: int = 3
    async_copy: bool = True
    split_k: int = 1
    # elements added to every row of the shared X and W tiles (`storage_align`): with rows of bk elements a
    # multiple of 32 banks apart, lanes owning neighbouring W rows hit one bank and an LDS.128 takes 32
    # wavefronts instead of 4 (gpu-first-light.md §4.1); a pitch of bk + 4 fp32 (≡ 4 mod 32 words) spreads
    # each quarter-warp's 16-byte reads over all 32 banks. 0 reproduces the first light's unpadded tiles.
    pad: int = 0
    # a thread's tn columns: adjacent (tx·tn + j, the first light's layout) or interleaved (tx + j·bn/tn). With
    # adjacent columns, lanes of a warp read W rows tn apart and even a padded tile conflicts tn-fold; with
    # interleaved ones they read consecutive rows (and write Y coalesced), as CUTLASS's SIMT warp tiles do.
    interleave: bool = False

    @property
    def threads_y(self) -> int:
        return self.bm // self.tm

    @property
    def threads_x(self) -> int:
        return self.bn // self.tn

    @property
    def threads(self) -> int:
        return self.threads_y * self.threads_x

    def smem_bytes(self, dtype: str = "float32") -> int:
        """Shared memory per thread block: one (bm + bn)·(bk + pad) stage per pipeline stage, padding counted."""
        return max(self.stages, 1) * (self.bm + self.bn) * (self.bk + self.pad) * _BYTES[dtype]

    @property
    def row_pitch(self) -> int:
        """Elements between two rows of a shared tile: bk plus the padding."""
        return self.bk + self.pad

    def registers_estimate(self) -> int:
        """32-bit registers per thread: accumulators + one X and W fragment + addressing overhead.

        A floor (nvcc adds its own); FTuner's rules use it to keep tiles clear of the 255 limit and to
        estimate occupancy, the measurement decides the rest."""
        return self.tm * self.tn + self.tm + self.tn + 24

    def vector_width(self, dtype: str = "float32") -> int:
        """Elements per cooperative-fetch vector: 16 B (cp.async's widest) when bk allows it."""
        lanes = 16 // _BYTES[dtype]
        while lanes > 1 and self.bk % lanes:
            lanes //= 2
        return lanes

    def problem(self, n: int, k: int) -> str | None:
        """Why this tile cannot serve an N×K weight, or None."""
        if min(self.bm, self.bn, self.bk, self.tm, self.tn, self.stages, self.split_k) < 1:
            return "tile sizes, stages and split_k must be positive"
        if self.bm % self.tm or self.bn % self.tn:
            return f"thread tile {self.tm}x{self.tn} must divide block tile {self.bm}x{self.bn}"
        if n % self.bn:
            return f"bn={self.bn} must divide N={n}"
        if k % (self.bk * self.split_k):
            return f"bk·split_k={self.bk * self.split_k} must divide K={k}"
        if self.pad < 0 or self.pad % self.vector_width():
            return f"pad={self.pad} must be a non-negative multiple of the {self.vector_width()}-element copy vector"
        if not 1 <= self.threads <= 1024:
            return f"{self.threads} threads per block (1..1024 allowed)"
        steps = k // (self.bk * self.split_k)
        if self.stages > 1 and steps < self.stages:
            return f"{self.stages} stages need at least as many k-steps (K/(bk·split_k) = {steps})"
        return None

    def label(self) -> str:
        sk = f"_sk{self.split_k}" if self.split_k > 1 else ""
        pad = f"_p{self.pad}" if self.pad else ""
        spread = "i" if self.interleave else ""
        return (
            f"{self.bm}x{self.bn}x{self.bk}_t{self.tm}x{self.tn}{spread}_s{self.stages}{'a' if self.async_copy else ''}"
            f"{sk}{pad}"
        )

    @classmethod
    def from_label(cls, label: str) -> GemmTile:
        """The tile a `label()` names, e.g. '8x96x32_t1x1_s2a_sk8' or '64x96x16_t8x8_s3a_p4'."""
        found = _LABEL.fullmatch(label)
        if found is None:
            raise ValueError(f"not a uKernel tile label: {label!r}")
        bm, bn, bk, tm, tn, spread, stages, is_async, split_k, pad = found.groups()
        return cls(
            int(bm),
            int(bn),
            int(bk),
            int(tm),
            int(tn),
            int(stages),
            bool(is_async),
            int(split_k or 1),
            int(pad or 0),
            bool(spread),
        )


_LABEL = re.compile(r"(\d+)x(\d+)x(\d+)_t(\d+)x(\d+)(i?)_s(\d+)(a?)(?:_sk(\d+))?(?:_p(\d+))?")


def conflict_free_pad(bk: int, dtype: str = "float32") -> int:
    """The row padding (elements) that makes a shared tile's 16-byte row reads conflict-free for lanes owning
    consecutive rows: a row pitch of an odd number of 16-byte chunks, so the 8 lanes of a quarter-warp land on
    8 different 4-bank groups. 0 when bk already gives one."""
    chunk = 16 // _BYTES[dtype]
    return 0 if (bk // chunk) % 2 else chunk


OUTPUT_CAST = "Y_out"  # the block that rounds the fp32 accumulators to out_dtype (dense_module)


def dense_module(n: int, k: int, m: int | None = None, dtype: str = "float32", out_dtype: str = "float32") -> Any:
    """Y = X·Wᵀ as an IRModule; M is a symbolic var when m is None. Accumulates in fp32 (the reduction block "Y")
    and outputs `out_dtype`: fp32 as it is, another dtype through one rounding block, OUTPUT_CAST, after it, which
    the schedules fold into the store of the un-padding copy (`inline_output_cast`)."""
    import tvm
    from tvm import te

    rows: Any = te.var("M") if m is None else m
    x = te.placeholder((rows, k), name="X", dtype=dtype)
    w = te.placeholder((n, k), name="W", dtype=dtype)
    r = te.reduce_axis((0, k), name="k")
    y = te.compute(
        (rows, n), lambda i, j: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r), name="Y"
    )
    if out_dtype != "float32":
        y = te.compute((rows, n), lambda i, j: y[i, j].astype(out_dtype), name=OUTPUT_CAST)
    return tvm.IRModule({"main": te.create_prim_func([x, w, y])})


def inline_output_cast(sch: Any) -> None:
    """Fold dense_module's rounding block into the un-padding copy `pad_einsum` made (Y_pad → Y): the copy then
    stores out_dtype straight from the fp32 accumulators, so rounding costs no pass and no buffer of its own.
    Nothing to do for an fp32 output; after `pad_einsum` only (before it, Y is a reduction and cannot take it)."""
    try:
        cast = sch.get_sblock(OUTPUT_CAST)
    except Exception:  # no such block: the output is fp32
        return
    sch.reverse_compute_inline(cast)


def _cooperative_fetch(sch: Any, block: Any, depth: int, tile: GemmTile, dtype: str) -> None:
    """All threads of the block copy one shared tile, `vector_width` elements (one cp.async) at a time.

    `depth` = loops above the copy (down to the k-loop); the copy's own loops are fused (bm = 1 leaves one)."""
    own = sch.get_loops(block)[depth:]
    fused = sch.fuse(*own) if len(own) > 1 else own[0]
    vec = tile.vector_width(dtype)
    _, t_y, t_x, v = sch.split(fused, [None, tile.threads_y, tile.threads_x, vec])
    sch.bind(t_y, "threadIdx.y")
    sch.bind(t_x, "threadIdx.x")
    sch.vectorize(v)


def _split_columns(sch: Any, j: Any, tile: GemmTile) -> tuple[Any, Any, Any]:
    """(block, thread, per-thread) loops over N: adjacent or interleaved columns per thread (GemmTile.interleave)."""
    if tile.interleave:
        bj, jj, tx = sch.split(j, [None, tile.tn, tile.threads_x])
        return bj, tx, jj
    bj, tx, jj = sch.split(j, [None, tile.threads_x, tile.tn])
    return bj, tx, jj


def _pad_rows(sch: Any, block: Any, tile: GemmTile) -> None:
    """Row pitch bk + pad for a shared tile: `storage_align` rounds the row stride (bk) up to the next
    multiple of `factor` (offset 0), so factor = bk + pad gives exactly that pitch."""
    if tile.pad:
        sch.storage_align(block, 0, axis=-2, factor=tile.bk + tile.pad, offset=0)


def _annotate_pipeline(sch: Any, loop: Any, tile: GemmTile) -> None:
    # stages for [copy X, copy W, compute]: the copies run stages-1 k-steps ahead of the math
    if tile.stages > 1:
        sch.annotate(loop, "software_pipeline_stage", [0, 0, tile.stages - 1])
        sch.annotate(loop, "software_pipeline_order", [0, 1, 2])
        if tile.async_copy:
            sch.annotate(loop, "software_pipeline_async_stages", [0])


def schedule_gemm(
    tile: GemmTile, n: int, k: int, m: int | None = None, dtype: str = "float32", out_dtype: str = "float32"
) -> Any:
    """The scheduled module (see the module docstring); raises ValueError when the tile cannot serve N, K."""
    problem = tile.problem(n, k)
    if problem:
        raise ValueError(problem)
    if dtype not in _BYTES:
        raise ValueError(f"dtype must be one of {sorted(_BYTES)}, not {dtype!r}")
    from tvm import s_tir

    sch = s_tir.Schedule(dense_module(n, k, m, dtype, out_dtype))
    blk = sch.get_sblock("Y")
    # pad M to a multiple of bm inside the kernel; a symbolic M cannot be split directly
    # ("Can only handle constant size stack allocation", gpu.md §2)
    sch.pad_einsum(blk, [tile.bm, 1, 1])
    inline_output_cast(sch)
    producers = sch.get_producers(blk)
    xpad = producers[0] if producers else None
    consumers = sch.get_consumers(blk)
    ycopy = consumers[0] if consumers else sch.cache_write(blk, 0, "global")
    if tile.split_k > 1:
        return _schedule_split_k(sch, blk, xpad, ycopy, tile, dtype)
    i, j, kk = sch.get_loops(blk)
    bi, ty, ii = sch.split(i, [None, tile.threads_y, tile.tm])
    bj, tx, jj = _split_columns(sch, j, tile)
    ko, ki = sch.split(kk, [None, tile.bk])
    # blockIdx.x over N: consecutive blocks share the X rows and stream different W columns
    sch.reorder(bj, bi, ty, tx, ko, ki, ii, jj)
    sch.bind(bj, "blockIdx.x")
    sch.bind(bi, "blockIdx.y")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.set_scope(blk, 0, "local")  # the padded Y tile becomes the register accumulator
    sch.reverse_compute_at(ycopy, tx)
    for idx in (0, 1):
        shared = sch.cache_read(blk, idx, "shared")
        sch.compute_at(shared, ko)
        _pad_rows(sch, shared, tile)
        _cooperative_fetch(sch, shared, 5, tile, dtype)  # under bj, bi, ty, tx, ko
    if xpad is not None:
        sch.compute_inline(xpad)
    sch.decompose_reduction(blk, ko)
    _annotate_pipeline(sch, ko, tile)
    return sch


def _schedule_split_k(sch: Any, blk: Any, xpad: Any, ycopy: Any, tile: GemmTile, dtype: str) -> Any:
    """Split-K: rfactor the outer k into blockIdx.z partial sums, then one small kernel adds them."""
    i, j, kk = sch.get_loops(blk)
    ks, _ = sch.split(kk, [tile.split_k, None])
    rf = sch.rfactor(ks, 0)  # rf block: Y_rf[ks, i, j]; blk now sums over ks
    # partial-sum kernel
    i, j, kz, kr = sch.get_loops(rf)  # rfactor keeps the original loop order
    bi, ty, ii = sch.split(i, [None, tile.threads_y, tile.tm])
    bj, tx, jj = _split_columns(sch, j, tile)
    ko, ki = sch.split(kr, [None, tile.bk])
    sch.reorder(kz, bj, bi, ty, tx, ko, ki, ii, jj)
    sch.bind(kz, "blockIdx.z")
    sch.bind(bj, "blockIdx.x")
    sch.bind(bi, "blockIdx.y")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    acc = sch.cache_write(rf, 0, "local")
    sch.reverse_compute_at(acc, tx)
    for idx in (0, 1):
        shared = sch.cache_read(rf, idx, "shared")
        sch.compute_at(shared, ko)
        _pad_rows(sch, shared, tile)
        _cooperative_fetch(sch, shared, 6, tile, dtype)  # under kz, bj, bi, ty, tx, ko
    if xpad is not None:
        sch.compute_inline(xpad)
    sch.decompose_reduction(rf, ko)
    _annotate_pipeline(sch, ko, tile)
    # second kernel: each thread adds the split_k partial sums of one output and writes it unpadded
    fi, fj, _ = sch.get_loops(blk)
    bx, tx2 = sch.split(sch.fuse(fi, fj), [None, 256])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx2, "threadIdx.x")
    sch.reverse_compute_at(ycopy, tx2)
    sch.set_scope(blk, 0, "local")  # the summed output lives in a register until the unpadded write
    return sch


def build_gemm(
    tile: GemmTile,
    n: int,
    k: int,
    target: Mapping[str, object],
    m: int | None = None,
    dtype: str = "float32",
    out_dtype: str = "float32",
) -> Any:
    """Compile with `tirx.build` (a runtime.Module that exports to a .so) under the async-copy PassContext.

    Without a GPU runtime the device part is CUDA source only; with one (a GPU host, or the fake driver of
    tests/tuning/gpu/fake_driver.py) TVM calls `tvm_callback_cuda_compile`, which `configure_cuda_compile`
    makes nvcc, and the module holds its fatbin."""
    import tvm

    arch = str(target.get("arch", ""))
    if tile.async_copy and tile.stages > 1 and not supports_async_copy(arch):
        raise ValueError(f"async copies (cp.async) need sm_80 or newer, not {arch}; use async_copy=False")
    sch = schedule_gemm(tile, n, k, m, dtype, out_dtype)
    tgt = tvm.target.Target(dict(target))
    configure_cuda_compile()  # nvcc through TVM's callback, as on a GPU worker
    with tgt, tvm.transform.PassContext(config=pass_config(arch)):
        return tvm.tirx.build(sch.mod, target=tgt)


def cuda_source(module: Any) -> str:
    """The generated CUDA C of a built module (`inspect_source("cu")` returns "" in 0.27; "" works)."""
    for imported in module.imports:
        src = imported.inspect_source("")
        if "__global__" in src:
            return str(src)
    raise ValueError("module has no CUDA device code")


def compile_cuda(source: str, arch: str, fmt: str = "cubin") -> bytes:
    """nvcc the source for `arch` (ptx, cubin or fatbin) on this host; needs no GPU."""
    import tvm
    from tvm.support import nvcc

    configure_cuda_compile()  # the pinned wheel's nvcc first on PATH
    with tvm.target.Target({"kind": "cuda", "arch": arch}):  # without it: "No CUDA architecture was specified"
        return bytes(nvcc.compile_cuda(source, target_format=fmt, compiler="nvcc"))


@dataclass(frozen=True)
class PipelineStructure:
    shared_buffers: tuple[int, ...]  # element counts of each __shared__ array
    cp_async: int  # cp.async call sites in the kernel body
    commit_groups: int  # commit_group call sites
    wait_groups: tuple[int, ...]  # the distinct N of cp.async.wait_group N

    def is_pipelined(self, tile: GemmTile) -> bool:
        """Shared buffers hold `stages` copies of the X and W tiles, and copies are async when asked."""
        stage_sized = tile.stages * tile.bm * tile.row_pitch in self.shared_buffers and (
            tile.stages * tile.bn * tile.row_pitch in self.shared_buffers
        )
        if not (tile.async_copy and tile.stages > 1):
            return stage_sized
        return stage_sized and self.cp_async > 0 and self.commit_groups > 0 and len(self.wait_groups) > 0


_SHARED = re.compile(r"__shared__\s+(?:alignas\(\d+\)\s+|__align__\(\d+\)\s+)?\w+\s+\w+\[(\d+)\]")
# call sites only: TVM 0.27 wraps each PTX instruction in a __device__ helper whose definition also names it
_CP_ASYNC_CALL = re.compile(r"^\s+ptx_cp_async\w*\(", re.MULTILINE)
_COMMIT_CALL = re.compile(r"^\s+\w*cp_async_commit_group\w*\(\);", re.MULTILINE)
_WAIT = re.compile(r"cp\.async\.wait_group\s+(\d+)")


def pipeline_structure(source: str) -> PipelineStructure:
    return PipelineStructure(
        shared_buffers=tuple(int(s) for s in _SHARED.findall(source)),
        cp_async=len(_CP_ASYNC_CALL.findall(source)),
        commit_groups=len(_COMMIT_CALL.findall(source)),
        wait_groups=tuple(sorted({int(w) for w in _WAIT.findall(source)})),
    )
