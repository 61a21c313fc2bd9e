"""Every tuner by name, in the project's one registry mechanism (service/registry.py), which holds one instance of
each, as it does for job kinds and platforms: each built-in is imported only when asked (a tuner pulls in TVM, CUDA
or the Gemmini model), and deployments may register more as plugins.

The block under TYPE_CHECKING is where mypy checks that each built-in implements `base.Tuner` with its own task,
sink and outcome (a registry of classes cannot carry those types itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.registry import Registry
from service.tuning.tuners.base import StopSignal, Tuner

TUNERS: Registry[Tuner[Any, Any, Any]] = Registry(
    "tuner",
    {
        "sketch": "service.tuning.tuners.sketch:SketchTuner",
        "ukernel": "service.tuning.tuners.ukernel.tuner:UKernelTuner",
        "ukernel-cuda": "service.tuning.tuners.ukernel.gpu_tuner:GPUUKernelTuner",
        "ukernel-bmm": "service.tuning.tuners.ukernel.bmm_tuner:BmmUKernelTuner",
        "pipeline": "service.tuning.tuners.pipeline.tuner:PipelineTuner",
        "gemmini-baco": "service.tuning.tuners.gemmini.tuner:BacoTuner",
    },
)

if TYPE_CHECKING:
    from service.tuning.tuners.gemmini.search import SearchResult
    from service.tuning.tuners.gemmini.tuner import BacoTask, BacoTuner
    from service.tuning.tuners.pipeline.tuner import PipelineOutcome, PipelineSink, PipelineTask, PipelineTuner
    from service.tuning.tuners.sketch import CandidateSink, SketchOutcome, SketchTask, SketchTuner
    from service.tuning.tuners.ukernel.bmm_tuner import BmmRangeOutcome, BmmRangeTask, BmmUKernelTuner
    from service.tuning.tuners.ukernel.gpu_tuner import GPUUKernelTuner
    from service.tuning.tuners.ukernel.tuner import RangeOutcome, RangeSink, RangeTask, UKernelTuner

    _sketch: type[Tuner[SketchTask, CandidateSink, SketchOutcome]] = SketchTuner
    _ukernel: type[Tuner[RangeTask, RangeSink, RangeOutcome]] = UKernelTuner
    _ukernel_cuda: type[Tuner[RangeTask, RangeSink, RangeOutcome]] = GPUUKernelTuner
    _ukernel_bmm: type[Tuner[BmmRangeTask, StopSignal, BmmRangeOutcome]] = BmmUKernelTuner
    _pipeline: type[Tuner[PipelineTask, PipelineSink, PipelineOutcome]] = PipelineTuner
    _gemmini_baco: type[Tuner[BacoTask, StopSignal, SearchResult]] = BacoTuner
