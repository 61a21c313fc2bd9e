"""What the bound needs of an SM, per architecture: clocks, FP32 lanes, DRAM bandwidth, residency limits.

Clock bounds bracket the time: the SM clock under load sits between the base (`clock_min_hz`) and boost
(`clock_max_hz`) clocks; the slow end pairs with the phase model of shared memory, the fast end with the
warp model (banks.py). The figures come from service.tuning.gpu_parts; the DRAM term is the rate a streaming read
reaches (the H100's ~3.0 TB/s, gpu-first-light.md §2), not the peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.tuning.gpu_parts import GPU_PARTS, GPUPart, base_arch


@dataclass(frozen=True)
class SMSpec:
    name: str
    sm_count: int
    clock_min_hz: float
    clock_max_hz: float
    fp32_lanes: int  # FFMA issued per SM per clock
    dram_bytes_per_s: float
    mma_fma_per_clock: int = 1024  # fp16/bf16 tensor-core FMAs per SM per clock (gpu_parts says whose figure)
    regs_per_sm: int = 65536
    smem_per_sm: int = 233472  # bytes a kernel's blocks may share (the carve-out's maximum)
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    shared_wavefronts_per_clock: int = 1
    # What one kernel costs beyond its bound when it is tiny (launch, ramp-up, tail, in a CUDA-graph replay).
    # An assumption, not a fit: the first light's fastest kernel (cuBLAS fp16, qkv T = 1) took 4.55 µs for 1.2 µs
    # of DRAM time, and graph-replayed kernel nodes are commonly ~2 µs apart. `Prediction.with_launch_s` adds it.
    launch_floor_s: float = 2.0e-6
    # The tensor-core kernels' serial k-loop (bound.py's latency term): per k-step, the copy latency divided by
    # the copy groups in flight (stages - 1) plus a fixed cost (wait, barrier, ldmatrix -> mma.sync chain).
    # FITTED, not read off a data sheet: least squares on log(measured / predicted) over the 192 tensor-core
    # points of the H200 session (bench/results/gpu-h200-2026-11-27/{fp16,bf16}.json, 6 tiles x 8 T x 2 layers
    # x 2 dtypes), with the H200's DRAM rate (`h200_spec`). 0.265 µs is ~525 clocks at the 1.98 GHz boost, the
    # order of a Hopper global-memory round trip; only sm_90 was measured, other arches reuse it unverified.
    tc_copy_latency_s: float = 0.265e-6
    tc_step_s: float = 0.125e-6

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


def _of_part(part: GPUPart) -> SMSpec | None:
    """The bound's view of a part (service.tuning.gpu_parts); None when it lacks the clock range, lanes or the
    streaming DRAM rate."""
    if not (part.clock_base_hz and part.clock_boost_hz and part.fp32_lanes_per_sm and part.dram_stream_bw):
        return None
    return SMSpec(
        part.name,
        sm_count=part.sm_count,
        clock_min_hz=part.clock_base_hz,
        clock_max_hz=part.clock_boost_hz,
        fp32_lanes=part.fp32_lanes_per_sm,
        dram_bytes_per_s=part.dram_stream_bw,
        mma_fma_per_clock=part.mma_fma_per_clock,
        regs_per_sm=part.regs_per_sm,
        smem_per_sm=part.smem_per_sm,
        max_threads_per_sm=part.max_threads_per_sm,
        max_blocks_per_sm=part.max_blocks_per_sm,
    )


SM_SPECS: dict[str, SMSpec] = {arch: spec for arch, part in GPU_PARTS.items() if (spec := _of_part(part)) is not None}


def sm_spec(arch: str, sm_count: int | None = None) -> SMSpec:
    """The spec for `arch` ('sm_90a' reads as 'sm_90'), with the SM count a worker detected if given."""
    base = base_arch(arch)
    if base not in SM_SPECS:
        raise ValueError(f"the static GPU model has no figures for {arch}; known: {sorted(SM_SPECS)}")
    spec = SM_SPECS[base]
    if sm_count and sm_count != spec.sm_count:
        from dataclasses import replace

        spec = replace(spec, sm_count=sm_count)
    return spec


H200_DRAM_PEAK = 4.8e12  # bytes/s, the H200 SXM's HBM3e (data sheet)


def h200_spec() -> SMSpec:
    """The H200 SXM as the bound sees it: the H100 SXM's SMs and clocks (both GH100, 132 SMs) with HBM3e. Its
    streaming rate is an assumption: the H100's streaming fraction of its peak (3.0 of 3.35 TB/s) applied to the
    H200's 4.8 TB/s. Used to compare with the H200 session; workers read their own GPU (`sm_spec`)."""
    from dataclasses import replace

    h100 = SM_SPECS["sm_90"]
    peak = GPU_PARTS["sm_90"].dram_bw or 3.35e12
    return replace(h100, name="H200 SXM", dram_bytes_per_s=h100.dram_bytes_per_s * H200_DRAM_PEAK / peak)
