"""Shape distributions over a workload's symbolic dimensions.

Every form discretises to a finite, weighted support: the concrete shapes the service reasons about
(hot-shape selection, fleet usage). Supports are bounded so no request can make a worker enumerate
an unbounded range.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.models.fields import DimName, Real, Shape, Size, SizeKey
from service.models.shape import shape_key

MAX_SUPPORT = 4096
Weighted = list[tuple[dict[str, int], float]]


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _require_finite_total(weights: Iterable[float]) -> None:
    """Each weight is finite, but their sum (or product) may not be: two weights of 1e308 add to infinity, and
    normalising by it gives NaN priorities downstream (issue 34 item 3: a 500 on POST /v1/models)."""
    if not math.isfinite(sum(weights)):  # not fsum: it raises OverflowError instead of returning inf
        raise ValueError("the weights add up to more than a float can hold: scale them down")


class _Range(_Base):
    dim: DimName
    low: Size
    high: Size

    @model_validator(mode="after")
    def _ordered(self) -> _Range:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        if self.high - self.low + 1 > MAX_SUPPORT:
            raise ValueError(f"range {self.low}..{self.high} has more than {MAX_SUPPORT} values")
        return self

    def _values(self) -> range:
        return range(self.low, self.high + 1)


class ShapePoint(_Base):
    shape: Shape
    weight: Real = Field(default=1.0, gt=0)


class Explicit(_Base):
    """Listed shapes with weights; the only form that gives a joint distribution over several dims."""

    kind: Literal["explicit"] = "explicit"
    points: list[ShapePoint] = Field(min_length=1, max_length=MAX_SUPPORT)

    @model_validator(mode="after")
    def _finite_total(self) -> Explicit:
        _require_finite_total(w.weight for w in self.points)
        return self

    def support(self) -> Weighted:
        merged: dict[str, tuple[dict[str, int], float]] = {}
        for p in self.points:
            key = shape_key(p.shape)
            merged[key] = (dict(p.shape), merged.get(key, (p.shape, 0.0))[1] + p.weight)
        return list(merged.values())


class Uniform(_Range):
    kind: Literal["uniform"] = "uniform"

    def support(self) -> Weighted:
        return [({self.dim: v}, 1.0) for v in self._values()]


class Normal(_Range):
    """A normal distribution truncated to [low, high] and rounded to integers."""

    kind: Literal["normal"] = "normal"
    mean: Real
    std: Real = Field(gt=0)

    def support(self) -> Weighted:
        # z·z, not z ** 2: a far mean or a tiny std makes z huge, and ** raises OverflowError where · gives inf
        z = [(v - self.mean) / self.std for v in self._values()]
        out = [({self.dim: v}, math.exp(-0.5 * zv * zv)) for v, zv in zip(self._values(), z, strict=True)]
        return [(s, w) for s, w in out if w > 1e-12] or [
            ({self.dim: min(self._values(), key=lambda v: abs(v - self.mean))}, 1.0)
        ]


class Zipf(_Range):
    """P(v) ∝ (v - low + 1)^-s on [low, high]: small values are the most common."""

    kind: Literal["zipf"] = "zipf"
    s: Real = Field(default=1.1, gt=0, le=10)

    def support(self) -> Weighted:
        return [({self.dim: v}, (v - self.low + 1) ** -self.s) for v in self._values()]


class Histogram(_Base):
    """Observed counts per value of one dimension, e.g. from inference telemetry."""

    kind: Literal["histogram"] = "histogram"
    dim: DimName
    counts: dict[SizeKey, Annotated[Real, Field(ge=0)]] = Field(min_length=1, max_length=MAX_SUPPORT)

    @model_validator(mode="after")
    def _some_mass(self) -> Histogram:
        if not any(c > 0 for c in self.counts.values()):
            raise ValueError("histogram counts must not all be zero")
        _require_finite_total(self.counts.values())
        return self

    def support(self) -> Weighted:
        return [({self.dim: v}, c) for v, c in sorted(self.counts.items()) if c > 0]


Marginal = Annotated[Uniform | Normal | Zipf | Histogram, Field(discriminator="kind")]


class Independent(_Base):
    """Product of per-dimension distributions, for workloads with several symbolic dims."""

    kind: Literal["independent"] = "independent"
    factors: list[Marginal] = Field(min_length=1, max_length=4)

    @model_validator(mode="after")
    def _distinct(self) -> Independent:
        dims = [f.dim for f in self.factors]
        if len(set(dims)) != len(dims):
            raise ValueError("each factor must cover a different dimension")
        if math.prod(len(f.support()) for f in self.factors) > MAX_SUPPORT:
            raise ValueError(f"the product support exceeds {MAX_SUPPORT} shapes")
        _require_finite_total(w for _, w in self.support())
        return self

    def support(self) -> Weighted:
        out: Weighted = []
        for combo in itertools.product(*(f.support() for f in self.factors)):
            shape: dict[str, int] = {}
            weight = 1.0
            for s, w in combo:
                shape.update(s)
                weight *= w
            out.append((shape, weight))
        return out


ShapeDistribution = Annotated[Explicit | Uniform | Normal | Zipf | Histogram | Independent, Field(discriminator="kind")]


def dims_of(dist: Explicit | Uniform | Normal | Zipf | Histogram | Independent) -> set[str]:
    if isinstance(dist, Independent):
        return {f.dim for f in dist.factors}
    if isinstance(dist, Explicit):
        return set().union(*(p.shape for p in dist.points))
    return {dist.dim}


def normalized_support(dist: Explicit | Uniform | Normal | Zipf | Histogram | Independent) -> Weighted:
    """The support with weights summing to 1."""
    support = dist.support()
    total = sum(w for _, w in support)
    return [(s, w / total) for s, w in support]
