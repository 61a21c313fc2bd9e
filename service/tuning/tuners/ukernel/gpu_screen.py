"""Before any GPU time is spent: every proposed uKernel is profiled by the static GPU model, the ones the gate
rejects are recorded and dropped, and the rest are ranked by the model's predicted time at their
representative M (service.tuning.gpu_model). This replaces the rules' shared-memory-blind estimate as the
order candidates are measured in; the measurement still decides.

Profiling lowers each tile through TVM (~0.1 s); ptxas resources and the SASS mix are added where nvcc and
cuobjdump are installed (`cuda-build` extra), else the gate judges shared loads alone and says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from service.tuning.gpu_model import gate
from service.tuning.gpu_model.cubin import have_tools
from service.tuning.gpu_model.profile import profile_gemm_tile
from service.tuning.tuners.ukernel.gpu_rules import GPUTileCandidate


@dataclass(frozen=True)
class Screened:
    candidate: GPUTileCandidate
    predicted_s: float | None  # the model's bound at the representative M (None: not modelled)
    verdict: gate.Verdict
    model: dict[str, Any]  # the prediction and resources, for the job's candidate record

    @property
    def passed(self) -> bool:
        return self.verdict.passed


def screen(
    proposals: Sequence[GPUTileCandidate],
    n: int,
    k: int,
    target: Mapping[str, Any],
    sm_count: int | None = None,
    dtype: str = "float32",
) -> list[Screened]:
    """Every proposal profiled and gated; passed ones first, fastest predicted first. A target the model has
    no figures for (an unknown arch) keeps the rules' order, every candidate passed and marked unmodelled."""
    compiled = have_tools()
    out: list[Screened] = []
    for cand in proposals:
        try:
            profile = profile_gemm_tile(cand.tile, n, k, target, dtype, compiled=compiled, sm_count=sm_count)
        except ValueError as exc:  # no SM figures for this arch
            out.append(Screened(cand, None, gate.Verdict(True, (f"not modelled: {exc}",)), {}))
            continue
        verdict = gate.check(profile)
        if not compiled:
            verdict = gate.Verdict(verdict.passed, (*verdict.reasons, "ptxas not run: no nvcc/cuobjdump on this host"))
        predicted = profile.predict(max(cand.representative_m, 1))
        model = {"predicted": predicted.to_dict(), "resources": [r.to_dict() for r in profile.resources]}
        out.append(Screened(cand, predicted.high_s, verdict, model))
    return sorted(out, key=lambda s: (not s.passed, s.predicted_s if s.predicted_s is not None else float("inf")))
