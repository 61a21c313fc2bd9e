"""What `kernelfleet.torch.accelerate` did to a model, per layer: on a tuned table or on PyTorch (and why), and
what each table is expected to buy.

The expected speedup comes from the job's own timings, published in the signed dispatch document
(`validation.vendor_routes.timed_s`: per timed S the medians of the tuned program, `tuned`, of each vendor library
by name, `numpy` / `torch`, of the fastest of them, `vendor`, and the `route` decided there). At each timed S the
table runs what it routed there: the uKernels (`tuned`) or that library. The speedup is PyTorch's median over
that, since PyTorch is what `accelerate` replaces; where the worker did not time PyTorch, over the fastest library
it timed. The layer's figure is the geometric mean over the timed S with its range, unweighted: the S the job
timed (a geometric grid, the hot shapes, the route boundaries), not the S this host will run. A table with no
timings (an older job, a table published by a tool) says "unknown". This module imports neither torch nor numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

UKERNEL_ROUTE = "ukernel"  # the route a timed S kept on the uKernels (service.tuning...route_stats.UKERNEL)


@dataclass(frozen=True)
class Speedup:
    """PyTorch's (or the fastest library's) time over the table's, at the S the job timed."""

    baseline: Literal["torch", "vendor"]  # vendor: the fastest library the worker timed (it had no PyTorch)
    geomean: float
    low: float
    high: float
    shapes: int  # timed S it rests on

    def describe(self) -> str:
        against = "PyTorch" if self.baseline == "torch" else "the fastest library timed"
        return f"{self.geomean:.2f}x vs {against} ({self.low:.2f}-{self.high:.2f}x over {self.shapes} timed S)"


def _seconds(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) if ok else None


def _table_seconds(entry: Mapping[str, Any], vendor_on_pytorch: bool = False) -> float | None:
    """What the table runs at this S: the uKernels where the route kept them, else the library routed to (PyTorch,
    when the layer runs vendor routes there and the worker timed it). Entries of jobs that recorded no route ran
    whichever of the two was faster."""
    tuned, vendor = _seconds(entry.get("tuned")), _seconds(entry.get("vendor"))
    if tuned is None or vendor is None:
        return None
    route = entry.get("route")
    if route is None:
        return min(tuned, vendor)
    if route == UKERNEL_ROUTE:
        return tuned
    if vendor_on_pytorch and _seconds(entry.get("torch")):
        return _seconds(entry.get("torch"))
    return _seconds(entry.get(route)) or vendor


def expected_speedup(timed_s: Mapping[str, Any] | None, vendor_on_pytorch: bool = False) -> Speedup | None:
    """The table's speedup over the job's timed S (see the module docstring); None (unknown) without timings.
    `vendor_on_pytorch`: the layer runs every vendor-routed S on PyTorch (accelerate's vendor_routes="pytorch"),
    so those S count PyTorch's time where the worker timed it."""
    entries = [e for e in (timed_s or {}).values() if isinstance(e, Mapping) and _table_seconds(e) is not None]
    if not entries:
        return None
    # one baseline for the whole layer: PyTorch only where every timed S has it, so the range compares like with like
    baseline: Literal["torch", "vendor"] = "torch" if all(_seconds(e.get("torch")) for e in entries) else "vendor"
    ratios = []
    for e in entries:
        base, ran = _seconds(e.get(baseline)), _table_seconds(e, vendor_on_pytorch)
        assert base is not None and ran is not None  # checked above
        ratios.append(base / ran)
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return Speedup(baseline, geomean, min(ratios), max(ratios), len(ratios))


@dataclass(frozen=True)
class LayerSummary:
    name: str
    workload: str  # the workload hash whose table runs the layer (on PyTorch: the most specific one asked for)
    runs_on: Literal["tables", "pytorch"]
    source: str  # where the table came from: "service" or "cache"; "none" on PyTorch
    fused: str  # the epilogue the table computes ("+ bias, gelu"); "none" on PyTorch
    reason: str | None = None  # why PyTorch runs the layer; None on a table
    speedup: Speedup | None = None  # None: unknown (on PyTorch: 1x, nothing to expect)

    def describe(self) -> str:
        name = self.name or "(the module)"  # a bare Linear accelerated is the layer named ""
        if self.runs_on == "pytorch":
            return f"{name}: PyTorch ({self.reason})"
        fused = "" if self.fused == "none" else f", fused {self.fused}"
        expected = self.speedup.describe() if self.speedup else "expected speedup unknown (the table has no timings)"
        return f"{name}: table {self.workload[:12]} from the {self.source}{fused}; {expected}"


@dataclass(frozen=True)
class AccelerationSummary:
    """`accelerate`'s result per layer, in the module's order. `str()` gives the text `accelerate` prints."""

    target: str | None  # the target fingerprint whose tables were asked for; None with no layer to accelerate
    layers: tuple[LayerSummary, ...]
    threads: str = ""  # how the forward shares the cores between PyTorch and the uKernels (kernelfleet.torch)

    @property
    def on_tables(self) -> list[LayerSummary]:
        return [layer for layer in self.layers if layer.runs_on == "tables"]

    @property
    def on_pytorch(self) -> list[LayerSummary]:
        return [layer for layer in self.layers if layer.runs_on == "pytorch"]

    def __str__(self) -> str:
        where = f" (target {self.target[:12]})" if self.target else ""
        head = (
            f"kernelfleet.accelerate{where}: {len(self.on_tables)} of {len(self.layers)} layers on tuned tables, "
            f"{len(self.on_pytorch)} on PyTorch"
        )
        threads = [f"  threads: {self.threads}"] if self.threads else []
        return "\n".join([head, *(f"  {layer.describe()}" for layer in self.layers), *threads])
