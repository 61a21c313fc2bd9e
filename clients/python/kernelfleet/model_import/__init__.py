"""Onboard a model: extract its GEMM-like operators as KernelFleet workloads, on the client.

`extract_torch(module, example_inputs, dynamic_shapes)` (torch.export) and `extract_onnx(path_or_model)` (the
`onnx` package) parse the model here, never on the service; `ModelGraph.to_workloads()` gives the workload bodies
and `ModelGraph.distribution_for(op, histogram=...)` each one's shape distribution from the model's traffic.
torch and onnx load only when their extractor is called (`pip install 'kernelfleet[models]'`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernelfleet.model_import.expr import Mono
from kernelfleet.model_import.graph import ExtractedOp, ModelGraph, ModelImportError, UnsupportedOp

if TYPE_CHECKING:
    from kernelfleet.model_import.onnx_import import extract_onnx
    from kernelfleet.model_import.torch_export import extract_torch

__all__ = ["ExtractedOp", "ModelGraph", "ModelImportError", "Mono", "UnsupportedOp", "extract_onnx", "extract_torch"]


def __getattr__(name: str) -> Any:
    if name == "extract_torch":
        from kernelfleet.model_import.torch_export import extract_torch

        return extract_torch
    if name == "extract_onnx":
        from kernelfleet.model_import.onnx_import import extract_onnx

        return extract_onnx
    raise AttributeError(f"module 'kernelfleet.model_import' has no attribute {name!r}")
