"""The `ukernel` tuner on a CUDA GPU: FTuner's GPU rules → pipelined uKernels over a symbolic M → DP table.

  1. the GPU rules (gpu_rules) propose thread-block tiles for a few representative M, no search;
  2. each tile is compiled once over a symbolic M (pipeline/schedule.py, the pad_einsum recipe that ran
     on an H100) and its software-pipeline depth is searched on the GPU: 1..4 stages, async copies
     where the arch has them (worth 1.3–1.9× on the H100, with the best depth differing by shape,
     ../shared/research/gpu.md §3.1);
  3. each uKernel at its best depth is timed at a few M, the existing DP (combine) picks per S which
     uKernels run which rows, every S the uKernels do not win against cuBLAS (kernel-only plus each side's
     host cost, paired rounds, the route_stats rule: gpu_routes) is routed to cuBLAS, and the table plus
     content-addressed libraries (device code embedded; the sha256 of that device code, as nvcc returned it
     to TVM, recorded in the spec) are what the job publishes;
  4. the heaviest shapes are re-measured with every uKernel alone and with the chosen program as a
     GPU host runs it (kernelfleet.cuda_ukernel.CudaDispatcher, device tensors, synchronised).

Needs a GPU for steps 2–4 (timing); building and nvcc run anywhere (tests/tuning/gpu/test_codegen.py).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelfleet.cuda_ukernel import CudaDispatcher, CudaUKernel, CudaUKernelSpec, load_cuda_ukernel, require_cuda
from service.tuning.builder.cuda import supports_async_copy
from service.tuning.hardware_model import HardwareModel
from service.tuning.isolation import IsolatedRunner
from service.tuning.tuners.base import TuningStopped
from service.tuning.tuners.pipeline.schedule import GemmTile
from service.tuning.tuners.ukernel.bounds import MAX_UKERNELS
from service.tuning.tuners.ukernel.combine import TileCost, combine, dispatch_table, sample_ms
from service.tuning.tuners.ukernel.gpu_build import BuiltLibrary, build_libraries, time_library
from service.tuning.tuners.ukernel.gpu_kernels import UKernelTile, rows_per_piece, tile_record
from service.tuning.tuners.ukernel.gpu_routes import (
    GpuRouteDecision,
    GpuTimers,
    decide_gpu_routes,
    host_cost_shapes,
    not_routed_record,
)
from service.tuning.tuners.ukernel.gpu_rules import GPURuleLimits
from service.tuning.tuners.ukernel.gpu_screen import model_ukernels
from service.tuning.tuners.ukernel.tuner import NOISE_TIE, RangeOutcome, RangeSink, RangeTask
from service.tuning.tuners.ukernel.vendor_routes import vendor_sweep_shapes


def depth_candidates(
    tile: GemmTile, N: int, K: int, arch: str, hw: HardwareModel, max_stages: int = 4, dtype: str = "float32"
) -> list[GemmTile]:
    """The pipeline depths worth timing for a tile: 1..max_stages that fit shared memory and K's k-steps."""
    out = []
    for stages in range(1, max_stages + 1):
        cand = dataclasses.replace(tile, stages=stages, async_copy=stages > 1 and supports_async_copy(arch))
        if cand.problem(N, K) is None and cand.smem_bytes(dtype) <= hw.smem_per_block:
            out.append(cand)
    return out or [tile]


def gpu_hardware(task: RangeTask) -> HardwareModel:
    """The job target's GPU: its detected details (SM count, limits, L2) over the arch's table row."""
    if task.hardware is not None:
        return task.hardware
    details = task.target.details
    base = HardwareModel.for_gpu(str(task.target.arch))
    sms = int(details.get("sm_count", base.sm_count))
    return base.overridden(
        cores=sms,
        sm_count=sms,
        l2_bytes=int(details.get("l2_bytes", base.l2_bytes)),
        smem_per_block=int(details.get("smem_per_block", base.smem_per_block)),
    )


@dataclasses.dataclass(frozen=True)
class DenseRange:
    """One GPU ukernel run: dense Y[M, N] = X[M, K]·W[N, K]ᵀ for M = 1..s_max on `target` (a TVM dict), X, W and
    Y in `dtype` (fp32 sums)."""

    N: int
    K: int
    s_max: int
    validate: tuple[int, ...]
    target: Mapping[str, Any]
    hardware: HardwareModel
    work_dir: Path
    max_ukernels: int = MAX_UKERNELS
    representative_m: int = 64
    measure_points: int = 5
    vendor_routes: bool = True  # route every S where cuBLAS is faster to cuBLAS
    measure_timeout_s: float = 60.0  # one candidate's build + timing in the measuring child, then it is killed
    dtype: str = "float32"


class GPUUKernelTuner:
    name = "ukernel-cuda"

    def tune(self, task: RangeTask, sink: RangeSink) -> RangeOutcome:
        from service.tuning.platforms import tvm_target  # here: GPU hosts import this module without pydantic

        attrs = task.workload.attrs
        if attrs.get("bias") or attrs.get("activation", "none") != "none":  # the ukernel kind refuses these
            raise ValueError("CPU targets fuse bias and activation; CUDA uKernels do not yet")
        return self.tune_dense(
            DenseRange(
                N=task.workload.dims["N"],
                K=task.workload.dims["K"],
                s_max=task.s_max,
                validate=tuple(task.validate),
                target=tvm_target(task.target),
                hardware=gpu_hardware(task),
                work_dir=task.work_dir,
                max_ukernels=task.max_ukernels,
                representative_m=task.representative_m,
                measure_points=task.measure_points,
                vendor_routes=task.vendor_routes,
                measure_timeout_s=task.measure_timeout_s,
                dtype=task.workload.dtype,
            ),
            sink,
        )

    def tune_dense(self, job: DenseRange, sink: RangeSink) -> RangeOutcome:
        """The whole run on plain values (no pydantic models): what the job and the GPU benchmark both call."""
        began = time.perf_counter()
        require_cuda()  # timing needs the GPU; a CPU host never gets here (queue routing + mismatch)
        N, K, hw, target = job.N, job.K, job.hardware, job.target
        arch = str(target["arch"])
        reps = sorted({1, 16, max(1, job.representative_m), job.s_max})
        # proposals chosen, gated and ordered by the static GPU model (gpu_screen), at most per_m per M
        screened = model_ukernels(hw, N, K, reps, target, dtype=job.dtype, limits=GPURuleLimits())
        if not screened:
            raise ValueError(f"no uKernel tile passes the GPU rules for N={N}, K={K} on {hw.name}")
        gated = [s for s in screened if not s.passed]
        screened = [s for s in screened if s.passed][: min(job.max_ukernels, MAX_UKERNELS)]
        if not screened:
            raise ValueError(f"every uKernel tile fails the static model's gate: {[s.verdict.reasons for s in gated]}")
        kernels: dict[str, CudaUKernel] = {}
        artifacts: dict[str, Any] = {}
        costs: list[TileCost] = []
        candidates: list[dict[str, Any]] = []
        errors = 0
        # every candidate is built and timed in a child process: a hung kernel is killed after the timeout and a
        # faulting one takes only the child's CUDA context with it (service.tuning.isolation)
        runner = IsolatedRunner(job.measure_timeout_s)
        # every variant to time (each proposal at each feasible depth) built at once, in parallel processes
        variants = {c.tile.label(): self._variants(c.tile, N, K, arch, hw, job.dtype) for c in screened}
        every_variant = [v for vs in variants.values() for v in vs]
        built = build_libraries(every_variant, N, K, target, job.work_dir / "artifacts", dtype=job.dtype)
        for cand in screened:
            if sink.should_stop():
                runner.close()
                raise TuningStopped("stopped by the job")
            uid = cand.tile.label()
            record = cand.to_record()
            candidates.append(record)
            try:
                chosen, depths = self._best_depth(runner, variants[cand.tile.label()], built, hw, cand.representative_m)
                record["depths_s"] = depths
                uid = chosen.label()  # the label now names the chosen depth
                record["id"] = uid
                record["gemm_tile"] = tile_record(chosen)
                if isinstance(chosen, GemmTile):  # [bm, bn, bk, tm, tn, stages, split_k], like the CPU's [mt, nt, kt]
                    record["tile"] = [
                        chosen.bm,
                        chosen.bn,
                        chosen.bk,
                        chosen.tm,
                        chosen.tn,
                        chosen.stages,
                        chosen.split_k,
                    ]
                rows = rows_per_piece(chosen)
                points = sample_ms(rows, job.s_max, job.measure_points)
                path, spec = built[uid].require()
                seconds = runner.run(time_library, str(path), spec.to_dict(), points, hw.l2_bytes)
                cost = TileCost.from_measurements(uid, rows, dict(zip(points, seconds, strict=True)))
                kernel = load_cuda_ukernel(path, spec, built[uid].sha256)  # what is dispatched
            except Exception as exc:  # a tile the compiler or the GPU rejects is recorded, the others go on
                errors += 1
                record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                sink.on_ukernel(record)
                continue
            record["measured"] = {str(t * kernel.spec.mt): s for t, s in zip(cost.tiles, cost.seconds, strict=True)}
            sink.on_ukernel(record)
            if uid in kernels:  # two proposals converged on the same tile and depth
                continue
            kernels[uid] = kernel
            costs.append(cost)
            artifacts[uid] = _Artifact(path, built[uid].sha256, kernel.spec)  # the file built and timed
        runner.close()
        candidates += [s.to_record() for s in gated]
        if not costs:
            raise RuntimeError(f"all {len(screened)} uKernels failed to build or run")
        overhead = self._piece_overhead(kernels, N, K)
        programs = combine(costs, job.s_max, piece_overhead_s=overhead, rel_tie=NOISE_TIE)
        used = {p.ukernel_id for prog in programs for p in prog.pieces}
        costs = [c for c in costs if c.ukernel_id in used]
        kernels = {u: k for u, k in kernels.items() if u in used}
        artifacts = {u: a for u, a in artifacts.items() if u in used}
        programs = combine(costs, job.s_max, piece_overhead_s=overhead, rel_tie=NOISE_TIE)
        # the tuned programs against cuBLAS (kernel-only + host cost, paired rounds); cuBLAS keeps every S the
        # uKernels do not win by the route rule (gpu_routes, docs/routes.md)
        tuned_table = dispatch_table(programs)
        tuned = CudaDispatcher(tuned_table, kernels, N=N, K=K)
        routes = self._vendor_sweep(tuned, N, K, job, sink, [p.cost for p in programs])
        vendor = routes.vendor if routes is not None else frozenset()
        table = dispatch_table(programs, vendor)
        artifacts = {u: a for u, a in artifacts.items() if u in table.mts}  # published: what the table uses
        dispatcher = CudaDispatcher(table, {u: k for u, k in kernels.items() if u in table.mts}, N=N, K=K)
        shapes: dict[str, Any] = {}
        l2 = hw.l2_bytes
        for S in job.validate:
            if sink.should_stop():
                raise TuningStopped("stopped by the job")
            alone = {u: k.time(S, repeat=3, l2_bytes=l2) for u, k in kernels.items()}  # every uKernel the DP used
            shapes[str(S)] = {
                "measured_s": alone,
                "chosen": [[p.ukernel_id, p.rows] for p in dispatcher.program(S)],
                "chosen_measured_s": dispatcher.time_called(S, l2_bytes=l2),
                "chosen_predicted_s": programs[S - 1].cost,
            }
            sink.on_validated(S, len(alone) + 1)
        validation: dict[str, Any] = {
            "shapes": shapes,
            "piece_overhead_s": overhead,
            "platform": "cuda",
            "tuned_table": tuned_table.to_dict(),  # before routing: every S on our uKernels
            # every paired round of every timed S, both host costs, the rule and the re-timed S (gpu_routes)
            "vendor_routes": routes.record(table)
            if routes is not None
            else not_routed_record("routing off, or no torch with CUDA to time cuBLAS"),
        }
        return RangeOutcome(
            table=table,
            kernels=kernels,  # every uKernel of the tuned table (validation["tuned_table"]), routed or not
            artifacts=artifacts,
            predicted_s=[p.cost for p in programs],
            measured_s={int(s): v["chosen_measured_s"] for s, v in shapes.items()},
            validation=validation,
            candidates=candidates,
            errors=errors,
            seconds=time.perf_counter() - began,
            hardware=hw.to_dict(),
            dispatcher=dispatcher,
        )

    @staticmethod
    def _variants(
        tile: UKernelTile, N: int, K: int, arch: str, hw: HardwareModel, dtype: str = "float32"
    ) -> list[UKernelTile]:
        """What ALCOP's depth question times for a proposal: every feasible depth of a GEMM tile; a GEMV kernel
        (no shared-memory pipeline) or a tensor-core tile (its depth is part of the screened tile) as it is."""
        if isinstance(tile, GemmTile):
            return list(depth_candidates(tile, N, K, arch, hw, dtype=dtype))
        return [tile]

    @staticmethod
    def _best_depth(
        runner: IsolatedRunner,
        variants: Sequence[UKernelTile],
        built: Mapping[str, BuiltLibrary],
        hw: HardwareModel,
        m: int,
    ) -> tuple[UKernelTile, dict[str, float | str]]:
        """ALCOP's question per uKernel: time every built depth at the representative M in the measuring child
        (a depth that failed to build, hangs or faults is recorded and skipped). The depth is chosen on repeated
        medians: each time is the median of 5 rounds of at least 50 ms, L2 flushed before each launch. A GEMV
        kernel or a tensor-core tile has one variant and is returned as it is, untimed here."""
        if len(variants) == 1 and not isinstance(variants[0], GemmTile):
            return variants[0], {}
        best: tuple[float, UKernelTile] | None = None
        timings: dict[str, float | str] = {}
        for cand in variants:
            assert isinstance(cand, GemmTile)
            name = f"{cand.stages}{'a' if cand.async_copy else ''}"
            try:
                path, spec = built[cand.label()].require()
                (seconds,) = runner.run(time_library, str(path), spec.to_dict(), [max(m, 1)], hw.l2_bytes)
            except Exception as exc:
                timings[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
                continue
            timings[name] = seconds
            if best is None or seconds < best[0]:
                best = (seconds, cand)
        if best is None:
            raise RuntimeError(f"every pipeline depth of {variants[0].label()} failed: {timings}")
        return best[1], timings

    @staticmethod
    def _vendor_sweep(
        tuned: CudaDispatcher, N: int, K: int, job: DenseRange, sink: RangeSink, predicted: Sequence[float]
    ) -> GpuRouteDecision | None:
        """Which S go to cuBLAS (gpu_routes): ours and cuBLAS in paired rounds of kernel-only times (both replayed
        from CUDA graphs), each side's host cost (called minus graph time, as a torch host calls it) added, W
        rotating through copies larger than the L2 on both sides; the route_stats rule decides, route boundaries
        re-timed. None when routing is off or torch is missing (the table then serves every S with our uKernels)."""
        from service.tuning import cublas

        if not job.vendor_routes:
            return None
        try:
            cublas.torch_cuda()
        except RuntimeError:
            return None
        assert tuned.table is not None
        l2 = job.hardware.l2_bytes
        timers = GpuTimers(
            ours_graph=lambda S: tuned.time_graph(S, l2_bytes=l2),
            cublas_graph=lambda S: cublas.time_linear(S, N, K, job.dtype, l2_bytes=l2),
            ours_called=lambda S: tuned.time_called(S, calls=20, l2_bytes=l2),
            cublas_called=lambda S: cublas.time_linear_called(S, N, K, job.dtype, l2_bytes=l2),
        )

        def check() -> None:
            if sink.should_stop():
                raise TuningStopped("stopped by the job")

        shapes = vendor_sweep_shapes(tuned.table, job.validate)
        host_shapes = host_cost_shapes(tuned.table)
        return decide_gpu_routes(job.s_max, predicted, timers, shapes, host_shapes, must=job.validate, check=check)

    @staticmethod
    def _piece_overhead(kernels: Mapping[str, CudaUKernel], N: int, K: int) -> float:
        """What one more piece costs beyond its kernel: a launch plus the Python and DLPack work around it."""
        samples = []
        for kernel in kernels.values():
            one = CudaDispatcher(_single_table(kernel), {"k": kernel}, N=N, K=K)
            samples.append(one.overhead(S=kernel.spec.mt))
        return statistics.median(samples)


@dataclasses.dataclass(frozen=True)
class _Artifact:
    """What the ukernel job publishes per uKernel (same fields as kernel.UKernelArtifact)."""

    path: Any
    sha256: str
    spec: CudaUKernelSpec


def _single_table(kernel: CudaUKernel) -> Any:
    from kernelfleet.dispatch import DispatchTable, Interval, Shape

    return DispatchTable((Interval(1, kernel.spec.mt, Shape((), "k")),), {"k": kernel.spec.mt})
