"""Issue 22's layer table: `ukernel` jobs on the layers they cover today, against the faster of numpy and PyTorch.

Covered, dense (one dynamic dimension M; bias and activation fused into the uKernels):

- `ffn-up`: BERT-base FFN up, N=3072 K=768, + bias, gelu (erf), M = 1..512
- `attn-out`: BERT-base attention output, N=768 K=768, + bias, M = 1..512
- `gpt-fc`: a GPT-2 decode step's MLP c_fc, N=3072 K=768, + bias, gelu_tanh, M = 1..8
- `gpt-lmhead`: a GPT-2 decode step's LM head, N=50257 K=768 (no bias: tied to the embedding), M = 1..8
- `odd`: N=1000 K=777, + bias, M = 1..200 (neither dim a multiple of 8: N is padded inside the uKernels)

Covered, batch_matmul (the operator's C[B,M,N] = A[B,M,K]·Bt[B,N,K]ᵀ; T = 1..512 in two dims at once):

- `attn-qk`: attention Q·Kᵀ, [12,T,64]·[12,64,T]: B=12 K=64 static, T in M and N; the SDK takes K [12,T,64]
  as Bt as it is (contiguous)
- `attn-av`: attention A·V, [12,T,T]·[12,T,64]: B=12 N=64 static, T in M and K; the SDK takes Bt = Vᵀ, the
  transposed view of a contiguous V [12,T,64]

Covered, conv2d (NHWC input, HWIO filter; batch N dynamic, H = W = 56 static; the `ukernel` kind's conv2d unit:
the dense uKernels over M = N·OH·OW behind the SDK's ConvDispatcher, which does the im2col):

- `conv3x3`: ResNet-50 layer1 3×3 conv, 64→64 channels at 56×56, pad 1, N = 1..32 (K = 576)
- `conv1x1`: ResNet-50 layer1 1×1 conv, 256→64 channels at 56×56, N = 1..32 (K = 256; its im2col is a reshape)

  The service tunes the dense programs over M up to MAX_S = 4,096 and extends the table past it; the conv's
  routes (uKernels, numpy's im2col GEMM, PyTorch's conv2d) are timed at up to 8 of the M the support takes, so
  the job here covers N = 1..32 (M up to 100,352) as the service admits it (kinds/ukernel_conv.py).

Every table may route a shape to numpy or to PyTorch, whichever the job timed fastest as the SDK calls it
(kernelfleet.vendor); the route column says which ran ("numpy", "torch", "uKernel", "miss").

For each covered layer:

1. **Tune** as the job runner sets the job up, with the README's budget (`trials` 8 = up to 8 uKernels):
   - dense: one `UKernelTuner.tune` run for a uniform distribution over M = 1..S_max (`max_shapes` 4:
     the hot shapes it validates are the 4 largest M; the rules' representative M is the distribution's mean);
   - batch_matmul: the `ukernel` kind's batch_matmul unit (kinds/ukernel_bmm.py) for a joint distribution
     over T (an Explicit one, uniform over T = 1..S_max with T in both symbolic dims: the diagonal of the
     tuple table's classes): the job is admitted (`check_job`) and planned (the unit's uKernel count) by the
     service's own code, then `BmmUKernelTuner.tune` with the kind's `BmmRangeTask` (the target resolved by the
     llvm platform, vendor routes on as in the service's settings) and `verify_bmm`, which the job runs
     before it publishes. The dispatcher is a `BmmDispatcher` over the uKernels loaded back from their
     exported libraries (sha256 checked), as the SDK loads them;
   - conv2d: as kinds/ukernel_conv.run_conv_unit: the job (uniform over N = 1..32, an Explicit distribution)
     admitted by `check_job` and planned by the kind (its uKernel count, its hot tuples), then `tune_conv_range`
     with the hot tuples validated and vendor routes on (the unit's settings: the conv routes), which verifies
     the conv dispatcher at the support's corners and past them. The dispatcher is the outcome's
     `ConvDispatcher`.

   The tuning wall time is the time around that (dense: `UKernelTuner.tune`; batch_matmul:
   `BmmUKernelTuner.tune` and `verify_bmm`; conv2d: `tune_conv_range`); the job's own account (`seconds`) is
   recorded too. It
   runs in this process before torch is used (`import tvm` imports torch when it is installed; nothing in a
   uKernel job starts a Python worker that would import it again).
2. **Measure** the SDK dispatcher over the job's table and uKernels, called as a user calls it (plain numpy
   arrays, out=None), side by side with numpy and PyTorch:
   - dense: ours `d(x, w, bias=b)` after `d.prepare(w)`; numpy `x @ w.T`, then + b and the activation in
     numpy (`kernelfleet.epilogue.dense_reference`, the SDK's own epilogue, which the dispatcher also runs
     where its table routes M to numpy); PyTorch `F.linear(x, w, b)` then `F.gelu` (`approximate="tanh"` for
     gelu_tanh) / `relu` / `silu`;
   - batch_matmul: ours `d(a, bt)`; numpy `np.matmul(a, r)`; PyTorch `torch.bmm(a, r)` (r: Kᵀ as a view of
     K for attn-qk, V for attn-av: the same arrays);
   - conv2d: ours `d(x, f)` (x NHWC, f HWIO, the filter's W[CO, K] made and packed by a first call, as on a
     warm host); numpy: the SDK's own fallback (a ConvDispatcher without a table: im2col, then one GEMM `X @
     Wᵀ`), the fastest numpy conv we have (`np.einsum` over `sliding_window_view`, the service's reference, is
     1.6–4× slower at N = 1 and 4); PyTorch `F.conv2d(x_t.permute(0, 3, 1, 2), w)` on the contiguous NHWC
     tensor's NCHW view (channels_last to torch) with the weight channels_last too (a model moved to
     channels_last), its output permuted back to NHWC (a view);

   PyTorch under `torch.inference_mode()`; all three on the same number of threads (TVM's;
   `torch.set_num_threads` and threadpoolctl's BLAS limit set to it), in interleaved rounds (each round starts
   with another contender), each sample calibrated to last at least `--min-sample-ms`; the reported time is
   the median over the rounds. At every M (T) ≤ `--every-upto` and then every `--stride`-th (default stride
   1: EVERY M of the range) plus S_max. The vendor time at M is the faster of the numpy and torch medians;
   ratio = vendor / ours (> 1: ours is faster). An M whose ratio is below 0.97 gets `--confirm` more sets of
   rounds for all three contenders, medians over all samples pooled, so that one burst of other load is not
   reported as a loss (symmetric: both sides get the extra samples).
3. **Check**: max abs error of the dispatcher against PyTorch in fp32 at every measured M (numpy's against
   PyTorch too, for scale), and the dispatch overhead: at a few M (1, the middle, S_max), the Python-side time
   of a call minus the time of the kernels it runs, each timed alone with TVM's time_evaluator on inputs
   prepared beforehand (dense: each piece's uKernel at that piece's rows, as `tuner.measure_call_overhead`
   does for one piece; batch_matmul: the uKernel on A and Bt already padded and packed, so the overhead
   includes the per-call packing of Bt); at an M the table routes to numpy, minus numpy's own call. Plus the
   selection and bookkeeping alone, in ns (dense: `kernelfleet.dispatcher.dispatch_overhead_s`; batch_matmul:
   a call of a BmmDispatcher over the same table whose programs, numpy's included, do nothing; conv2d: the
   dense dispatcher's at M, as for dense). For conv2d the overhead includes the im2col (a copy per filter tap
   for 3×3; a reshape for 1×1): numpy's GEMM on the im2col matrix is the inner time at an N routed to numpy.

   Per-point cost (conv2d): a call is ~0.1–0.3 ms per image on two cores, so a sample is one call at most N
   and each N costs about (1 + rounds·(1 + confirm)) calls per contender: N = 1..32 is ~2 minutes per layer.

Environment, as in the other benchmarks (bench/common.py): OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE and
OMP_NUM_THREADS are removed by re-executing before numpy loads (the removed values are recorded); kernelfleet
is imported before numpy (its thread settings). The machine (CPU model, cores, load average at start and end,
other processes' share of the CPU while measuring) is printed and saved.

Writes `--json` (default bench/results/ukernel_layers.json, git-ignored) and the markdown table next to it
(`.md`, default bench/results/ukernel_layers.md).

    PYTHONPATH=.:clients/python .venv/bin/python bench/ukernel_layers.py                       # the full run
    PYTHONPATH=.:clients/python .venv/bin/python bench/ukernel_layers.py --quick --json /tmp/ul.json   # smoke
    PYTHONPATH=.:clients/python .venv/bin/python bench/ukernel_layers.py --layers odd --s-max 32 --json /tmp/ul.json
    PYTHONPATH=.:clients/python .venv/bin/python bench/ukernel_layers.py --layers attn-qk,attn-av --s-max 16 \\
        --max-ukernels 2 --rounds 3 --min-sample-ms 2 --json /tmp/ul.json                     # bmm smoke
    PYTHONPATH=.:clients/python .venv/bin/python bench/ukernel_layers.py --layers conv3x3,conv1x1 --s-max 3 \\
        --max-ukernels 2 --rounds 3 --min-sample-ms 2 --json /tmp/ul.json                     # conv smoke
"""

from __future__ import annotations

from common import reexec_without_overrides

if __name__ == "__main__":
    reexec_without_overrides()  # before numpy, torch or TVM load (see common.STRIPPED_ENV)
    import kernelfleet  # noqa: F401  (its thread settings must precede numpy: kernelfleet.runtime)

import argparse
import functools
import itertools
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_JSON = BENCH_DIR / "results" / "ukernel_layers.json"
HEADS, HEAD_DIM = 12, 64
BUDGET_UKERNELS = 8  # the README's ukernel budget: {"trials": 8}
BUDGET_HOT_SHAPES = 4  # Budget.max_shapes' default: the job validates at the 4 heaviest M
CONFIRM_BELOW = 0.97  # an M whose vendor/ours is below this is timed again (--confirm)
GOALS = {"geomean": 1.5, "worst": 0.95, "tuning_s": 40.0}  # issue 22: per layer


# ------------------------------------------------------------------------------------------------
# What a covered layer gives the measuring code: per measured size, the three contenders; per size, a probe
# of the dispatch overhead
# ------------------------------------------------------------------------------------------------


@dataclass
class ShapeCalls:
    """One measured size: ours (the SDK dispatcher as a user calls it), numpy's and PyTorch's calls."""

    ours: Callable[[], Any]
    numpy: Callable[[], Any]
    torch: Callable[[], Any]  # returns a tensor
    route: str  # "uKernel", "numpy" (the table routes it to numpy) or "miss" (numpy: not in the table)
    program: list[list[Any]]  # [[uKernel id, rows], …]; [] where numpy runs


@dataclass
class OverheadProbe:
    """One size's dispatch overhead: a call as the user makes it, the kernels it runs alone, the selection."""

    call: Callable[[], object]
    inner_s: Callable[[], float]  # seconds of the kernels the call runs (or of numpy's own call)
    inner: str
    pieces: int
    selection_s: Callable[[], float]


@dataclass
class LayerBench:
    """A tuned layer's dispatcher, bound to its operands: what measure_rows and dispatch_overhead take."""

    at: Callable[[int], ShapeCalls]
    probe: Callable[[int], OverheadProbe]


class Covered(Protocol):
    """A layer kind with uKernels (DenseLayer, BmmLayer, ConvLayer)."""

    name: str
    what: str
    s_max: int
    dim: ClassVar[str]

    def shape_text(self, s_max: int) -> str: ...
    def tune(self, s_max: int, args: argparse.Namespace, work_dir: Path) -> tuple[Any, dict[str, Any]]: ...
    def bench(self, torch: Any, d: Any) -> LayerBench: ...


@dataclass(frozen=True)
class DenseLayer:
    name: str
    what: str
    N: int
    K: int
    s_max: int
    bias: bool
    activation: str
    dim: ClassVar[str] = "M"

    def shape_text(self, s_max: int) -> str:
        return f"{self.what}: N={self.N} K={self.K}, M=1..{s_max}"

    def tune(self, s_max: int, args: argparse.Namespace, work_dir: Path) -> tuple[Any, dict[str, Any]]:
        return tune_dense(self, s_max, args, work_dir)

    def bench(self, torch: Any, d: Any) -> LayerBench:
        return dense_bench(torch, self, d)


@dataclass(frozen=True)
class BmmLayer:
    """batch_matmul with one dynamic size T in the symbolic dims `follows_t` (two of M, N, K); `bt_layout` is
    how the caller holds Bt (bmm_tuner.BT_LAYOUTS: "BNK" contiguous, "BKN" the transposed view of [B,K,N])."""

    name: str
    what: str
    B: int
    static: tuple[tuple[str, int], ...]  # the static one of M, N, K
    follows_t: tuple[str, ...]
    bt_layout: str
    s_max: int
    dim: ClassVar[str] = "T"

    def full_shape(self, t: int) -> dict[str, int]:
        return {"B": self.B, **dict(self.static), **dict.fromkeys(self.follows_t, t)}

    def shape_text(self, s_max: int) -> str:
        static = " ".join(f"{d}={v}" for d, v in (("B", self.B), *self.static))
        return f"{self.what}: {static}, T in {','.join(self.follows_t)}, T=1..{s_max}"

    def tune(self, s_max: int, args: argparse.Namespace, work_dir: Path) -> tuple[Any, dict[str, Any]]:
        return tune_bmm(self, s_max, args, work_dir)

    def bench(self, torch: Any, d: Any) -> LayerBench:
        return bmm_bench(torch, self, d)


@dataclass(frozen=True)
class ConvLayer:
    """An NHWC conv2d (HWIO filter) with the batch N dynamic, H and W static: the `ukernel` kind's conv2d unit
    (kinds/ukernel_conv.py), the dense uKernels over M = N·OH·OW behind the SDK's ConvDispatcher."""

    name: str
    what: str
    CI: int
    CO: int
    k: int  # KH = KW
    padding: int
    s_max: int
    HW: int = 56
    stride: int = 1
    dim: ClassVar[str] = "N"

    @property
    def out_hw(self) -> int:
        return (self.HW + 2 * self.padding - self.k) // self.stride + 1

    def rows(self, n: int) -> int:
        """M = N·OH·OW, the dense layer's row count at batch n."""
        return n * self.out_hw**2

    def workload(self) -> Any:
        from service.models import WorkloadSpec

        return WorkloadSpec(
            op="conv2d",
            dims={"H": self.HW, "W": self.HW, "CI": self.CI, "CO": self.CO, "KH": self.k, "KW": self.k},
            symbolic=["N"],
            attrs={"stride": self.stride, "padding": self.padding},
        )

    def distribution(self, n_max: int) -> Any:
        """Uniform over N = 1..n_max."""
        from service.models.distribution import Explicit, ShapePoint

        return Explicit(points=[ShapePoint(shape={"N": n}) for n in range(1, n_max + 1)])

    def shape_text(self, s_max: int) -> str:
        return (
            f"{self.what}: CI={self.CI} CO={self.CO} {self.k}×{self.k} pad {self.padding}, H=W={self.HW}, "
            f"N=1..{s_max} (M up to {self.rows(s_max)})"
        )

    def tune(self, s_max: int, args: argparse.Namespace, work_dir: Path) -> tuple[Any, dict[str, Any]]:
        return tune_conv(self, s_max, args, work_dir)

    def bench(self, torch: Any, d: Any) -> LayerBench:
        return conv_bench(torch, self, d)


DENSE: dict[str, DenseLayer] = {
    layer.name: layer
    for layer in (
        DenseLayer("ffn-up", "BERT-base FFN up, + bias, gelu", 3072, 768, 512, True, "gelu"),
        DenseLayer("attn-out", "BERT-base attention output, + bias", 768, 768, 512, True, "none"),
        DenseLayer("gpt-fc", "GPT-2 decode step, MLP c_fc, + bias, gelu_tanh", 3072, 768, 8, True, "gelu_tanh"),
        DenseLayer("gpt-lmhead", "GPT-2 decode step, LM head (no bias)", 50257, 768, 8, False, "none"),
        DenseLayer("odd", "dims not multiples of 8, + bias", 1000, 777, 200, True, "none"),
        # held out (issue 31): layers no table or rule was developed against
        DenseLayer("held-t5-wi", "held out: T5-small FFN wi, relu (no bias)", 2048, 512, 256, False, "relu"),
        DenseLayer("held-vit-fc1", "held out: ViT-S/16 MLP fc1, + bias, gelu", 1536, 384, 256, True, "gelu"),
        DenseLayer("held-odd-silu", "held out: odd dims, + bias, silu", 333, 1000, 128, True, "silu"),
    )
}
BMM: dict[str, BmmLayer] = {
    layer.name: layer
    for layer in (
        BmmLayer(
            "attn-qk",
            f"attention Q·Kᵀ, [{HEADS},T,{HEAD_DIM}]·[{HEADS},{HEAD_DIM},T]",
            HEADS,
            (("K", HEAD_DIM),),
            ("M", "N"),
            "BNK",  # Bt = K [12,T,64] as it is
            512,
        ),
        BmmLayer(
            "attn-av",
            f"attention A·V, [{HEADS},T,T]·[{HEADS},T,{HEAD_DIM}]",
            HEADS,
            (("N", HEAD_DIM),),
            ("M", "K"),
            "BKN",  # Bt = Vᵀ, a view of V [12,T,64]
            512,
        ),
    )
}
CONV: dict[str, ConvLayer] = {
    layer.name: layer
    for layer in (
        ConvLayer("conv3x3", "ResNet-50 layer1 3×3 conv", 64, 64, 3, 1, 32),
        ConvLayer("conv1x1", "ResNet-50 layer1 1×1 conv", 256, 64, 1, 0, 32),
    )
}
COVERED: dict[str, Covered] = {**DENSE, **BMM, **CONV}
ALL_LAYERS = tuple(COVERED)
QUICK = {"s_max": 32, "rounds": 3, "min_sample_ms": 2.0}


def geomean(values: Sequence[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


def layer_s_max(layer: Covered, args: argparse.Namespace) -> int:
    """The layer's range after --s-max-scale and --s-max (a cap); at least 1."""
    scale: float = args.s_max_scale
    s = max(1, round(layer.s_max * scale))
    cap: int | None = args.s_max
    return max(1, min(s, cap)) if cap else s


def measured_shapes(s_max: int, every_upto: int, stride: int) -> list[int]:
    """Every M ≤ every_upto, then every stride-th M beyond, and s_max."""
    shapes = set(range(1, min(every_upto, s_max) + 1)) | {s_max}
    shapes |= set(range(every_upto + stride, s_max + 1, stride))
    return sorted(shapes)


def hot_shapes(s_max: int) -> list[int]:
    """What a job over a uniform M = 1..s_max validates: the BUDGET_HOT_SHAPES heaviest M (planning.hot_shapes)."""
    return list(range(s_max, max(0, s_max - BUDGET_HOT_SHAPES), -1))


def intervals(values: Sequence[int]) -> list[list[int]]:
    """Sorted ints as [lo, hi] runs of consecutive values."""
    out: list[list[int]] = []
    for v in sorted(values):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out


# ------------------------------------------------------------------------------------------------
# Tuning
# ------------------------------------------------------------------------------------------------


def tune_dense(layer: DenseLayer, s_max: int, args: argparse.Namespace, work_dir: Path) -> tuple[Any, dict[str, Any]]:
    from kernelfleet.dispatcher import Dispatcher
    from service.models import WorkloadSpec
    from service.tuning.hardware import host_target
    from service.tuning.tuners.ukernel.tuner import QuietRangeSink, RangeTask, UKernelTuner

    workload = WorkloadSpec(
        op="dense",
        dims={"N": layer.N, "K": layer.K},
        symbolic=["M"],
        attrs={"bias": layer.bias, "activation": layer.activation},
    )
    task = RangeTask(
        workload=workload,
        s_max=s_max,
        validate=hot_shapes(s_max),
        target=host_target(),
        max_ukernels=args.max_ukernels,
        work_dir=work_dir,
        representative_m=max(1, round((1 + s_max) / 2)),
    )
    began = time.perf_counter()
    out = UKernelTuner().tune(task, QuietRangeSink())
    wall = time.perf_counter() - began
    routes = out.validation["vendor_routes"]
    info = {
        "wall_s": wall,
        "job_seconds": out.seconds,
        "ukernels": sorted(out.kernels),
        "candidates": [c["id"] for c in out.candidates],
        "errors": out.errors,
        "vendor_intervals": routes["intervals"],
        "vendor_S": routes["vendor_S"],
        "vendor_S_by_library": routes["vendor_S_by_library"],
        "shapes_timed_against_the_vendors": routes["shapes_timed"],
        "decided_by": routes["decided_by"],
        "padding_ratio": out.padding_ratio,
        "piece_overhead_s": out.validation.get("piece_overhead_s"),
        "table": out.table.to_dict(),
    }
    print(
        f"  tuned in {wall:.1f} s (job's account {out.seconds:.1f} s): uKernels {info['ukernels']}, "
        f"M routed to a vendor library {routes['vendor_S_by_library']} in {routes['intervals']}, "
        f"{routes['shapes_timed']} M timed",
        flush=True,
    )
    return Dispatcher(out.table, out.kernels, N=layer.N, K=layer.K), info


def bmm_workload(layer: BmmLayer, s_max: int) -> tuple[Any, Any]:
    """The job's workload and its distribution: uniform over T = 1..s_max, T in both symbolic dims (joint)."""
    from service.models import WorkloadSpec
    from service.models.distribution import Explicit, ShapePoint

    workload = WorkloadSpec(
        op="batch_matmul", dims={"B": layer.B, **dict(layer.static)}, symbolic=list(layer.follows_t)
    )
    points = [ShapePoint(shape=dict.fromkeys(layer.follows_t, t)) for t in range(1, s_max + 1)]
    return workload, Explicit(points=points)


def tune_bmm(layer: BmmLayer, s_max: int, args: argparse.Namespace, work_dir: Path) -> tuple[Any, dict[str, Any]]:
    """As kinds/ukernel_bmm.run_bmm_unit sets the tuner up, admitted and planned by the service's own code."""
    from kernelfleet import vendor
    from kernelfleet.bmm_dispatcher import BmmDispatcher
    from kernelfleet.bmm_ukernel import load_bmm_ukernel
    from service.models import Budget
    from service.settings import Settings
    from service.tuning.admission import check_job
    from service.tuning.hardware import host_target
    from service.tuning.kinds import KINDS
    from service.tuning.platforms import PLATFORMS, tvm_target
    from service.tuning.tuners.ukernel.bmm_tuner import BmmRangeTask, BmmUKernelTuner, verify_bmm
    from service.tuning.tuners.ukernel.tuner import QuietRangeSink

    workload, distribution = bmm_workload(layer, s_max)
    budget = Budget(trials=args.max_ukernels, max_shapes=BUDGET_HOT_SHAPES)
    target = PLATFORMS.get("llvm").resolve(host_target())
    problem = check_job("ukernel", workload, distribution, target, budget)
    if problem is not None:
        raise SystemExit(f"{layer.name}: the service would refuse this job: {problem}")
    (unit,) = KINDS.get("ukernel").plan(workload, distribution, budget).units
    static = {d: int(v) for d, v in workload.dims.items()}
    task = BmmRangeTask(
        static=static,
        support=distribution.support(),
        target=tvm_target(target),
        work_dir=work_dir,
        max_ukernels=unit.trials,
        vendor_routes=Settings.model_fields["ukernel_vendor_routes"].default,
    )
    began = time.perf_counter()
    out = BmmUKernelTuner().tune(task, QuietRangeSink())
    error = verify_bmm(out.dispatcher(static), static)  # the job verifies before it publishes
    wall = time.perf_counter() - began
    kernels = {uid: load_bmm_ukernel(a.path, a.spec, a.sha256) for uid, a in out.artifacts.items()}
    d = BmmDispatcher(out.table, kernels, static)
    routes = {t: d.program(layer.full_shape(t), layer.bt_layout) for t in range(1, s_max + 1)}  # as the layer calls
    vendor_t = [t for t, uid in routes.items() if vendor.is_vendor(uid)]
    torch_t = [t for t, uid in routes.items() if vendor.library_of(uid) == vendor.TORCH]
    info = {
        "wall_s": wall,
        "job_seconds": out.seconds,
        "ukernels": sorted(out.kernels),
        "candidates": [c["id"] for c in out.candidates],
        "errors": [error] if error else [],
        "vendor_intervals": intervals(vendor_t),
        "vendor_S": len(vendor_t),
        "torch_S": len(torch_t),
        "missed_S": sum(uid is None for uid in routes.values()),
        "tuples_timed_against_the_vendors": len(out.measured),
        "table": out.table.to_dict(),
    }
    failed = f", verification FAILED: {error}" if error else ""
    print(
        f"  tuned in {wall:.1f} s (job's account {out.seconds:.1f} s{failed}): "
        f"uKernels {info['ukernels']} of {info['candidates']}, T routed to a vendor library {len(vendor_t)} "
        f"(PyTorch {len(torch_t)}) in {info['vendor_intervals']}, {len(out.measured)} tuples timed",
        flush=True,
    )
    return d, info


def tune_conv(layer: ConvLayer, s_max: int, args: argparse.Namespace, work_dir: Path) -> tuple[Any, dict[str, Any]]:
    """As kinds/ukernel_conv.run_conv_unit sets the tuner up, admitted and planned by the service's own code: the
    dense programs over M up to MAX_S (larger M run the table's extended last interval), then the conv routes
    timed at the support's own M (the uKernels, numpy's im2col GEMM, PyTorch's conv2d)."""
    from service.models import Budget
    from service.tuning.admission import check_job
    from service.tuning.hardware import host_target
    from service.tuning.kinds import KINDS
    from service.tuning.platforms import PLATFORMS
    from service.tuning.tuners.ukernel import conv

    workload = layer.workload()
    budget = Budget(trials=args.max_ukernels, max_shapes=BUDGET_HOT_SHAPES)
    target = PLATFORMS.get("llvm").resolve(host_target())
    distribution = layer.distribution(s_max)
    problem = check_job("ukernel", workload, distribution, target, budget)
    if problem is not None:
        raise SystemExit(f"{layer.name}: the service would refuse this job: {problem}")
    plan = KINDS.get("ukernel").plan(workload, distribution, budget)
    (unit,) = plan.units
    hot = [p.shape for p in plan.shapes]
    began = time.perf_counter()
    out = conv.tune_conv_range(  # verifies the conv dispatcher at the support's corners and past them
        workload, distribution.support(), target, work_dir, max_ukernels=unit.trials, validate=hot
    )
    wall = time.perf_counter() - began
    d = out.dispatcher()
    vendor_n = [n for n in range(1, s_max + 1) if not d.program({"N": n})]
    routes = out.dense.validation["conv_routes"]
    info = {
        "wall_s": wall,
        "job_seconds": out.dense.seconds,
        "job_M": [1, layer.rows(s_max)],
        "hot_shapes": hot,
        "ukernels": sorted(out.dense.kernels),
        "candidates": [c["id"] for c in out.dense.candidates],
        "errors": out.dense.errors,
        "vendor_intervals": intervals(vendor_n),
        "vendor_S": len(vendor_n),
        "route_spans_M": routes["spans"],
        "route_timed_s": routes["timed_s"],
        "padding_ratio": out.dense.padding_ratio,
        "table": out.dense.table.to_dict(),
    }
    print(
        f"  job N=1..{s_max} (M=1..{layer.rows(s_max)}), tuned in {wall:.1f} s (the dense part "
        f"{out.dense.seconds:.1f} s): uKernels {info['ukernels']}, "
        f"N routed to a vendor library {vendor_n} (M spans {routes['spans']}), {len(routes['timed_s'])} M timed",
        flush=True,
    )
    return d, info


# ------------------------------------------------------------------------------------------------
# The contenders per layer kind
# ------------------------------------------------------------------------------------------------


def torch_activation(torch: Any, activation: str) -> Callable[[Any], Any]:
    F = torch.nn.functional
    table: dict[str, Callable[[Any], Any]] = {
        "none": lambda y: y,
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
        "silu": F.silu,
    }
    return table[activation]


def dense_bench(torch: Any, layer: DenseLayer, d: Any) -> LayerBench:
    import numpy as np

    from kernelfleet import vendor
    from kernelfleet.dispatcher import dispatch_overhead_s
    from kernelfleet.epilogue import dense_reference

    rng = np.random.default_rng(0)
    w = rng.standard_normal((layer.N, layer.K), dtype=np.float32)
    b = rng.standard_normal(layer.N, dtype=np.float32) if layer.bias else None
    d.prepare(w)
    epi = d.epilogue
    wt = torch.from_numpy(w)
    bt = torch.from_numpy(b) if b is not None else None
    act = torch_activation(torch, layer.activation)
    linear = torch.nn.functional.linear

    def at(S: int) -> ShapeCalls:
        x = rng.standard_normal((S, layer.K), dtype=np.float32)
        xt = torch.from_numpy(x)
        return ShapeCalls(
            ours=lambda: d(x, w, bias=b),
            numpy=lambda: dense_reference(x, w, b, epi),
            torch=lambda: act(linear(xt, wt, bt)),
            route=d.table.vendor_library(S) or "uKernel",
            program=[[p.ukernel_id, p.rows] for p in d.program(S)],
        )

    def probe(S: int) -> OverheadProbe:
        x = np.random.default_rng(S).standard_normal((S, layer.K), dtype=np.float32)
        pieces = d.program(S)
        if pieces:
            inner_what, inner = "its uKernels (time_evaluator)", functools.partial(_kernels_time, d, pieces)
        else:
            lib = d.library(S)
            inner_what, inner = (
                f"{lib}'s own call",
                functools.partial(_best_median, functools.partial(vendor.dense_call(lib, epi), x, w, b), 1),
            )
        return OverheadProbe(
            call=lambda: d(x, w, bias=b),
            inner_s=inner,
            inner=inner_what,
            pieces=len(pieces),
            selection_s=lambda: dispatch_overhead_s(d, S, w, calls=5000),
        )

    return LayerBench(at, probe)


def bmm_operands(torch: Any, layer: BmmLayer, t: int, seed: int) -> tuple[Any, Any, Any, Any, Any]:
    """A and Bt as the SDK takes them, the right operand r (= Btᵀ, a view) as numpy and torch take it, and the
    torch tensors of A and r (sharing the arrays' memory)."""
    from service.tuning.tuners.ukernel.bmm_tuner import random_pair

    a, bt = random_pair(layer.full_shape(t), seed=seed, bt_layout=layer.bt_layout)
    r = bt.transpose(0, 2, 1)
    return a, bt, r, torch.from_numpy(a), torch.from_numpy(r)


def bmm_bench(torch: Any, layer: BmmLayer, d: Any) -> LayerBench:
    import numpy as np

    from kernelfleet import vendor

    routes: dict[str | None, str] = {None: "miss", **{vendor.route_of(lib): lib for lib in vendor.LIBRARIES}}

    def at(t: int) -> ShapeCalls:
        a, bt, r, at_, rt = bmm_operands(torch, layer, t, seed=t)
        uid = d.program(layer.full_shape(t), layer.bt_layout)
        return ShapeCalls(
            ours=lambda: d(a, bt),
            numpy=lambda: np.matmul(a, r),
            torch=lambda: torch.bmm(at_, rt),
            route=routes.get(uid, "uKernel"),
            program=[] if uid in routes else [[uid, t]],
        )

    def probe(t: int) -> OverheadProbe:
        a, bt, _, _, _ = bmm_operands(torch, layer, t, seed=10_000 + t)
        uid = d.program(layer.full_shape(t), layer.bt_layout)
        if uid in routes:
            lib = vendor.library_of(uid) or vendor.NUMPY
            inner_what, inner = f"{lib}'s own call", functools.partial(_best_median, lambda: vendor.bmm(lib, a, bt), 1)
        else:
            inner_what, inner = (
                "its uKernel (time_evaluator, A and Bt packed)",
                functools.partial(_bmm_kernel_time, d.kernels[uid], a, bt),
            )
        return OverheadProbe(
            call=lambda: d(a, bt),
            inner_s=inner,
            inner=inner_what,
            pieces=0 if uid in routes else 1,
            selection_s=lambda: bmm_selection_s(d, a, bt),
        )

    return LayerBench(at, probe)


def conv_numpy(layer: ConvLayer) -> Any:
    """numpy's conv: the SDK's own fallback (a ConvDispatcher with no table: im2col, then one BLAS GEMM;
    for a 1×1 layer the im2col is a free reshape). Faster than np.einsum over sliding windows
    (service.tuning.compute's reference), which contracts the 3×3 windows in pieces."""
    from kernelfleet.conv_dispatcher import ConvDispatcher, ConvGeometry
    from kernelfleet.dispatcher import Dispatcher

    return ConvDispatcher(Dispatcher(None, {}, N=None, K=None), ConvGeometry(layer.stride, layer.padding))


def conv_operands(torch: Any, layer: ConvLayer, n: int, seed: int) -> tuple[Any, Any]:
    """The NHWC input as numpy (contiguous) and as torch sees it: the NCHW view of the same memory, which
    torch treats as channels_last."""
    import numpy as np

    x = np.random.default_rng(seed).standard_normal((n, layer.HW, layer.HW, layer.CI), dtype=np.float32)
    return x, torch.from_numpy(x).permute(0, 3, 1, 2)


def conv_bench(torch: Any, layer: ConvLayer, d: Any) -> LayerBench:
    import numpy as np

    from kernelfleet import vendor
    from kernelfleet.dispatcher import dispatch_overhead_s

    f = np.random.default_rng(0).standard_normal((layer.k, layer.k, layer.CI, layer.CO), dtype=np.float32)
    # PyTorch's OIHW weight, channels_last like the input (as model.to(memory_format=torch.channels_last))
    wt = torch.from_numpy(f).permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
    conv2d = torch.nn.functional.conv2d
    fallback = conv_numpy(layer)
    d(conv_operands(torch, layer, 1, 0)[0], f)  # the filter as W[CO, K], packed once, as a warm host has it

    def at(n: int) -> ShapeCalls:
        x, xt = conv_operands(torch, layer, n, seed=n)
        return ShapeCalls(
            ours=lambda: d(x, f),
            numpy=lambda: fallback(x, f),
            torch=lambda: conv2d(xt, wt, stride=layer.stride, padding=layer.padding).permute(0, 2, 3, 1),
            route=d.dense.table.vendor_library(layer.rows(n)) or "uKernel",
            program=[[p.ukernel_id, p.rows] for p in d.program({"N": n})],
        )

    def probe(n: int) -> OverheadProbe:
        x, _ = conv_operands(torch, layer, n, seed=10_000 + n)
        pieces = d.program({"N": n})
        w = d.weight(f)
        if pieces:
            inner_what, inner = (
                "its uKernels (time_evaluator; the im2col is overhead)",
                functools.partial(_kernels_time, d.dense, pieces),
            )
        elif d.dense.library(layer.rows(n)) == vendor.TORCH:
            weight = vendor.torch_conv_weight(f)
            inner_what, inner = (
                "PyTorch's conv2d",
                functools.partial(_best_median, lambda: vendor.torch_conv2d(x, weight, layer.stride, layer.padding), 1),
            )
        else:
            cols = d.geometry.columns(x, layer.k, layer.k, layer.out_hw, layer.out_hw)
            inner_what, inner = (
                "numpy's GEMM on the im2col matrix (the im2col is overhead)",
                functools.partial(_best_median, lambda: cols @ w.T, 1),
            )
        return OverheadProbe(
            call=lambda: d(x, f),
            inner_s=inner,
            inner=inner_what,
            pieces=len(pieces),
            selection_s=lambda: dispatch_overhead_s(d.dense, layer.rows(n), w, calls=5000),
        )

    return LayerBench(at, probe)


# ------------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------------


def _median_of(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def measure_rows(
    at: Callable[[int], ShapeCalls], shapes: Sequence[int], dim: str, args: argparse.Namespace
) -> list[Any]:
    """Ours, numpy and torch at every size in interleaved rounds (re-timed below CONFIRM_BELOW), with errors."""
    import numpy as np
    from common import Contender, calibrate, python_sampler, run_rounds

    rows = []
    print(f"  {dim:>4}{'ours µs':>10}{'numpy µs':>10}{'torch µs':>10}{'vendor/ours':>12}  route   err vs torch")
    for S in shapes:
        calls = at(S)
        expected = calls.torch().numpy()
        err = float(np.max(np.abs(calls.ours() - expected)))
        err_np = float(np.max(np.abs(calls.numpy() - expected)))
        contenders = [
            Contender("ours", python_sampler(calls.ours), calls.ours, pool="tvm"),
            Contender("numpy", python_sampler(calls.numpy), calls.numpy, pool="openblas"),
            Contender("torch", python_sampler(calls.torch), lambda c=calls: c.torch().numpy(), pool="torch"),
        ]
        for c in contenders:
            c.number = calibrate(c.sample, args.min_sample_ms / 1e3)
        settled = run_rounds(contenders, args.rounds, 0.0, settle=args.settle)
        med = {c.name: _median_of(c.samples_s) for c in contenders}
        confirmed = 0
        while confirmed < args.confirm and min(med["numpy"], med["torch"]) / med["ours"] < CONFIRM_BELOW:
            # all three again: pooled medians, both sides alike
            settled += run_rounds(contenders, args.rounds, 0.0, settle=args.settle)
            med = {c.name: _median_of(c.samples_s) for c in contenders}
            confirmed += 1
        vendor = min(med["numpy"], med["torch"])
        row = {
            "S": S,
            "ours_s": med["ours"],
            "numpy_s": med["numpy"],
            "torch_s": med["torch"],
            "vendor_s": vendor,
            "faster_vendor": "numpy" if med["numpy"] <= med["torch"] else "torch",
            "ratio": vendor / med["ours"],
            "ratio_numpy": med["numpy"] / med["ours"],
            "ratio_torch": med["torch"] / med["ours"],
            "route": calls.route,
            "program": calls.program,
            "retimed": confirmed,
            "settle_s": settled,
            "rounds": len(contenders[0].samples_s),
            "max_abs_err_vs_torch": err,
            "numpy_max_abs_err_vs_torch": err_np,
            "max_abs_expected": float(np.max(np.abs(expected))),
        }
        rows.append(row)
        print(
            f"  {S:>4}{med['ours'] * 1e6:>10.1f}{med['numpy'] * 1e6:>10.1f}{med['torch'] * 1e6:>10.1f}"
            f"{row['ratio']:>12.2f}  {calls.route:<7} {err:.1e}{'  (re-timed)' if confirmed else ''}",
            flush=True,
        )
    return rows


def dispatch_overhead(probe_at: Callable[[int], OverheadProbe], shapes: Sequence[int]) -> dict[str, Any]:
    """Per size: the Python-side µs of a call beyond its kernels' own time, and the selection alone (ns)."""
    out: dict[str, Any] = {}
    for S in shapes:
        probe = probe_at(S)
        call_s = inner = math.inf
        for _ in range(5):  # alternating, the fastest of each (other load only ever adds time)
            call_s = min(call_s, _best_median(probe.call, rounds=1))
            inner = min(inner, probe.inner_s())
        out[str(S)] = {
            "call_s": call_s,
            "inner_s": inner,
            "inner": probe.inner,
            "pieces": probe.pieces,
            "overhead_s": call_s - inner,
            "selection_ns": probe.selection_s() * 1e9,
        }
    return out


def _kernels_time(d: Any, pieces: Sequence[Any]) -> float:
    return float(sum(d.kernels[p.ukernel_id].time(p.rows, repeat=5, min_repeat_ms=5) for p in pieces))


def _bmm_kernel_time(uk: Any, a: Any, bt: Any) -> float:
    """Seconds of a batch_matmul uKernel's compiled function alone (time_evaluator), on A and Bt padded and
    packed beforehand as its __call__ does on every call."""
    import numpy as np

    from kernelfleet.bmm_ukernel import round_up
    from kernelfleet.tvm_runtime import aligned_empty, import_tvm

    tvm = import_tvm()
    dev = tvm.cpu(0)
    B, M, N, K = uk.check(a, bt)
    s = uk.spec
    Mp, Np, Kp = round_up(M, s.mt), round_up(N, s.nt), round_up(K, s.kt)
    ap = uk.pack_a(a, Mp, Kp).reshape(B, Mp // s.mt, s.mt, Kp // s.kt, s.kt)
    bp = uk.pack_bt(bt, Np, Kp)
    c = aligned_empty((B, Mp, Np), s.dtype).reshape(B, Mp // s.mt, s.mt, Np // s.nt, s.nt)
    args = [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in (ap, bp, c)]
    evaluator = uk.module.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=5)
    return float(np.median(evaluator(*args).results))


def _no_program(a: Any, bt: Any, out: Any = None) -> Any:
    return out


def bmm_selection_s(d: Any, a: Any, bt: Any, calls: int = 5000, rounds: int = 5) -> float:
    """Median seconds per call of a BmmDispatcher's own work (shape memo, table lookup, counters): a dispatcher
    over the same table, with every program (numpy's too) a function that does nothing, called on the arrays."""
    from kernelfleet import vendor
    from kernelfleet.bmm_dispatcher import BmmDispatcher
    from kernelfleet.tuple_dispatch import TupleDispatchTable

    def dry_cells(cells: tuple[str | None, ...]) -> tuple[str | None, ...]:
        return tuple("no-program" if vendor.is_vendor(c) else c for c in cells)

    t = d.table
    layouts = {layout: dry_cells(cells) for layout, cells in t.layouts.items()}
    table = TupleDispatchTable(t.dims, t.starts, t.his, dry_cells(t.cells), layouts)
    dry = BmmDispatcher(table, dict.fromkeys(table.ukernel_ids(), _no_program), d.static)
    dry(a, bt)  # first sight: checked and looked up, as a warm dispatcher has
    per_call = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            dry(a, bt)
        per_call.append((time.perf_counter() - start) / calls)
    return statistics.median(per_call)


def _best_median(fn: Callable[[], object], rounds: int = 5, min_seconds: float = 0.02) -> float:
    """The fastest of `rounds` medians (other load only ever adds time)."""
    best = math.inf
    for _ in range(rounds):
        samples: list[float] = []
        deadline = time.perf_counter() + min_seconds
        fn()
        while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < 2000):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        best = min(best, statistics.median(samples))
    return best


# ------------------------------------------------------------------------------------------------
# Summary and report
# ------------------------------------------------------------------------------------------------


def summarize(rows: Sequence[dict[str, Any]], tuning_s: float) -> dict[str, Any]:
    ratios = {r["S"]: r["ratio"] for r in rows}
    worst = min(ratios, key=ratios.__getitem__)
    below = sorted(S for S, v in ratios.items() if v < GOALS["worst"])
    uk = [r for r in rows if r["route"] == "uKernel"]
    summary = {
        "shapes": len(rows),
        "geomean": geomean(list(ratios.values())),
        "geomean_vs_numpy": geomean([r["ratio_numpy"] for r in rows]),
        "geomean_vs_torch": geomean([r["ratio_torch"] for r in rows]),
        "worst": ratios[worst],
        "worst_S": worst,
        "worst_route": next(r["route"] for r in rows if r["S"] == worst),
        "below_0_95": below,
        "torch_faster_S": sum(r["faster_vendor"] == "torch" for r in rows),
        "vendor_routed_S": len(rows) - len(uk),
        "torch_routed_S": sum(r["route"] == "torch" for r in rows),
        "max_abs_err_vs_torch": max(r["max_abs_err_vs_torch"] for r in rows),
        "numpy_max_abs_err_vs_torch": max(r["numpy_max_abs_err_vs_torch"] for r in rows),
        "tuning_s": tuning_s,
    }
    summary["goals"] = {
        "geomean": summary["geomean"] is not None and summary["geomean"] >= GOALS["geomean"],
        "worst": summary["worst"] >= GOALS["worst"],
        "tuning_s": tuning_s <= GOALS["tuning_s"],
    }
    return summary


def _met(ok: bool) -> str:
    return "✓" if ok else "✗"


def _shapes_text(shapes: Sequence[int], dim: str = "M") -> str:
    """'1..64, then every 4th to 512' style, or the explicit list when short."""
    if len(shapes) <= 8:
        return ",".join(map(str, shapes))
    steps = {b - a for a, b in itertools.pairwise(shapes)}
    if steps == {1}:
        return f"every {dim} 1..{shapes[-1]}"
    dense_end = next((a for a, b in itertools.pairwise(shapes) if b - a > 1), shapes[-1])
    stride = max(steps)
    return f"every {dim} 1..{dense_end}, then every {stride}th to {shapes[-1]} ({len(shapes)} {dim})"


def _stripped(env: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in env.items()) or "none were set"


def markdown(data: dict[str, Any]) -> str:
    env = data["machine"]
    lines = [
        "# uKernel layer table (issue 22)",
        "",
        f"Command: `{data['command']}`",
        "",
        f"Machine: {env['cpu_model']}, {env['cores']} cores; load average {env['loadavg_start']} at the start, "
        f"{env['loadavg_end']} at the end; other processes used {env['other_load']:.0%} of the CPU while measuring"
        + (" — **busy machine, timings unreliable**" if env["other_load"] >= 0.05 else "")
        + ".",
        f"Threads: TVM {env['tvm_threads']}, numpy/OpenBLAS and torch set to the same; "
        f"{env['blas']}; torch {env['torch']}; TVM {env['tvm']}; "
        f"removed from the environment: {_stripped(env['stripped_env'])}.",
        "",
        "Ratios are vendor / ours (> 1: the uKernel dispatcher is faster); the vendor at each M (dense) or T "
        "(batch_matmul) or N (conv2d) is the faster of "
        f"numpy and PyTorch (medians of {data['rounds']} interleaved rounds, more at an M re-timed below "
        f"{CONFIRM_BELOW}). Goals (issue 22, per layer): geomean ≥ {GOALS['geomean']}×, no M below "
        f"{GOALS['worst']}×, tuning ≤ {GOALS['tuning_s']:.0f} s.",
        "",
        "| layer | shape | M (T) measured | geomean vs faster vendor | worst (M) | M < 0.95× | geomean vs numpy / torch"
        " | tuning s | dispatch overhead µs (selection ns) | max abs err vs torch | goals geomean / worst / tuning |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in data["layers"]:
        s, ov = res["summary"], res["overhead"]
        over = [v["overhead_s"] * 1e6 for v in ov.values()]
        sel = [v["selection_ns"] for v in ov.values()]
        g, dim = s["goals"], res["dim"]
        lines.append(
            f"| {res['name']} | {res['shape']} "
            f"| {_shapes_text([r['S'] for r in res['rows']], dim)} | **{s['geomean']:.2f}×** "
            f"| {s['worst']:.2f}× ({dim}={s['worst_S']}, {s['worst_route']}) | {len(s['below_0_95'])} "
            f"| {s['geomean_vs_numpy']:.2f}× / {s['geomean_vs_torch']:.2f}× | {s['tuning_s']:.1f} "
            f"| {min(over):.1f}–{max(over):.1f} ({max(sel):.0f}) | {s['max_abs_err_vs_torch']:.1e} "
            f"| {_met(g['geomean'])} {_met(g['worst'])} {_met(g['tuning_s'])} |"
        )
    lines += ["", "Per layer:", ""]
    for res in data["layers"]:
        s, t, dim = res["summary"], res["tuning"], res["dim"]
        below = s["below_0_95"]
        lines.append(
            f"- `{res['name']}`: uKernels {', '.join(t['ukernels']) or 'none'}; {s['vendor_routed_S']} of "
            f"{s['shapes']} measured {dim} routed to a vendor library by the table, {s['torch_routed_S']} of them to "
            f"PyTorch (intervals {t['vendor_intervals']}); "
            f"torch was the faster vendor at "
            f"{s['torch_faster_S']} {dim}; {dim} below 0.95×: {below[:20]}{' …' if len(below) > 20 else ''}; "
            f"job's own account {t['job_seconds']:.1f} s; "
            f"numpy's max abs err vs torch {s['numpy_max_abs_err_vs_torch']:.1e}"
        )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", default=",".join(ALL_LAYERS), help=f"comma-separated, of {', '.join(ALL_LAYERS)}")
    p.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK} unless given explicitly")
    p.add_argument("--s-max", type=int, default=None, help="cap every layer's range at 1..S_MAX")
    p.add_argument("--s-max-scale", type=float, default=1.0, help="scale every layer's S_max (e.g. 0.25)")
    p.add_argument("--every-upto", type=int, default=64, help="measure every M up to here (default 64)")
    p.add_argument("--stride", type=int, default=1, help="then every stride-th M (default 1: every M)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per M (default 5)")
    p.add_argument("--min-sample-ms", type=float, default=None, help="each sample lasts at least this (default 5)")
    p.add_argument("--confirm", type=int, default=1, help=f"extra sets of rounds at an M below {CONFIRM_BELOW}×")
    p.add_argument(
        "--no-settle",
        dest="settle",
        action="store_false",
        help="do not wait for the previous library's spinning threads (torch's OpenMP) before a sample",
    )
    p.add_argument("--max-ukernels", type=int, default=BUDGET_UKERNELS, help="the job's budget trials (default 8)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="results; the markdown goes next to it (.md)")
    args = p.parse_args(argv)
    quick_defaults = QUICK if args.quick else {}
    if args.s_max is None:
        args.s_max = quick_defaults.get("s_max")
    if args.rounds is None:
        args.rounds = quick_defaults.get("rounds", 5)
    if args.min_sample_ms is None:
        args.min_sample_ms = quick_defaults.get("min_sample_ms", 5.0)
    args.layers = [name for name in args.layers.split(",") if name]
    unknown = sorted(set(args.layers) - set(ALL_LAYERS))
    if unknown or not args.layers:
        p.error(f"unknown layers {unknown}; choose from {', '.join(ALL_LAYERS)}")
    if args.rounds < 1 or args.stride < 1 or args.every_upto < 0 or args.s_max_scale <= 0 or args.confirm < 0:
        p.error("--rounds and --stride must be ≥ 1, --every-upto and --confirm ≥ 0, --s-max-scale > 0")
    if args.s_max is not None and args.s_max < 1:
        p.error("--s-max must be ≥ 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    from common import OtherLoad, blas_info, host_info, set_vendor_threads, torch_info, write_json

    command = shlex.join(["python", os.path.relpath(sys.argv[0]), *argv])
    info = host_info()
    threads = info["tvm_threads"]
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    print(f"command: {command}")
    print(f"machine: {info['cpu_model']}, {info['cores']} cores, load average {loadavg_start} at the start")
    print(f"removed from the environment: {_stripped(info['stripped_env'])}; TVM threads {threads}")
    import torch

    set_vendor_threads(torch, threads)
    blas = "; ".join(
        f"{b['internal_api']} {b['version']} ({b['architecture']} kernel, {b['num_threads']} threads)"
        for b in blas_info()
        if b["user_api"] == "blas"
    )
    tinfo = torch_info(torch)
    print(f"numpy BLAS: {blas}; torch {tinfo['version']} ({tinfo['num_threads']} threads, {tinfo['blas_info']})")
    data: dict[str, Any] = {"command": command, "rounds": args.rounds, "layers": []}
    load = OtherLoad()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kf-ukernel-layers-") as tmp, torch.inference_mode():
        for name in args.layers:
            layer = COVERED[name]
            dim = layer.dim
            s_max = layer_s_max(layer, args)
            shapes = measured_shapes(s_max, args.every_upto, args.stride)
            print(f"{name}: {layer.shape_text(s_max)}, {len(shapes)} {dim} measured")
            d, tuning = layer.tune(s_max, args, Path(tmp) / name)
            bench = layer.bench(torch, d)
            rows = measure_rows(bench.at, shapes, dim, args)
            overhead = dispatch_overhead(bench.probe, sorted({1, max(1, s_max // 2), s_max}))
            res = {**asdict(layer), "dim": dim, "shape": layer.shape_text(s_max)}
            res.update(s_max=s_max, tuning=tuning, rows=rows, overhead=overhead)
            res["summary"] = summarize(rows, tuning["wall_s"])
            s = res["summary"]
            print(
                f"  => geomean {s['geomean']:.2f}× vs the faster vendor (numpy {s['geomean_vs_numpy']:.2f}×, "
                f"torch {s['geomean_vs_torch']:.2f}×), worst {s['worst']:.2f}× at {dim}={s['worst_S']} "
                f"({s['worst_route']}), "
                f"{len(s['below_0_95'])} {dim} below 0.95×; tuning {s['tuning_s']:.1f} s; max abs err vs torch "
                f"{s['max_abs_err_vs_torch']:.1e}; dispatch overhead "
                + ", ".join(
                    f"{dim}={S}: {v['overhead_s'] * 1e6:.1f} µs (selection {v['selection_ns']:.0f} ns)"
                    for S, v in overhead.items()
                ),
            )
            data["layers"].append(res)
            data["machine"] = {
                **info,
                "loadavg_start": loadavg_start,
                "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                "other_load": load.fraction(),
                "blas": blas,
                "torch": f"{tinfo['version']} ({tinfo['blas_info']})",
            }
            data["elapsed_s"] = time.perf_counter() - started
            write_json(args.json, data)  # after every layer: a cut-off run keeps what it measured
    md = args.json.with_suffix(".md")
    md.write_text(markdown(data))
    m = data["machine"]
    print(f"load average {m['loadavg_end']} at the end; other processes used {m['other_load']:.0%} of the CPU")
    print(f"wrote {args.json} and {md} in {data['elapsed_s']:.0f} s")
    print()
    print(md.read_text())


if __name__ == "__main__":
    main()
