"""Before any GPU time is spent: uKernels are chosen, gated and ordered by the static GPU model.

The GPU rules' analytic estimate cannot see shared memory, so it only prefilters: per representative M they
give a wide pool (`POOL_PER_M` tiles, at most `POOL_PER_BM` per bm). Every tile of the pool is predicted by the
model from its lowered TIR (service.tuning.gpu_model; bound + launch floor at that M), and in predicted order
tiles are compiled (ptxas, SASS) and gated until `per_m` of distinct bm pass; the ones the gate rejects on the
way are kept with their reasons for the job's record (never built on the GPU). For small T the best predicted
GEMV-family kernel that passes the gate joins them (pipeline/gemv.py). The measurement still decides.

float16 / bfloat16 on sm_80+: the pool per M ≥ TENSOR_CORE_MIN_M is the tensor-core tiles instead
(pipeline/tensorcore.py: `tensorcore_candidates`, with K splits where N·M blocks leave SMs idle), ranked,
compiled and gated the same way; below it the GEMV family alone serves.
float32 never gets them: TF32 mma would change the numerics (an explicit opt-in, not built).

Lowering costs ~0.07 s per tile, compiling ~1 s; without nvcc/cuobjdump (no `cuda-build`/`sass` extras) the
gate judges shared loads alone and says so. An arch the model has no figures for keeps the rules' order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.tuning.builder.cuda import pass_config, supports_async_copy
from service.tuning.gpu_model import gate
from service.tuning.gpu_model.access import analyze
from service.tuning.gpu_model.arch import SMSpec, sm_spec
from service.tuning.gpu_model.bound import predict
from service.tuning.gpu_model.cubin import compile_and_inspect, have_tools
from service.tuning.gpu_model.profile import KernelProfile
from service.tuning.hardware_model import HardwareModel
from service.tuning.tuners.pipeline.gemv import LOAD_BYTES, GemvTile, gemv_candidates
from service.tuning.tuners.pipeline.schedule import cuda_source
from service.tuning.tuners.pipeline.tensorcore import DTYPES as TENSOR_CORE_DTYPES
from service.tuning.tuners.pipeline.tensorcore import TensorCoreTile, tensorcore_candidates
from service.tuning.tuners.ukernel.gpu_kernels import UKernelTile, build_module, scheduled_module, tile_record
from service.tuning.tuners.ukernel.gpu_rules import GPURuleLimits, GPUTileCandidate, gpu_candidates

POOL_PER_M = 64
POOL_PER_BM = 16
MAX_CHECKS_PER_M = 8  # compiles spent per representative M looking for per_m passing tiles
GEMV_MAX_ROWS = 16  # representative M up to which the GEMV family is proposed
# representative M from which tensor-core tiles are ranked: below it an m16 mma fragment is at most half rows,
# and on the H200 the fp16 GEMV beat every tensor-core tile at each T <= 8 (bench/results/gpu-h200-2026-11-27/)
TENSOR_CORE_MIN_M = 16


@dataclass(frozen=True)
class Screened:
    tile: UKernelTile
    representative_m: int  # the M it was chosen at
    score: float  # the rules' analytic score (0 for GEMV tiles, which the rules do not propose)
    reasons: tuple[str, ...]  # why it was proposed
    predicted_s: float | None  # bound + launch floor at the representative M (None: not modelled)
    verdict: gate.Verdict
    model: dict[str, Any]  # the prediction and ptxas resources, for the job's candidate record

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def to_record(self) -> dict[str, Any]:
        """The job's candidate record: the tile, why it was proposed, the model's prediction and the gate."""
        record = {
            "id": self.tile.label(),
            "gemm_tile": tile_record(self.tile),
            "score": self.score,
            "reasons": list(self.reasons),
            "model": self.model,  # static prediction at the representative M, ptxas resources
            "gate": list(self.verdict.reasons),
        }
        if not self.passed:  # never built on the GPU
            record["error"] = "rejected by the static GPU model's gate before timing"
        return record


class _Profiles:
    """Per tile, lowered once and compiled at most once."""

    def __init__(self, n: int, k: int, target: Mapping[str, Any], spec: SMSpec, dtype: str) -> None:
        self.n, self.k, self.target, self.spec, self.dtype = n, k, dict(target), spec, dtype
        self.arch = str(target["arch"])
        self.compiled = have_tools()
        self.lowered: dict[UKernelTile, KernelProfile] = {}
        self.checked: dict[UKernelTile, KernelProfile] = {}

    def lowered_profile(self, tile: UKernelTile) -> KernelProfile:
        if tile not in self.lowered:
            access = analyze(scheduled_module(tile, self.n, self.k, self.dtype), self.target, pass_config(self.arch))
            self.lowered[tile] = KernelProfile(tile.label(), access, (), self.spec)
        return self.lowered[tile]

    def checked_profile(self, tile: UKernelTile) -> KernelProfile:
        if tile not in self.checked:
            profile = self.lowered_profile(tile)
            if self.compiled:
                source = cuda_source(build_module(tile, self.n, self.k, self.target, self.dtype))
                profile = KernelProfile(
                    profile.label, profile.access, tuple(compile_and_inspect(source, self.arch)), self.spec
                )
            self.checked[tile] = profile
        return self.checked[tile]

    def predicted_s(self, tile: UKernelTile, m: int) -> float:
        """Bound + launch floor at M; infinite for a tile TVM cannot schedule or lower (ranked last, then
        recorded by `screened` with the error, as the tuner records a tile the compiler rejects)."""
        try:
            return predict(self.lowered_profile(tile).access, max(m, 1), self.spec).with_launch_s
        except Exception:  # any schedule or lowering failure: the tile is not a candidate
            return float("inf")

    def screened(self, cand: GPUTileCandidate | _GemvProposal | _TensorCoreProposal) -> Screened:
        try:
            profile = self.checked_profile(cand.tile)
        except Exception as exc:  # TVM or nvcc rejected it: gated, with the reason
            failed = gate.Verdict(False, (f"build FAIL: {type(exc).__name__}: {str(exc)[:300]}",))
            return Screened(cand.tile, cand.representative_m, cand.score, cand.reasons, None, failed, {})
        verdict = gate.check(profile)
        if not self.compiled:
            verdict = gate.Verdict(verdict.passed, (*verdict.reasons, "ptxas not run: no nvcc/cuobjdump on this host"))
        predicted = profile.predict(max(cand.representative_m, 1))
        model = {"predicted": predicted.to_dict(), "resources": [r.to_dict() for r in profile.resources]}
        m = cand.representative_m
        return Screened(cand.tile, m, cand.score, cand.reasons, predicted.with_launch_s, verdict, model)


def model_ukernels(
    hw: HardwareModel,
    n: int,
    k: int,
    representative_ms: Sequence[int],
    target: Mapping[str, Any],
    dtype: str = "float32",
    per_m: int = 2,
    limits: GPURuleLimits | None = None,
) -> list[Screened]:
    """Passing uKernels first (fastest predicted at their M first), then the gated ones met on the way."""
    try:
        spec = sm_spec(str(target["arch"]), hw.sm_count)
    except ValueError as exc:  # no SM figures: the rules' order, unmodelled
        from service.tuning.tuners.ukernel.gpu_rules import gpu_ukernels

        note = gate.Verdict(True, (f"not modelled: {exc}",))
        return [
            Screened(c.tile, c.representative_m, c.score, c.reasons, None, note, {})
            for c in gpu_ukernels(hw, n, k, representative_ms, dtype, per_m, limits)
        ]
    profiles = _Profiles(n, k, target, spec, dtype)
    passed: dict[UKernelTile, Screened] = {}
    gated: dict[UKernelTile, Screened] = {}
    tensor_cores = dtype in TENSOR_CORE_DTYPES and supports_async_copy(str(target["arch"]))
    for m in representative_ms:
        pool: Sequence[GPUTileCandidate | _TensorCoreProposal]
        if tensor_cores:
            fits = m >= TENSOR_CORE_MIN_M
            pool = [_TensorCoreProposal(t, m) for t in tensorcore_candidates(n, k, m, spec.sm_count, dtype) if fits]
        else:
            pool = gpu_candidates(hw, n, k, m, dtype, top_k=POOL_PER_M, limits=limits, per_bm=POOL_PER_BM)
        ranked = sorted(pool, key=lambda c: (profiles.predicted_s(c.tile, m), c.tile.label()))
        kept_bm: set[int] = set()
        checks = 0
        for cand in ranked:
            if len(kept_bm) >= per_m or checks >= MAX_CHECKS_PER_M:
                break
            if cand.tile.bm in kept_bm:
                continue
            checks += cand.tile not in profiles.checked
            result = profiles.screened(cand)
            if result.passed:
                kept_bm.add(cand.tile.bm)
                passed.setdefault(cand.tile, result)
            else:
                gated.setdefault(cand.tile, result)
    small = [m for m in representative_ms if m <= GEMV_MAX_ROWS]
    if small:  # the GEMV family for small T: the best predicted at the smallest M that passes the gate
        m = min(small)
        family = [_GemvProposal(tile, m) for tile in gemv_candidates(n, k, dtype)]
        # among ties (to 10 ns: the DRAM-bound ones) 16-byte W loads first: on the H200 the fp16 default took 3.5 µs
        # at qkv T = 1 where dlight's 8-byte-load tile, predicted the same, took 4.7 (fp32's are all 16 bytes)
        family.sort(
            key=lambda c: (
                round(profiles.predicted_s(c.tile, m), 8),
                c.tile.load_bytes(dtype) < LOAD_BYTES,
                c.tile.label(),
            )
        )
        for proposal in family[:MAX_CHECKS_PER_M]:
            result = profiles.screened(proposal)
            (passed if result.passed else gated).setdefault(proposal.tile, result)
            if result.passed:
                break
    order = sorted(passed.values(), key=lambda s: (s.representative_m, s.predicted_s or 0.0))
    return [*order, *gated.values()]


@dataclass(frozen=True)
class _GemvProposal:
    tile: GemvTile
    representative_m: int
    score: float = 0.0

    @property
    def reasons(self) -> tuple[str, ...]:
        return (f"GEMV family (T ≤ {self.tile.max_rows}): W streamed into registers, warp-shuffle reductions",)


@dataclass(frozen=True)
class _TensorCoreProposal:
    tile: TensorCoreTile
    representative_m: int
    score: float = 0.0

    @property
    def reasons(self) -> tuple[str, ...]:
        split = f", K split {self.tile.split_k} ways over blockIdx.z" if self.tile.split_k > 1 else ""
        return (f"tensor cores: mma.sync m16n8k16, fp32 accumulate, {self.tile.stages}-stage cp.async{split}",)
