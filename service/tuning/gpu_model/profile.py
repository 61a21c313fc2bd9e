"""One kernel module, profiled statically: its accesses (from TIR), its resources and SASS (from nvcc), and
the bound at any M on an SM spec. What the GPU tuner ranks and gates candidates by, and what the report shows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from service.tuning.gpu_model.access import ModuleAccess, analyze
from service.tuning.gpu_model.arch import SMSpec, sm_spec
from service.tuning.gpu_model.bound import Prediction, predict
from service.tuning.gpu_model.cubin import KernelResources, compile_and_inspect


@dataclass(frozen=True)
class KernelProfile:
    label: str
    access: ModuleAccess
    resources: tuple[KernelResources, ...]  # empty when compiled=False (no nvcc run)
    spec: SMSpec

    def predict(self, m: int) -> Prediction:
        return predict(self.access, m, self.spec)

    def to_dict(self, ms: Iterable[int] = ()) -> dict[str, Any]:
        ms = list(ms)
        return {
            "label": self.label,
            "sm": self.spec.name,
            "access": self.access.to_dict(ms[0] if ms else 1),
            "resources": [r.to_dict() for r in self.resources],
            "predictions": [self.predict(m).to_dict() for m in ms],
        }


def profile_module(
    label: str,
    mod: Any,
    target: Mapping[str, Any],
    config: Mapping[str, object],
    source: str | None = None,
    sm_count: int | None = None,
) -> KernelProfile:
    """Profile a scheduled module; `source` (its generated CUDA) adds ptxas resources and the SASS mix."""
    arch = str(target["arch"])
    resources = tuple(compile_and_inspect(source, arch)) if source is not None else ()
    return KernelProfile(label, analyze(mod, target, config), resources, sm_spec(arch, sm_count))
