"""The tensor-core dense uKernel (service/tuning/tuners/pipeline/tensorcore.py), checked without a GPU.

What runs here: the schedule for float16 and bfloat16 over a symbolic M, TVM's CUDA codegen, nvcc for sm_80 and
sm_90a (`-Xptxas -v`: registers, stack frame, spills, shared memory) and cuobjdump's SASS: HMMA (f16 or bf16
operands), LDSM (ldmatrix), LDGSTS (cp.async) with a multi-stage pipeline, no local memory. The bf16 intrinsics
written in the module are compared with TVM's f16 ones. What does not: the numbers. No GPU here, and the CPU
emulator of test_gemv.py has no half type and no inline PTX, so correctness of the mma/ldmatrix fragment layouts
is taken from TVM's own tested f16 recipe; tests/tuning/gpu/test_on_gpu.py is where a run against numpy belongs.
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
