"""Every tuner by name. Each entry imports its tuner only when asked (a tuner pulls in TVM, CUDA or the
Gemmini model), and its return type is where mypy checks that the tuner implements `base.Tuner` with its
own task, sink and outcome."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from service.tuning.tuners.base import StopSignal, Tuner

if TYPE_CHECKING:
    from service.tuning.tuners.gemmini.search import SearchResult
    from service.tuning.tuners.gemmini.tuner import BacoTask
    from service.tuning.tuners.pipeline.tuner import PipelineOutcome, PipelineSink, PipelineTask
    from service.tuning.tuners.sketch import CandidateSink, SketchOutcome, SketchTask
    from service.tuning.tuners.ukernel.bmm_tuner import BmmRangeOutcome, BmmRangeTask
    from service.tuning.tuners.ukernel.tuner import RangeOutcome, RangeSink, RangeTask


def _sketch() -> type[Tuner[SketchTask, CandidateSink, SketchOutcome]]:
    from service.tuning.tuners.sketch import SketchTuner

    return SketchTuner


def _ukernel() -> type[Tuner[RangeTask, RangeSink, RangeOutcome]]:
    from service.tuning.tuners.ukernel.tuner import UKernelTuner

    return UKernelTuner


def _ukernel_cuda() -> type[Tuner[RangeTask, RangeSink, RangeOutcome]]:
    from service.tuning.tuners.ukernel.gpu_tuner import GPUUKernelTuner

    return GPUUKernelTuner


def _ukernel_bmm() -> type[Tuner[BmmRangeTask, StopSignal, BmmRangeOutcome]]:
    from service.tuning.tuners.ukernel.bmm_tuner import BmmUKernelTuner

    return BmmUKernelTuner


def _pipeline() -> type[Tuner[PipelineTask, PipelineSink, PipelineOutcome]]:
    from service.tuning.tuners.pipeline.tuner import PipelineTuner

    return PipelineTuner


def _gemmini_baco() -> type[Tuner[BacoTask, StopSignal, SearchResult]]:
    from service.tuning.tuners.gemmini.tuner import BacoTuner

    return BacoTuner


TUNERS: Mapping[str, Callable[[], type[Tuner[Any, Any, Any]]]] = {
    "sketch": _sketch,
    "ukernel": _ukernel,
    "ukernel-cuda": _ukernel_cuda,
    "ukernel-bmm": _ukernel_bmm,
    "pipeline": _pipeline,
    "gemmini-baco": _gemmini_baco,
}


def tuner_class(name: str) -> type[Tuner[Any, Any, Any]]:
    """The tuner registered as `name`; KeyError names the registered ones."""
    try:
        load = TUNERS[name]
    except KeyError:
        raise KeyError(f"no tuner {name!r}; registered: {', '.join(sorted(TUNERS))}") from None
    return load()
