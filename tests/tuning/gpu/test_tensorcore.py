"""The tensor-core dense uKernel (service/tuning/tuners/pipeline/tensorcore.py), checked without a GPU.

What runs here: the schedule for float16 and bfloat16 over a symbolic M, TVM's CUDA codegen, nvcc for sm_80 and
sm_90a (`-Xptxas -v`: registers, stack frame, spills, shared memory) and cuobjdump's SASS: HMMA (f16 or bf16
operands), LDSM (ldmatrix), LDGSTS (cp.async) with a multi-stage pipeline, no local memory. The bf16 intrinsics
written in the module are compared with TVM's f16 ones. Split-K (`split_k`): two kernels, the K slice on blockIdx.z
in the source and in the static model's launch geometry, HMMA and no local memory in both arches' SASS. What does
not: the numbers. No GPU here, and the CPU emulator of test_gemv.py has no half type and no inline PTX, so
correctness of the mma/ldmatrix fragment layouts is taken from TVM's own tested f16 recipe;
tests/tuning/gpu/test_on_gpu.py is where a run against numpy belongs.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from service.tuning.gpu_model.cubin import compile_listing, have_tools, opcode_counts, parse_ptxas
from service.tuning.tuners.pipeline.schedule import cuda_source, pipeline_structure
from service.tuning.tuners.pipeline.tensorcore import (
    DTYPES,
    TensorCoreTile,
    build_tensorcore,
    cuda_target,
    intrinsics,
    schedule_tensorcore,
)

LAYERS = {"qkv": (2304, 768), "ffn_down": (768, 3072)}
TILES = [
    TensorCoreTile(32, 64, 32, 16, 32, 3),  # 4 warps, 3 stages
    TensorCoreTile(64, 64, 32, 32, 32, 4),  # 4 warps of 32×32, 4 stages
]
ARCHS = ("sm_80", "sm_90a")


needs_sass = pytest.mark.skipif(
    not have_tools(), reason="no nvcc/cuobjdump/nvdisasm (pip install -e .[dev] brings the pinned wheels)"
)


def _inspect(source: str, arch: str) -> dict[str, Any]:
    """nvcc -cubin -Xptxas -v, then cuobjdump -sass: ptxas figures and every full opcode's static count."""
    log, listing = compile_listing(source, arch)
    kernels = parse_ptxas(log)
    assert len(kernels) == 1, log
    ((name, figures),) = kernels.items()
    return {
        "registers": figures["registers"],
        "shared_bytes": figures["shared_bytes"],
        "stack": figures["stack_bytes"],
        "spills": figures["spill_stores"] + figures["spill_loads"],
        "ops": opcode_counts(listing)[name],
    }


def _count(ops: Counter[str], prefix: str) -> int:
    return sum(n for op, n in ops.items() if op == prefix or op.startswith(prefix + "."))


@pytest.fixture(scope="module")
def sources() -> dict[tuple[str, str], str]:
    """CUDA source per (tile label, dtype), qkv layer, symbolic M, built for sm_80 (the text is arch-free)."""
    n, k = LAYERS["qkv"]
    return {
        (tile.label(), dtype): cuda_source(build_tensorcore(tile, n, k, cuda_target("sm_80"), dtype))
        for tile in TILES
        for dtype in DTYPES
    }


# --- tiles -------------------------------------------------------------------------------------------------------


def test_labels_round_trip_and_problems() -> None:
    tile = TensorCoreTile()
    assert tile.label() == "tc32x64x32_w16x32_s3"
    assert tile.warps == 4 and tile.threads == 128
    assert tile.row_pitch == 40 and tile.smem_bytes() == 3 * (32 + 64) * 40 * 2
    for t in TILES:
        assert TensorCoreTile.from_label(t.label()) == t
    with pytest.raises(ValueError):
        TensorCoreTile.from_label("32x64x32_t4x1_s3a")
    assert tile.problem(*LAYERS["qkv"]) is None
    assert tile.problem(*LAYERS["ffn_down"], "bfloat16") is None
    assert "dtype" in str(tile.problem(2304, 768, "float32"))  # TF32 is not offered (explicit opt-in, not built)
    assert "divide N" in str(tile.problem(2300, 768))
    assert "multiples of 16" in str(TensorCoreTile(32, 64, 24, 16, 32).problem(2304, 768))
    assert "stages" in str(TensorCoreTile(stages=4).problem(2304, 96))
    assert "shared memory" in str(TensorCoreTile(128, 128, 64, 64, 64, 4).problem(2304, 768))
    with pytest.raises(ValueError, match="sm_80"):
        build_tensorcore(tile, 2304, 768, cuda_target("sm_75"))


# --- schedule ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_schedule_is_tensorized_over_a_symbolic_m(dtype: str) -> None:
    tile = TILES[0]
    sch = schedule_tensorcore(tile, *LAYERS["qkv"], dtype)
    script = sch.mod.script()
    assert f'X: T.Buffer(("M", 768), "{dtype}")' in script and f'W: T.Buffer((2304, 768), "{dtype}")' in script
    assert 'Y: T.Buffer((M, 2304), "float32")' in script
    for call in ("T.ptx_legacy.ldmatrix", "T.ptx_legacy.mma", "T.cuda.mma_fill_legacy"):
        assert call in script
    abbrv = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    assert f'"{abbrv}", "{abbrv}", "fp32"' in script
    assert "software_pipeline_async_stages" in script
    assert set(intrinsics(dtype)) == {"load_a", "load_b", "compute", "init", "store"}


def test_bf16_intrinsics_are_the_f16_ones_with_the_type_changed() -> None:
    """What tensorize matches (desc) and what it emits (impl) differ only in the element and PTX operand type."""
    from tvm.s_tir import TensorIntrin

    f16, bf16 = intrinsics("float16"), intrinsics("bfloat16")
    assert f16["init"] == bf16["init"] and f16["store"] == bf16["store"]  # fp32 accumulators either way
    for role in ("load_a", "load_b", "compute"):
        ours, half = TensorIntrin.get(bf16[role]), TensorIntrin.get(f16[role])
        assert "bfloat16" in ours.desc.script()
        assert ours.desc.script().replace("bfloat16", "float16") == half.desc.script()
        assert ours.impl.script().replace("bfloat16", "float16").replace('"bf16"', '"fp16"') == half.impl.script()


def _unnamed(script: str) -> str:
    """Printed TIR without the Python function's name (ours: desc/impl, TVM's: ldmatrix_desc, mma_sync_impl...)."""
    return re.sub(r"^def \w+\(", "def f(", script, flags=re.MULTILINE)


@pytest.mark.slow
def test_f16_intrinsics_are_tvms_registered_ones() -> None:
    """Our f16 intrinsics print the same TIR as TVM's registered ldmatrix A / B-trans, mma trans_b, fill and
    (element-wise) store."""
    from tvm.s_tir import TensorIntrin

    from service.tuning.tuners import tensor_intrinsics

    tensor_intrinsics.load()  # every target's intrinsics
    from tvm.s_tir.tensor_intrin import cuda

    store = TensorIntrin(*cuda.get_mma_store_intrin("float32", 8, "shared", False))
    theirs = {
        "load_a": TensorIntrin.get(cuda.LDMATRIX_f16_A_INTRIN),
        "load_b": TensorIntrin.get(cuda.LDMATRIX_f16_B_TRANS_INTRIN),
        "compute": TensorIntrin.get(cuda.MMA_f16f16f32_TRANS_B_INTRIN),
        "init": TensorIntrin.get(cuda.MMA_fill_16x16_f32_INTRIN),
        "store": store,
    }
    for role, name in intrinsics("float16").items():
        ours = TensorIntrin.get(name)
        assert _unnamed(ours.desc.script()) == _unnamed(theirs[role].desc.script()), role
        assert _unnamed(ours.impl.script()) == _unnamed(theirs[role].impl.script()), role


# --- generated CUDA and SASS -------------------------------------------------------------------------------------


@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.label())
@pytest.mark.parametrize("dtype", DTYPES)
def test_source_is_mma_ldmatrix_and_a_cp_async_pipeline(
    sources: dict[tuple[str, str], str], tile: TensorCoreTile, dtype: str
) -> None:
    source = sources[(tile.label(), dtype)]
    ptx_type = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx_type}.{ptx_type}.f32" in source
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in source
    structure = pipeline_structure(source)
    # X and W: `stages` tiles of rows × (bk + 8) elements each
    assert tile.stages * tile.bm * tile.row_pitch in structure.shared_buffers
    assert tile.stages * tile.bn * tile.row_pitch in structure.shared_buffers
    assert structure.cp_async > 0 and structure.commit_groups > 0
    assert tile.stages - 1 in structure.wait_groups  # the steady state waits for the oldest of stages-1 groups
    assert "< M)" in source  # X rows and Y rows past M are predicated, not read or written


@needs_sass
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.label())
@pytest.mark.parametrize("dtype", DTYPES)
def test_sass_has_hmma_ldsm_ldgsts_and_no_local_memory(
    sources: dict[tuple[str, str], str], tile: TensorCoreTile, dtype: str, arch: str
) -> None:
    found = _inspect(sources[(tile.label(), dtype)], arch)
    ops = found["ops"]
    hmma = {"float16": "HMMA.16816.F32", "bfloat16": "HMMA.16816.F32.BF16"}[dtype]
    per_k_step = tile.fragments_per_warp() * 2 * (tile.bk // 16)  # two m16n8k16 per 16×16×16 fragment
    assert ops[hmma] >= per_k_step, ops
    assert _count(ops, "HMMA") == ops[hmma]  # one operand type only
    assert _count(ops, "LDSM") > 0, ops  # ldmatrix
    assert _count(ops, "LDGSTS") > 0 and _count(ops, "LDGDEPBAR") > 0, ops  # cp.async + commit groups
    assert _count(ops, "FFMA") == 0  # the math is on the tensor cores
    assert found["stack"] == 0 and found["spills"] == 0, found
    assert _count(ops, "LDL") == 0 and _count(ops, "STL") == 0
    assert found["shared_bytes"] == tile.smem_bytes(dtype)
    assert found["registers"] <= 128


# --- split-K -------------------------------------------------------------------------------------------------------

SPLIT = TensorCoreTile(16, 32, 64, 16, 16, 3, split_k=4)  # ffn_down: 24 blocks per row block -> 96


def test_split_k_labels_grid_and_problems() -> None:
    assert SPLIT.label() == "tc16x32x64_w16x16_s3_sk4"
    assert TensorCoreTile.from_label(SPLIT.label()) == SPLIT
    assert TensorCoreTile.from_label("tc16x32x64_w16x16_s3").split_k == 1
    n, k = LAYERS["ffn_down"]
    assert SPLIT.problem(n, k) is None and SPLIT.k_steps(k) == 12
    assert SPLIT.grid(n, 1) == (24, 1, 4) and SPLIT.grid(n, 17) == (24, 2, 4)
    assert "bk·split_k" in str(TensorCoreTile(16, 32, 64, 16, 16, 3, split_k=5).problem(n, k))
    assert "stages" in str(TensorCoreTile(16, 32, 64, 16, 16, 3, split_k=32).problem(n, 4096))


def test_candidates_add_k_splits_only_where_blocks_leave_sms_idle() -> None:
    from service.tuning.tuners.pipeline.tensorcore import tensorcore_candidates

    n, k = LAYERS["ffn_down"]
    few = tensorcore_candidates(n, k, 16, 132)
    assert SPLIT in few and TensorCoreTile(16, 32, 64, 16, 16, 3, split_k=8) in few
    for tile in few:
        assert tile.problem(n, k) is None
        gx, gy, _ = tile.grid(n, 16)
        assert tile.split_k == 1 or gx * gy * tile.split_k // 2 < 132
    # qkv at T = 128: a block shape whose own grid fills 132 SMs gets no split (tc16x32x64: 72 x 8 blocks)
    wide = tensorcore_candidates(*LAYERS["qkv"], 128, 132)
    assert TILES_FFN in wide and not [t for t in wide if t.split_k > 1 and t.bm == 16 and t.bn == 32]


@pytest.fixture(scope="module")
def split_sources() -> dict[str, str]:
    n, k = LAYERS["ffn_down"]
    return {dtype: cuda_source(build_tensorcore(SPLIT, n, k, cuda_target("sm_80"), dtype)) for dtype in DTYPES}


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_k_source_is_two_kernels_slices_on_blockidx_z(split_sources: dict[str, str], dtype: str) -> None:
    source = split_sources[dtype]
    kernels = re.findall(r"__global__ void __launch_bounds__\((\d+)\) (\w+)\(([^)]*)\) \{", source)
    assert sorted(name for _, name, _ in kernels) == ["main_kernel", "main_kernel_1"]
    mma = next(params for _, name, params in kernels if name == "main_kernel")
    assert "Y_pad_rf_ptr" in mma and "Y_ptr" not in mma  # partial sums, not Y, from the mma kernel
    threads, _, summing = next(k for k in kernels if k[1] == "main_kernel_1")
    assert threads == "256" and "Y_ptr" in summing and "Y_pad_rf_ptr" in summing
    assert "blockIdx.z) * 768" in source  # each z reads its own 768-wide K slice of X and W (3072 / 4)
    assert "< M)" in source


@needs_sass
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_k_sass_has_hmma_and_no_local_memory(split_sources: dict[str, str], dtype: str, arch: str) -> None:
    log, listing = compile_listing(split_sources[dtype], arch)
    figures = parse_ptxas(log)
    ops = opcode_counts(listing)
    assert set(figures) == set(ops) == {"main_kernel", "main_kernel_1"}
    hmma = {"float16": "HMMA.16816.F32", "bfloat16": "HMMA.16816.F32.BF16"}[dtype]
    assert ops["main_kernel"][hmma] >= SPLIT.fragments_per_warp() * 2 * (SPLIT.bk // 16)
    assert _count(ops["main_kernel"], "LDGSTS") > 0 and _count(ops["main_kernel"], "LDSM") > 0
    assert _count(ops["main_kernel_1"], "HMMA") == 0  # the slice sum: plain loads and FADDs
    assert figures["main_kernel"]["shared_bytes"] == SPLIT.smem_bytes(dtype)
    for name, fig in figures.items():
        assert fig["stack_bytes"] == 0 and fig["spill_stores"] == 0 and fig["spill_loads"] == 0, (name, fig)
        assert _count(ops[name], "LDL") == 0 and _count(ops[name], "STL") == 0
        assert fig["registers"] <= 128


def test_split_k_launch_geometry_in_the_model() -> None:
    """The static model reads the split: grid (N/bn, ceil(M/bm), split_k) for the mma kernel, one thread per padded
    output for the sum, every FMA of the padded problem once, and the partial sums' bytes written and read back."""
    from service.tuning.builder.cuda import pass_config
    from service.tuning.gpu_model.access import analyze

    n, k = LAYERS["ffn_down"]
    access = analyze(schedule_tensorcore(SPLIT, n, k).mod, cuda_target("sm_90a"), pass_config("sm_90a"))
    mma, summed = access.kernels
    unsplit = analyze(schedule_tensorcore(TILES_FFN, n, k).mod, cuda_target("sm_90a"), pass_config("sm_90a"))
    for m in (1, 16, 17, 128):
        rows = -(-m // SPLIT.bm) * SPLIT.bm
        assert mma.grid_dims(m) == SPLIT.grid(n, m) and mma.grid_dims(m)[2] == SPLIT.split_k
        assert summed.grid_dims(m) == (rows * n // 256, 1, 1) and summed.threads == 256
        assert mma.mma_fma_per_thread * mma.threads * mma.grid(m) == rows * n * k
        assert mma.async_waits == SPLIT.k_steps(k) and mma.async_inflight == SPLIT.stages - 1
        assert access.dram_bytes(m) - unsplit.dram_bytes(m) == 2 * SPLIT.split_k * rows * n * 4
    assert summed.mma_fma_per_thread == 0 and summed.async_waits == 0


TILES_FFN = TensorCoreTile(16, 32, 64, 16, 16, 3)


@needs_sass
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", [TensorCoreTile(32, 64, 32, 16, 32, 3), TensorCoreTile(32, 64, 32, 16, 32, 3, 4)])
def test_the_ukernel_path_stores_y_in_the_inputs_dtype(dtype: str, tile: TensorCoreTile) -> None:
    """What a half-precision ukernel job builds (gpu_kernels.build_module): the fp32 accumulators are rounded in
    the un-padding store itself (split-K: in the slice sum), so Y is in the inputs' dtype as F.linear's is, with
    no pass or buffer of its own; the mma kernel is unchanged (HMMA, no local memory)."""
    from service.tuning.tuners.ukernel.gpu_kernels import build_module

    n, k = LAYERS["ffn_down"] if tile.split_k > 1 else LAYERS["qkv"]
    source = cuda_source(build_module(tile, n, k, cuda_target("sm_90a"), dtype))
    ctype = {"float16": "half", "bfloat16": "nv_bfloat16"}[dtype]
    assert f"{ctype}* __restrict__ Y_out_ptr" in source and "float* __restrict__ Y_ptr" not in source
    log, listing = compile_listing(source, "sm_90a")
    kernels = parse_ptxas(log)
    assert len(kernels) == (2 if tile.split_k > 1 else 1), log
    for name, figures in kernels.items():
        assert figures["stack_bytes"] == figures["spill_stores"] == figures["spill_loads"] == 0, (name, figures)
    ops = Counter[str]()
    for per_kernel in opcode_counts(listing).values():
        ops.update(per_kernel)
    assert _count(ops, "HMMA") > 0 and _count(ops, "LDL") == _count(ops, "STL") == 0
