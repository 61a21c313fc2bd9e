"""What we know of each NVIDIA architecture, in one place: one representative part per arch.

Three models read it, each taking what it needs: the rule-based uKernel search (`hardware_model.HardwareModel.
for_gpu`: SMs, caches, residency), ALCOP's pipeline model (`tuners.pipeline.model.GPUConstants.for_arch`: clocks,
lanes, bandwidths, latencies) and the static per-SM bound (`gpu_model.arch.sm_spec`: clock range, lanes, the DRAM
rate a streaming read reaches, tensor-core rate). A detected GPU overrides the SM count and L2 of its arch's part
(`service.tuning.gpu.GPUDescription`).

Sources: NVIDIA's architecture whitepapers and data sheets (SMs, clocks, lanes, shared memory, L2, DRAM
bandwidth) and the CUDA programming guide's compute-capability table (registers, threads and blocks per SM).
L2 bandwidth and the latencies are microbenchmark-scale estimates that the pipeline model's `calibrate` replaces
with fitted values. Fields a source does not give are None, and the model that needs them says so for that arch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GPUPart:
    arch: str  # sm_XY
    name: str
    sm_count: int
    smem_per_sm: int  # bytes: the shared-memory carve-out's maximum per SM
    l1_bytes: int  # the combined L1 / shared-memory array per SM
    l2_bytes: int
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    regs_per_sm: int = 65536
    clock_base_hz: float | None = None  # the SM clock under sustained load sits between base and boost
    clock_boost_hz: float | None = None
    fp32_lanes_per_sm: int | None = None  # FP32 FMA lanes per SM per clock
    fp16_lanes_per_sm: int | None = None  # non-tensor half-precision FMA lanes (half2)
    # fp16/bf16 tensor-core FMAs per SM per clock through mma.sync (dense, fp32 accumulate). A100: its data sheet
    # (312 TFLOP/s). H100: an assumption — wgmma reaches 2048, the warp-level mma.sync the uKernels use is reported
    # well below that; 1024 (A100's rate) until a lent GPU measures it.
    mma_fma_per_clock: int = 1024
    dram_bw: float | None = None  # bytes/s, the data sheet's peak
    dram_stream_bw: float | None = None  # bytes/s a streaming read reaches (the static bound's DRAM term)
    llc_bw: float | None = None  # L2, bytes/s (estimate)
    smem_bytes_per_clock: int | None = None  # per SM
    lat_dram_s: float | None = None  # estimates, replaced by the pipeline model's calibration
    lat_llc_s: float | None = None
    lat_smem_s: float | None = None

    @property
    def async_copy(self) -> bool:
        """cp.async (global to shared memory without registers): sm_80 and newer."""
        return int(self.arch[3:]) >= 80


GPU_PARTS: dict[str, GPUPart] = {
    "sm_70": GPUPart("sm_70", "V100", sm_count=80, smem_per_sm=96 << 10, l1_bytes=128 << 10, l2_bytes=6 << 20),
    "sm_75": GPUPart(
        "sm_75", "T4", sm_count=40, smem_per_sm=64 << 10, l1_bytes=96 << 10, l2_bytes=4 << 20,
        max_threads_per_sm=1024, max_blocks_per_sm=16,
    ),
    "sm_80": GPUPart(
        "sm_80", "A100 SXM4 40GB", sm_count=108, smem_per_sm=164 << 10, l1_bytes=192 << 10, l2_bytes=40 << 20,
        clock_base_hz=1.275e9, clock_boost_hz=1.41e9, fp32_lanes_per_sm=64, fp16_lanes_per_sm=256,
        # dram_stream_bw exceeds this part's 1.555 TB/s peak: it is the 80 GB part's (2.0 TB/s) streaming rate, kept
        # as the static bound has used it; no A100 has been measured here
        dram_bw=1.555e12, dram_stream_bw=1.8e12, llc_bw=4.8e12, smem_bytes_per_clock=128,
        lat_dram_s=4.0e-7, lat_llc_s=1.5e-7, lat_smem_s=2.0e-8,
    ),
    "sm_86": GPUPart(
        "sm_86", "RTX 3090", sm_count=82, smem_per_sm=100 << 10, l1_bytes=128 << 10, l2_bytes=6 << 20,
        max_threads_per_sm=1536, max_blocks_per_sm=16, clock_boost_hz=1.695e9, fp32_lanes_per_sm=128,
        fp16_lanes_per_sm=128, dram_bw=9.36e11, llc_bw=2.5e12, smem_bytes_per_clock=128,
        lat_dram_s=4.5e-7, lat_llc_s=1.5e-7, lat_smem_s=2.0e-8,
    ),
    "sm_89": GPUPart(
        "sm_89", "RTX 4090", sm_count=128, smem_per_sm=100 << 10, l1_bytes=128 << 10, l2_bytes=72 << 20,
        max_threads_per_sm=1536, max_blocks_per_sm=24, clock_boost_hz=2.52e9, fp32_lanes_per_sm=128,
        fp16_lanes_per_sm=128, dram_bw=1.008e12, llc_bw=5.0e12, smem_bytes_per_clock=128,
        lat_dram_s=4.5e-7, lat_llc_s=1.2e-7, lat_smem_s=1.5e-8,
    ),
    "sm_90": GPUPart(
        "sm_90", "H100 SXM5", sm_count=132, smem_per_sm=228 << 10, l1_bytes=256 << 10, l2_bytes=50 << 20,
        clock_base_hz=1.755e9, clock_boost_hz=1.98e9, fp32_lanes_per_sm=128, fp16_lanes_per_sm=256,
        # a streaming read reaches ~3.0 TB/s of the 3.35 peak (gpu-first-light.md §2)
        dram_bw=3.35e12, dram_stream_bw=3.0e12, llc_bw=7.5e12, smem_bytes_per_clock=128,
        lat_dram_s=4.5e-7, lat_llc_s=1.3e-7, lat_smem_s=1.5e-8,
    ),
}  # fmt: skip


def base_arch(arch: str) -> str:
    """'sm_90a' -> 'sm_90': the arch-specific feature suffix (wgmma, setmaxnreg, ...) names what a kernel may
    use, not other hardware; an sm_90a kernel runs on every sm_90 GPU, so tables and queues use the base."""
    return re.sub(r"(?<=\d)[af]$", "", arch)


def gpu_part(arch: str) -> GPUPart:
    """The part for `arch` ('sm_90a' reads as 'sm_90'); ValueError naming the known ones."""
    try:
        return GPU_PARTS[base_arch(arch)]
    except KeyError:
        raise ValueError(f"no GPU part for {arch!r}; known: {', '.join(sorted(GPU_PARTS))}") from None
