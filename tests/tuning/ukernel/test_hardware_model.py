"""Hardware descriptions: from flags and cache sizes, from /proc + /sys, from the GPU table."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.tuning.hardware_model import GPU_TABLE, HardwareModel, parse_cache_size

CACHES = {1: 32 << 10, 2: 1 << 20, 3: 32 << 20}


@pytest.mark.parametrize(
    ("flags", "bits", "regs"),
    [
        (["sse2", "avx", "avx2", "fma", "avx512f", "avx512bw"], 512, 32),
        (["sse2", "avx", "avx2", "fma"], 256, 16),
        (["fp", "asimd", "crc32"], 128, 32),
        (["fpu", "sse", "sse2"], 128, 16),
    ],
)
def test_simd_width_and_registers_from_flags(flags: list[str], bits: int, regs: int) -> None:
    hw = HardwareModel.from_cpu_description(flags, CACHES, cores=4)
    assert (hw.kind, hw.vector_bits, hw.vector_registers, hw.cores) == ("cpu", bits, regs, 4)
    assert (hw.l1_bytes, hw.l2_bytes, hw.l3_bytes) == (32768, 1 << 20, 32 << 20)
    assert hw.lanes("float32") == bits // 32
    assert hw.lanes("float16") == bits // 16


def test_from_host_reads_cpuinfo_and_sysfs(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 avx avx2 fma\n\n"
        "processor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n"  # only cpu0's flags count
    )
    cache = tmp_path / "cache"
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2M")]):
        (cache / f"index{i}").mkdir(parents=True)
        (cache / f"index{i}" / "level").write_text(f"{level}\n")
        (cache / f"index{i}" / "type").write_text(f"{kind}\n")
        (cache / f"index{i}" / "size").write_text(f"{size}\n")
    hw = HardwareModel.from_host(cpuinfo=cpuinfo, cache_dir=cache, cores=3)
    assert hw.name == "Test CPU"
    assert (hw.vector_bits, hw.vector_registers, hw.cores) == (256, 16, 3)
    assert (hw.l1_bytes, hw.l2_bytes, hw.l3_bytes) == (48 << 10, 2 << 20, 0)  # the instruction cache is ignored


def test_real_host_is_described() -> None:
    hw = HardwareModel.from_host()
    assert hw.kind == "cpu" and hw.vector_bits >= 128 and hw.cores >= 1 and hw.l1_bytes > 0


def test_cache_size_spellings() -> None:
    assert [parse_cache_size(s) for s in ("32K", "1024K", "1M", "512", " 2G\n")] == [
        32768,
        1 << 20,
        1 << 20,
        512,
        2 << 30,
    ]
    with pytest.raises(ValueError):
        parse_cache_size("lots")


def test_gpu_table_and_overrides() -> None:
    assert set(GPU_TABLE) == {"sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90"}
    a100 = HardwareModel.for_gpu("sm_80")
    assert (a100.kind, a100.sm_count, a100.warp_size, a100.smem_per_sm) == ("gpu", 108, 32, 164 << 10)
    assert (a100.regs_per_sm, a100.max_threads_per_block, a100.l2_bytes) == (65536, 1024, 40 << 20)
    assert a100.lanes("float32") == 4  # 128-bit loads
    h100 = HardwareModel.for_gpu("sm_90")
    assert (h100.sm_count, h100.smem_per_sm) == (132, 228 << 10)
    a30 = a100.overridden(sm_count=56, cores=56, l2_bytes=24 << 20)
    assert (a30.sm_count, a30.smem_per_sm, a100.sm_count) == (56, 164 << 10, 108)  # the original is untouched
    with pytest.raises(ValueError, match="sm_52"):
        HardwareModel.for_gpu("sm_52")
    with pytest.raises(ValueError):
        a100.lanes("complex64")
    assert a100.to_dict()["sm_count"] == 108


def test_the_three_gpu_models_read_one_part_per_arch() -> None:
    """The uKernel rules, ALCOP's pipeline model and the static per-SM bound agree on every figure they share,
    because each is built from service.tuning.gpu_parts (issue 37 item 4)."""
    from service.tuning.gpu_model.arch import SM_SPECS
    from service.tuning.gpu_parts import GPU_PARTS, gpu_part
    from service.tuning.tuners.pipeline.model import GPU_CONSTANTS

    for arch, part in GPU_PARTS.items():
        hw = GPU_TABLE[arch]
        assert (hw.sm_count, hw.smem_per_sm, hw.l2_bytes) == (part.sm_count, part.smem_per_sm, part.l2_bytes)
        if arch in GPU_CONSTANTS:
            pipe = GPU_CONSTANTS[arch]
            assert (pipe.sm_count, pipe.smem_per_sm, pipe.max_threads_per_sm) == (
                hw.sm_count, hw.smem_per_sm, hw.max_threads_per_sm)  # fmt: skip
        if arch in SM_SPECS:
            spec = SM_SPECS[arch]
            assert (spec.sm_count, spec.smem_per_sm, spec.max_blocks_per_sm) == (
                hw.sm_count, hw.smem_per_sm, hw.max_blocks_per_sm)  # fmt: skip
            assert spec.clock_max_hz == GPU_CONSTANTS[arch].clock_hz
    assert set(SM_SPECS) == {"sm_80", "sm_90"} and "sm_70" not in GPU_CONSTANTS  # only where every figure is known
    assert gpu_part("sm_90a") is GPU_PARTS["sm_90"]
    with pytest.raises(ValueError, match="known"):
        gpu_part("sm_52")
