"""From the service's workloads to Gemmini layers, and the thesis shapes the benchmark and tests use."""

from __future__ import annotations

from collections.abc import Mapping

from service.models import WorkloadSpec
from service.tuning.gemmini.space import Layer

CLOCK_HZ = 1e9  # nominal clock to express cycles as seconds where the service wants seconds (labelled so)


def layer_of(workload: WorkloadSpec, shape: Mapping[str, int], weight: float = 1.0, name: str = "") -> Layer:
    """`dense` (Y = X·Wᵀ: M×K times K×N) becomes a GEMM/GEMV; `conv2d` (NHWC) a conv. Gemmini computes int8
    with int32 accumulation whatever dtype the workload names."""
    full = workload.bind(shape)
    w = max(1, round(weight))
    label = name or ",".join(f"{k}={v}" for k, v in sorted(shape.items())) or workload.op
    if workload.op == "dense":
        return Layer.gemm(label, M=full["M"], N=full["N"], K=full["K"], weight=w)
    if workload.op == "conv2d":
        return Layer.conv(
            label,
            H=full["H"],
            W=full["W"],
            CI=full["CI"],
            CO=full["CO"],
            KH=full["KH"],
            KW=full["KW"],
            stride=int(workload.attrs["stride"]),
            padding=int(workload.attrs["padding"]),
            batch=full["N"],
            weight=w,
        )
    raise ValueError(f"gemmini tunes dense and conv2d layers, not {workload.op}")


# A subset of the thesis's single-operator shapes (Table 6.4 GEMM/GEMV ranges, Table 6.5 conv ranges).
SINGLE_OPS = [
    Layer.gemm("gemm-bert-qkv", M=128, N=768, K=768),
    Layer.gemm("gemm-bert-ffn", M=128, N=3072, K=768),
    Layer.gemm("gemm-512", M=512, N=512, K=512),
    Layer.gemm("gemv-llama", M=1, N=4096, K=4096),
    Layer.gemm("gemv-bert", M=1, N=768, K=768),
    Layer.conv("conv-r50-3x3", H=56, W=56, CI=64, CO=64, KH=3, KW=3, padding=1),
    Layer.conv("conv-r50-1x1", H=28, W=28, CI=128, CO=512, KH=1, KW=1),
    Layer.conv("conv-unet-3x3", H=64, W=64, CI=32, CO=32, KH=3, KW=3, padding=1),
]

# ResNet-50's distinct conv layers (batch 1, 224×224) with occurrence counts, stem omitted, plus the FC.
RESNET50 = [
    Layer.conv("r50-c2-1x1a", 56, 56, 64, 64, 1, 1, weight=1),
    Layer.conv("r50-c2-3x3", 56, 56, 64, 64, 3, 3, padding=1, weight=3),
    Layer.conv("r50-c2-1x1b", 56, 56, 64, 256, 1, 1, weight=4),
    Layer.conv("r50-c2-1x1c", 56, 56, 256, 64, 1, 1, weight=2),
    Layer.conv("r50-c3-1x1a", 28, 28, 256, 128, 1, 1, weight=1),
    Layer.conv("r50-c3-3x3", 28, 28, 128, 128, 3, 3, padding=1, weight=4),
    Layer.conv("r50-c3-1x1b", 28, 28, 128, 512, 1, 1, weight=5),
    Layer.conv("r50-c3-1x1c", 28, 28, 512, 128, 1, 1, weight=3),
    Layer.conv("r50-c4-3x3", 14, 14, 256, 256, 3, 3, padding=1, weight=6),
    Layer.conv("r50-c4-1x1b", 14, 14, 256, 1024, 1, 1, weight=7),
    Layer.conv("r50-c4-1x1c", 14, 14, 1024, 256, 1, 1, weight=5),
    Layer.conv("r50-c5-3x3", 7, 7, 512, 512, 3, 3, padding=1, weight=3),
    Layer.conv("r50-c5-1x1b", 7, 7, 512, 2048, 1, 1, weight=4),
    Layer.conv("r50-c5-1x1c", 7, 7, 2048, 512, 1, 1, weight=2),
    Layer.gemm("r50-fc", M=1, N=1000, K=2048, weight=1),
]

# BERT-base encoder (sequence 128), per layer × 12.
BERT = [
    Layer.gemm("bert-qkv", M=128, N=2304, K=768, weight=12),
    Layer.gemm("bert-scores", M=128, N=128, K=64, weight=144),
    Layer.gemm("bert-context", M=128, N=64, K=128, weight=144),
    Layer.gemm("bert-out", M=128, N=768, K=768, weight=12),
    Layer.gemm("bert-ffn1", M=128, N=3072, K=768, weight=12),
    Layer.gemm("bert-ffn2", M=128, N=768, K=3072, weight=12),
]
