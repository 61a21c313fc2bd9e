"""What the bound needs of an SM, per architecture: clocks, FP32 lanes, DRAM bandwidth, residency limits.

Clock bounds bracket the time: the SM clock under load sits between the base (`clock_min_hz`) and boost
(`clock_max_hz`) clocks; the slow end pairs with the phase model of shared memory, the fast end with the
warp model (banks.py). Figures are NVIDIA's data-sheet numbers; the H100's DRAM term uses the ~3.0 TB/s a
streaming read reaches on it (gpu-first-light.md §2), not the 3.35 TB/s peak.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SMSpec:
    name: str
    sm_count: int
    clock_min_hz: float
    clock_max_hz: float
    fp32_lanes: int  # FFMA issued per SM per clock
    dram_bytes_per_s: float
    # fp16/bf16 tensor-core FMAs per SM per clock through mma.sync (dense, fp32 accumulate). A100: its data sheet
    # (312 TFLOP/s). H100: an assumption — wgmma reaches 2048, the warp-level mma.sync the uKernels use is
    # reported well below that; 1024 (A100's rate) until a lent GPU measures it.
    mma_fma_per_clock: int = 1024
    regs_per_sm: int = 65536
    smem_per_sm: int = 233472  # bytes a kernel's blocks may share (the carve-out's maximum)
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    shared_wavefronts_per_clock: int = 1
    # What one kernel costs beyond its bound when it is tiny (launch, ramp-up, tail, in a CUDA-graph replay).
    # An assumption, not a fit: the first light's fastest kernel (cuBLAS fp16, qkv T = 1) took 4.55 µs for 1.2 µs
    # of DRAM time, and graph-replayed kernel nodes are commonly ~2 µs apart. `Prediction.with_launch_s` adds it.
    launch_floor_s: float = 2.0e-6

    def resident_blocks(self, threads: int, registers: int, smem_bytes: int) -> int:
        """Blocks of this kernel one SM holds at once (registers are allocated per warp, in 256s)."""
        warps = -(-threads // 32)
        regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
        limits = [
            self.max_blocks_per_sm,
            self.max_threads_per_sm // max(threads, 1),
            self.regs_per_sm // (regs_per_warp * warps),
        ]
        if smem_bytes:
            limits.append(self.smem_per_sm // (smem_bytes + 1024))  # 1 KiB per block is reserved by the driver
        return max(0, min(limits))


SM_SPECS: dict[str, SMSpec] = {
    "sm_90": SMSpec(
        "H100 SXM5", sm_count=132, clock_min_hz=1.755e9, clock_max_hz=1.98e9, fp32_lanes=128, dram_bytes_per_s=3.0e12
    ),
    "sm_80": SMSpec(
        "A100 SXM4",
        sm_count=108,
        clock_min_hz=1.275e9,
        clock_max_hz=1.41e9,
        fp32_lanes=64,
        dram_bytes_per_s=1.8e12,
        smem_per_sm=167936,
    ),
}


def sm_spec(arch: str, sm_count: int | None = None) -> SMSpec:
    """The spec for `arch` ('sm_90a' reads as 'sm_90'), with the SM count a worker detected if given."""
    base = arch[:-1] if arch.endswith("a") else arch
    if base not in SM_SPECS:
        raise ValueError(f"the static GPU model has no figures for {arch}; known: {sorted(SM_SPECS)}")
    spec = SM_SPECS[base]
    if sm_count and sm_count != spec.sm_count:
        from dataclasses import replace

        spec = replace(spec, sm_count=sm_count)
    return spec
