"""The per-SM time bound of a module at a given M: max(shared-memory, FFMA-issue, L1, MMA, DRAM, k-loop latency),
as a band.

Per kernel, the busiest SM runs ceil(grid / SMs) thread blocks (all resident at once or in waves — shared
memory serves one wavefront per clock either way); its shared-memory time is those blocks' wavefronts at
one per clock, its L1 time their global loads' 128-byte lines at one per clock, its FFMA time their FMAs at
`fp32_lanes` per clock. The DRAM term is every global byte the module touches once (X, W, Y, plus split-K
partial sums written and read back) at the streaming bandwidth, scaled up when the grid leaves the busiest
SM more than an even share of it (288 blocks on 132 SMs: the busiest runs 3, an even share is 2.18).
The band's slow end (`high_s`) is the phase model at the base clock, its fast end (`low_s`) the warp model
at the boost clock; on the H100 every measured uKernel time fell between the slow end −10 % and +17 %
(tests/tuning/gpu_model/test_h100_first_light.py), so `high_s` is the prediction the tuner ranks by.
Tensor-core kernels add a latency term (`kernel_latency_s`: their serial cp.async k-loop), fitted on the H200's
tensor-core points (docs/gpu_model.md says how; tests/tuning/gpu_model/test_h200_tensor_core.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.tuning.gpu_model.access import KernelAccess, ModuleAccess
from service.tuning.gpu_model.arch import SMSpec


@dataclass(frozen=True)
class Prediction:
    m: int
    grid: tuple[int, ...]  # thread blocks per kernel
    busiest_sm_blocks: tuple[int, ...]
    shared_s: tuple[float, float]  # (warp model at boost clock, phase model at base clock)
    conflict_free_s: float  # the same loads with ideal wavefronts, boost clock
    ffma_s: float
    dram_s: float
    launch_floor_s: float = 0.0  # per kernel launched (SMSpec.launch_floor_s)
    l1_s: float = 0.0  # the busiest SM's global loads in 128-byte L1 wavefronts, one per clock
    mma_s: float = 0.0  # the busiest SM's tensor-core FMAs at SMSpec.mma_fma_per_clock
    latency_s: float = 0.0  # tensor-core kernels: one block's serial pipelined k-loop (SMSpec.tc_copy_latency_s)

    @property
    def low_s(self) -> float:
        return max(self.shared_s[0], self.ffma_s, self.dram_s, self.l1_s, self.mma_s, self.latency_s)

    @property
    def high_s(self) -> float:
        return max(self.shared_s[1], self.ffma_s, self.dram_s, self.l1_s, self.mma_s, self.latency_s)

    @property
    def with_launch_s(self) -> float:
        """`high_s` plus each launched kernel's floor: the pessimistic figure for tiny problems, where the
        bound alone reaches the DRAM floor (the 20 measured points are fitted by `high_s`, not this)."""
        return self.high_s + self.launch_floor_s * len(self.grid)

    @property
    def bound(self) -> str:
        """Which term sets `high_s`: 'shared memory', 'FFMA issue' or 'DRAM'."""
        terms = {
            "shared memory": self.shared_s[1],
            "FFMA issue": self.ffma_s,
            "DRAM": self.dram_s,
            "L1": self.l1_s,
            "MMA": self.mma_s,
            "k-loop latency": self.latency_s,
        }
        return max(terms, key=lambda key: terms[key])

    def to_dict(self) -> dict[str, Any]:
        us = 1e6
        return {
            "m": self.m,
            "grid": list(self.grid),
            "busiest_sm_blocks": list(self.busiest_sm_blocks),
            "shared_us": [round(self.shared_s[0] * us, 2), round(self.shared_s[1] * us, 2)],
            "conflict_free_us": round(self.conflict_free_s * us, 2),
            "ffma_us": round(self.ffma_s * us, 2),
            "dram_us": round(self.dram_s * us, 2),
            "l1_us": round(self.l1_s * us, 2),
            "mma_us": round(self.mma_s * us, 2),
            "latency_us": round(self.latency_s * us, 2),
            "predicted_us": round(self.high_s * us, 2),
            "with_launch_us": round(self.with_launch_s * us, 2),
            "bound": self.bound,
        }


def predict(access: ModuleAccess, m: int, spec: SMSpec) -> Prediction:
    grids, busiest = [], []
    phase = warp = ideal = fma = lines = mma = latency = 0.0
    share = 1.0  # the busiest SM's share of the DRAM traffic over an even 1/SMs share
    for kernel in access.kernels:
        blocks = kernel.grid(m)
        on_busiest = -(-blocks // spec.sm_count)
        grids.append(blocks)
        busiest.append(on_busiest)
        p, w, i = kernel.wavefronts_per_block()
        phase += p * on_busiest
        warp += w * on_busiest
        ideal += i * on_busiest
        fma += kernel.fma_per_thread * kernel.threads * on_busiest
        lines += kernel.l1_lines_per_block() * on_busiest
        mma += kernel.mma_fma_per_thread * kernel.threads * on_busiest
        latency += kernel_latency_s(kernel, spec)
        if kernel.fma_per_thread or kernel.mma_fma_per_thread:  # the kernels that stream the operands set the share
            share = max(share, on_busiest * spec.sm_count / max(blocks, 1))
    per_clock = spec.shared_wavefronts_per_clock
    return Prediction(
        m=m,
        grid=tuple(grids),
        busiest_sm_blocks=tuple(busiest),
        shared_s=(warp / per_clock / spec.clock_max_hz, phase / per_clock / spec.clock_min_hz),
        conflict_free_s=ideal / per_clock / spec.clock_max_hz,
        ffma_s=fma / spec.fp32_lanes / spec.clock_min_hz,
        dram_s=access.dram_bytes(m) * share / spec.dram_bytes_per_s,
        launch_floor_s=spec.launch_floor_s,
        l1_s=lines / spec.clock_min_hz,
        mma_s=mma / spec.mma_fma_per_clock / spec.clock_min_hz,
        latency_s=latency,
    )


def kernel_latency_s(kernel: KernelAccess, spec: SMSpec) -> float:
    """A tensor-core kernel's serial k-loop: each of its k-steps (cp.async waits) costs the copy latency shared by
    the copy groups in flight plus a fixed step cost (SMSpec, fitted on the H200). Blocks resident together on an
    SM overlap their loops, so this is one block's time, not multiplied by the blocks per SM. On the H200 the
    tensor-core tiles took 13-27 µs on ffn_down (K = 3072) whatever T and grid, where every throughput term said
    3-12 µs: this is what they measured. SIMT kernels get none (their 20 H100 points are throughput-bound)."""
    if not kernel.mma_fma_per_thread or not kernel.async_waits:
        return 0.0
    return kernel.async_waits * (spec.tc_copy_latency_s / max(kernel.async_inflight, 1) + spec.tc_step_s)
