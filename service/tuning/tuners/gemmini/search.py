"""Co-exploration of Gemmini hardware and per-layer mappings under BACO's analytical model.

The budget counts analytical-model calls (one layer under one hardware config and mapping, valid or
not), so every search here is compared at equal cost. `co_explore` follows BACO's Algorithm 6 in discrete
form: from the default and from random hardware start points it tunes each layer's mapping (local moves
on the tile factors, the budget spread across layers by the importance scheduler), shrinks scratchpad and
accumulator to the minimal config the chosen tiles need ("infer minimal HW config"), then moves the
hardware to its best neighbour (array dim, capacities, bus width ×2/÷2, dataflow) while that improves the
network EDP. `random_search` samples hardware and mappings uniformly: the baseline BACO compares against;
`grid_search` walks a regular hardware grid with gemmini.h's own tiling on each point. Every hardware config
any search proposes is one Gemmini's generator can build (legality.py): samples and moves are drawn from
the legal capacities, and the evaluator refuses to score an illegal config.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from service.tuning.gemmini.gemmini_h import default_mapping
from service.tuning.gemmini.model import Cost, LayerCostFn, NetworkCost, layer_cost, network_cost, resolve
from service.tuning.gemmini.space import (
    ACC_KIB,
    ARRAY_DIMS,
    BUS_WIDTHS,
    DATAFLOWS,
    DEFAULT_HW,
    DIMS,
    SP_KIB,
    Dataflow,
    HwConfig,
    Layer,
    Mapping,
    fit,
    legal_acc_kibs,
    legal_sp_kibs,
    minimal_hw,
    tile_choices,
)
from service.tuning.tuners.gemmini.importance import ImportanceScheduler, LayerState

T = TypeVar("T")


class BudgetSpent(Exception):
    pass


@dataclass(frozen=True)
class Limits:
    """Restrictions on the hardware a search may pick, e.g. the default's 128-bit bus (BACO's Table 6.3 fixes
    DRAM bandwidth) or WS only (what the public FireSim Gemmini bitstreams, leanConfig, build)."""

    buses: tuple[int, ...] = BUS_WIDTHS
    dataflows: tuple[Dataflow, ...] = DATAFLOWS
    # e.g. area.ResourceBudget.fits: configs it rejects are never proposed (equal-resource comparisons)
    accept: Callable[[HwConfig], bool] | None = None

    def allows(self, hw: HwConfig) -> bool:
        return self.accept is None or self.accept(hw)


@dataclass
class Evaluator:
    """Counts model calls against the budget; keeps the best network point seen (the anytime answer). `cost`
    is the objective: the analytical model, or the model calibrated to a backend (calibration.py)."""

    budget: int
    cost: LayerCostFn = layer_cost
    calls: int = 0
    trace: list[tuple[int, float]] = field(default_factory=list)  # (calls so far, best network EDP)
    best: tuple[float, HwConfig, list[Mapping]] | None = None
    # the best network point the search reached on each hardware config it visited (the dashboard's scatter)
    explored: dict[HwConfig, NetworkCost] = field(default_factory=dict)
    explored_mappings: dict[HwConfig, list[Mapping]] = field(default_factory=dict)  # the mappings of `explored`

    refused: int = 0  # illegal hardware configs offered for scoring (never scored; should stay 0)

    def layer(self, hw: HwConfig, layer: Layer, m: Mapping) -> Cost | None:
        if hw.violations():
            self.refused += 1
            return None
        if self.calls >= self.budget:
            raise BudgetSpent
        self.calls += 1
        if fit(hw, layer, m) is not None:
            return None
        return self.cost(hw, layer, m)

    def offer(self, hw: HwConfig, mappings: list[Mapping], net: NetworkCost) -> None:
        seen = self.explored.get(hw)
        if seen is None or net.edp < seen.edp:
            self.explored[hw] = net
            self.explored_mappings[hw] = list(mappings)
        if self.best is None or net.edp < self.best[0]:
            self.best = (net.edp, hw, list(mappings))
            self.trace.append((self.calls, net.edp))


@dataclass(frozen=True)
class SearchResult:
    hw: HwConfig
    mappings: list[Mapping]
    cost: NetworkCost
    calls: int
    trace: list[tuple[int, float]]
    allocation: list[int] = field(default_factory=list)  # mapping-search units per layer (importance)
    explored: dict[HwConfig, NetworkCost] = field(default_factory=dict)  # by the analytical model
    explored_mappings: dict[HwConfig, list[Mapping]] = field(default_factory=dict)  # their mappings

    def shortlist(
        self, layers: list[Layer], k: int, keep: tuple[HwConfig, ...] = ()
    ) -> list[tuple[HwConfig, list[Mapping]]]:
        """The k explored hardware configs of lowest model EDP with their mappings (each layer's dataflow pinned),
        best first, then those of `keep` the search explored (e.g. its start, the default): what a measuring
        backend re-ranks (tuners/gemmini/backend_pick.py)."""
        ranked = sorted(self.explored, key=lambda hw: self.explored[hw].edp)[:k]
        ranked += [hw for hw in keep if hw in self.explored and hw not in ranked]
        return [
            (hw, [resolve(hw, lay, m) for lay, m in zip(layers, self.explored_mappings[hw], strict=True)])
            for hw in ranked
        ]


def _result(ev: Evaluator, layers: list[Layer], allocation: list[int] | None = None) -> SearchResult:
    if ev.best is None:
        raise RuntimeError(f"no valid hardware/mapping point found in {ev.calls} model calls")
    _, hw, maps = ev.best
    maps = [resolve(hw, lay, m) for lay, m in zip(layers, maps, strict=True)]  # each layer's dataflow pinned
    return SearchResult(
        hw,
        maps,
        network_cost(hw, layers, maps, ev.cost),
        ev.calls,
        ev.trace,
        allocation or [],
        ev.explored,
        ev.explored_mappings,
    )


# -- mappings under one hardware config ---------------------------------------------------------------
def _neighbour(hw: HwConfig, layer: Layer, m: Mapping, rng: random.Random) -> Mapping:
    """One or two tile factors moved one step along their choices (two in opposite directions lets a
    search slide along the capacity boundary)."""
    dims = [d for d in DIMS if len(tile_choices(hw, layer, d)) > 1]
    if not dims:
        return m
    moves = 2 if len(dims) > 1 and rng.random() < 0.4 else 1
    out = m
    sign = rng.choice((-1, 1))
    for d in rng.sample(dims, moves):
        choices = tile_choices(hw, layer, d)
        cur = min(range(len(choices)), key=lambda j: abs(choices[j] - out.t(d)))
        nxt = min(max(cur + sign, 0), len(choices) - 1)
        out = out.with_tile(d, choices[nxt])
        sign = -sign
    return out


def _line(hw: HwConfig, layer: Layer, m: Mapping, rng: random.Random) -> list[Mapping]:
    """Every choice of one randomly picked tile factor, the others fixed (a coordinate line search)."""
    dims = [d for d in DIMS if len(tile_choices(hw, layer, d)) > 1]
    if not dims:
        return []
    d = rng.choice(dims)
    return [m.with_tile(d, v) for v in tile_choices(hw, layer, d) if v != m.t(d)]


def project(hw: HwConfig, layer: Layer, m: Mapping) -> Mapping:
    """A mapping carried to another config: matmul tiles rounded to the new DIM (within the padded dim), the
    dataflow left for the new array to choose."""
    m = m.with_flow(None)
    if layer.op != "gemm":
        return m
    out = m
    for d in ("N", "C", "K"):
        padded = -(-layer.size(d) // hw.dim) * hw.dim
        out = out.with_tile(d, min(max(hw.dim, -(-m.t(d) // hw.dim) * hw.dim), padded))
    return out


def _start_mapping(hw: HwConfig, layer: Layer, prev: Mapping | None, ev: Evaluator) -> tuple[Mapping, Cost | None]:
    """The better of the previous config's mapping (projected) and gemmini.h's heuristic on this config."""
    options = [default_mapping(hw, layer)]
    if prev is not None:
        options.insert(0, project(hw, layer, prev))
    best: tuple[Mapping, Cost | None] = (options[0], None)
    for m in options:
        c = ev.layer(hw, layer, m)
        if c is not None and (best[1] is None or c.edp < best[1].edp):
            best = (m, c)
    return best


def tune_mappings(
    hw: HwConfig,
    layers: list[Layer],
    ev: Evaluator,
    calls: int,
    rng: random.Random,
    start: list[Mapping] | None = None,
) -> tuple[list[Mapping], list[Cost | None], list[int]]:
    """Each layer's best mapping on `hw` within `calls` model calls, the budget spread by importance."""
    starts = [_start_mapping(hw, lay, start[i] if start else None, ev) for i, lay in enumerate(layers)]
    maps = [m for m, _ in starts]
    costs: list[Cost | None] = [c for _, c in starts]
    sched = ImportanceScheduler(
        [LayerState(lay.weight, 2.0 * lay.macs, (lay.op, lay.R, lay.S, lay.stride)) for lay in layers]
    )
    stop_at = min(ev.budget, ev.calls + calls)
    while ev.calls < stop_at:
        i = sched.next_layer()
        if i is None:
            break
        # one unit: a line search over one tile factor's choices, then random local moves
        cands = [*_line(hw, layers[i], maps[i], rng), *(_neighbour(hw, layers[i], maps[i], rng) for _ in range(2))]
        for cand in cands[: stop_at - ev.calls]:  # never past this call's share of the budget
            c = ev.layer(hw, layers[i], cand)
            cur = costs[i]
            if c is not None and (cur is None or c.edp < cur.edp):
                maps[i], costs[i] = cand, c
        cur = costs[i]
        sched.record(i, cur.edp if cur is not None else math.inf)
    return maps, costs, sched.allocation()


def _network(hw: HwConfig, layers: list[Layer], maps: list[Mapping], costs: list[Cost | None]) -> NetworkCost | None:
    if any(c is None for c in costs):
        return None
    cs = [c for c in costs if c is not None]
    return NetworkCost(
        cycles=sum(lay.weight * c.cycles for lay, c in zip(layers, cs, strict=True)),
        energy_pj=sum(lay.weight * c.energy_pj for lay, c in zip(layers, cs, strict=True)),
        layers=cs,
    )


# -- hardware ------------------------------------------------------------------------------------------
def hw_neighbours(hw: HwConfig, limits: Limits = Limits()) -> list[HwConfig]:
    buses = limits.buses
    out = []
    i = ARRAY_DIMS.index(hw.dim)
    for j in (i - 2, i - 1, i + 1, i + 2):
        if 0 <= j < len(ARRAY_DIMS):
            out.append(replace(hw, dim=ARRAY_DIMS[j]))
            # tiles grow with DIM: the same move with both capacities scaled alongside (a minimal config
            # from the last step would otherwise block every move to a larger array)
            r = ARRAY_DIMS[j] / hw.dim
            sp = _nearest(legal_sp_kibs(ARRAY_DIMS[j], hw.input_bits), hw.sp_kib * r)
            acc = _nearest(legal_acc_kibs(ARRAY_DIMS[j], hw.acc_bits), hw.acc_kib * r)
            if sp and acc:
                out.append(replace(hw, dim=ARRAY_DIMS[j], sp_kib=sp, acc_kib=acc))
    b = buses.index(hw.dma_buswidth)
    for j in (b - 1, b + 1):
        if 0 <= j < len(buses):
            out.append(replace(hw, dma_buswidth=buses[j]))
    for f in (0.25, 0.5, 2.0, 4.0):  # legal capacities double: ×2^k keeps bank rows powers of two
        out.append(replace(hw, sp_kib=min(max(round(hw.sp_kib * f), SP_KIB[0]), SP_KIB[1])))
        out.append(replace(hw, acc_kib=min(max(round(hw.acc_kib * f), ACC_KIB[0]), ACC_KIB[1])))
    # both capacities at once: a larger output tile needs more scratchpad AND accumulator, and either alone
    # can be worse (on BERT's FFN at equal area the climb stalled at 16/32 KiB one such step from 32/64 KiB)
    for fs, fa in ((2.0, 2.0), (0.5, 0.5), (2.0, 0.5), (0.5, 2.0)):
        sp2 = min(max(round(hw.sp_kib * fs), SP_KIB[0]), SP_KIB[1])
        out.append(replace(hw, sp_kib=sp2, acc_kib=min(max(round(hw.acc_kib * fa), ACC_KIB[0]), ACC_KIB[1])))
    for flow in limits.dataflows:
        if flow != hw.dataflow:
            out.append(replace(hw, dataflow=flow))
    return [h for h in out if h != hw and h.problem() is None and limits.allows(h)]  # problem(): every legality rule


def _nearest(choices: list[int], target: float) -> int | None:
    return min(choices, key=lambda k: abs(math.log(k / target))) if choices and target > 0 else None


def random_hw(rng: random.Random, limits: Limits = Limits()) -> HwConfig:
    """A uniformly drawn legal config: array dim, then a scratchpad and an accumulator among the capacities
    that array can have (log-uniform, since they double), dataflow and bus; redrawn until the scratchpad's
    usable tiles cover the accumulator's (GemminiConfigs.scala L257)."""
    while True:
        dim = rng.choice(ARRAY_DIMS)
        sps, accs = legal_sp_kibs(dim), legal_acc_kibs(dim)
        if not sps or not accs:
            continue
        hw = HwConfig(
            dim=dim,
            sp_kib=rng.choice(sps),
            acc_kib=rng.choice(accs),
            dataflow=rng.choice(limits.dataflows),
            dma_buswidth=rng.choice(limits.buses),
        )
        if hw.problem() is None and limits.allows(hw):
            return hw


def _evaluate_hw(
    hw: HwConfig, layers: list[Layer], ev: Evaluator, calls: int, rng: random.Random, start: list[Mapping] | None
) -> tuple[HwConfig, list[Mapping], NetworkCost | None, list[int]]:
    maps, costs, alloc = tune_mappings(hw, layers, ev, calls, rng, start)
    net = _network(hw, layers, maps, costs)
    if net is None:
        return hw, maps, None, alloc
    ev.offer(hw, maps, net)
    small = minimal_hw(hw, layers, maps)
    if small != hw:
        small_costs = [ev.layer(small, lay, m) for lay, m in zip(layers, maps, strict=True)]
        small_net = _network(small, layers, maps, small_costs)
        if small_net is not None and small_net.edp < net.edp:
            ev.offer(small, maps, small_net)
            return small, maps, small_net, alloc
    return hw, maps, net, alloc


def co_explore(
    layers: list[Layer],
    budget: int,
    seed: int = 0,
    start_hw: HwConfig = DEFAULT_HW,
    progress: Callable[[int, float], None] | None = None,
    limits: Limits = Limits(),
    cost: LayerCostFn = layer_cost,
) -> SearchResult:
    """Hardware and mappings co-tuned for the occurrence-weighted network EDP within `budget` model calls.

    Iterated local search: a screening pass scores a strided sample of the hardware grid with gemmini.h's own
    tiling (at most SCREEN_SHARE of the budget), then the search hill-climbs the hardware from `start_hw`
    (BACO starts from the default), from the best screened points, then from random hardware points (BACO's
    random start points) until the budget is spent. `limits` restricts the hardware (see Limits); `start_hw`
    must satisfy them. `cost` scores each layer (the analytical model unless calibrated)."""
    outside = start_hw.dma_buswidth not in limits.buses or start_hw.dataflow not in limits.dataflows
    if outside or not limits.allows(start_hw):
        raise ValueError(f"start_hw {start_hw} is outside the limits {limits}")
    rng = random.Random(seed)
    ev = Evaluator(budget, cost)
    per_hw = max(8 * len(layers), min(60 * len(layers), budget // 60))
    alloc: list[int] = [0] * len(layers)
    seen: set[HwConfig] = set()

    def add(a: list[int]) -> None:
        alloc[:] = [x + y for x, y in zip(alloc, a, strict=True)]

    try:
        # Without the screen, a network of many layers spends its budget climbing from the default and a few
        # random points: on ResNet-50 at the default's area it lost to a plain grid (0.41x worst of 5 seeds).
        grid_cost = len(hw_grid(limits)) * len(layers)  # the whole grid, one gemmini.h-tiled call per layer
        share = budget * (SCREEN_FULL_SHARE if grid_cost <= budget * SCREEN_FULL_SHARE else SCREEN_SHARE)
        starts = [start_hw, *_screen(layers, ev, rng, limits, int(share))]
        hw0 = starts.pop(0)
        while ev.calls < budget:
            seen.add(hw0)
            hw, maps, net, a = _evaluate_hw(hw0, layers, ev, per_hw, rng, None)
            add(a)
            while net is not None:  # first-improvement hill climbing on the hardware
                moved = False
                neighbours = hw_neighbours(hw, limits)
                rng.shuffle(neighbours)
                for cand in neighbours:
                    if cand in seen:
                        continue
                    seen.add(cand)
                    h2, m2, n2, a = _evaluate_hw(cand, layers, ev, per_hw // 3, rng, maps)
                    add(a)
                    if n2 is not None and n2.edp < net.edp:
                        hw, maps, net, moved = h2, m2, n2, True
                        seen.add(hw)
                        if progress:
                            progress(ev.calls, net.edp)
                        break
                if not moved:
                    break
            if net is not None:  # polish the local optimum's mappings
                maps2, costs2, a = tune_mappings(hw, layers, ev, per_hw, rng, maps)
                add(a)
                n2 = _network(hw, layers, maps2, costs2)
                if n2 is not None:
                    ev.offer(hw, maps2, n2)
            fresh = [h for h in starts if h not in seen]
            starts = fresh[1:]
            hw0 = fresh[0] if fresh else random_hw(rng, limits)
    except BudgetSpent:
        pass
    return _result(ev, layers, alloc)


SCREEN_SHARE = 0.25  # of co_explore's budget, for scoring a strided sample of the grid with gemmini.h's tiling
SCREEN_FULL_SHARE = 0.7  # ...or the whole grid when it costs at most this share; the climb starts from its best
SCREEN_STARTS = 3  # the best screened configs the local search starts from


def _screen(layers: list[Layer], ev: Evaluator, rng: random.Random, limits: Limits, calls: int) -> list[HwConfig]:
    """The SCREEN_STARTS best configs of a strided sample of `hw_grid(limits)`, each scored with gemmini.h's
    own tiling (one call per layer), best first; every scored point is offered to the evaluator."""
    grid = hw_grid(limits)
    scored: list[tuple[float, HwConfig]] = []
    for hw in strided(grid, calls // max(1, len(layers)), rng.random()):
        net = _score_library_tiling(hw, layers, ev)
        if net is not None:
            scored.append((net.edp, hw))
    return [hw for _, hw in sorted(scored, key=lambda x: x[0])[:SCREEN_STARTS]]


def strided(grid: list[T], visits: int, phase: float) -> list[T]:
    """`visits` points evenly strided through `grid` (all of it when they cover it), `phase` in [0, 1) picking
    the offset inside the first stride."""
    visits = min(len(grid), visits)
    if visits <= 0:
        return []
    stride = len(grid) / visits
    return [grid[i] for i in sorted({int((phase + k) * stride) % len(grid) for k in range(visits)})]


def _score_library_tiling(hw: HwConfig, layers: list[Layer], ev: Evaluator) -> NetworkCost | None:
    """The network on `hw` with gemmini.h's own tiling of every layer, offered to the evaluator."""
    maps = [default_mapping(hw, lay) for lay in layers]
    net = _network(hw, layers, maps, [ev.layer(hw, lay, m) for lay, m in zip(layers, maps, strict=True)])
    if net is not None:
        ev.offer(hw, maps, net)
    return net


def random_mapping(hw: HwConfig, layer: Layer, rng: random.Random) -> Mapping:
    return Mapping({d: rng.choice(tile_choices(hw, layer, d)) for d in DIMS})


def random_search(
    layers: list[Layer], budget: int, seed: int = 0, limits: Limits = Limits(), cost: LayerCostFn = layer_cost
) -> SearchResult:
    """Uniform random hardware + mappings, `budget` model calls (one network sample = one call per layer)."""
    rng = random.Random(seed)
    ev = Evaluator(budget, cost)
    try:
        while True:
            hw = random_hw(rng, limits)
            maps = [random_mapping(hw, lay, rng) for lay in layers]
            costs = [ev.layer(hw, lay, m) for lay, m in zip(layers, maps, strict=True)]
            net = _network(hw, layers, maps, costs)
            if net is not None:
                ev.offer(hw, maps, net)
    except BudgetSpent:
        pass
    return _result(ev, layers)


def tune_fixed_hw(layers: list[Layer], hw: HwConfig, budget: int, seed: int = 0) -> SearchResult:
    """Mappings only, on a given hardware config (e.g. a single-layer-tuned config applied to a network)."""
    rng = random.Random(seed)
    ev = Evaluator(budget)
    try:
        maps, costs, alloc = tune_mappings(hw, layers, ev, budget, rng)
        net = _network(hw, layers, maps, costs)
        if net is not None:
            ev.offer(hw, maps, net)
    except BudgetSpent:
        alloc = []
    return _result(ev, layers, alloc)


def best_fixed_hw(layers: list[Layer], choices: list[HwConfig], budget: int, seed: int = 0) -> SearchResult:
    """The best of a fixed set of hardware configs (e.g. those FireSim has bitstreams for), each with its
    mappings tuned on an equal share of the budget; configs that cannot hold some layer are skipped."""
    results = []
    for hw in choices:
        try:
            share = max(len(layers) * 4, budget // max(1, len(choices)))
            results.append(tune_fixed_hw(layers, hw, share, seed))
        except RuntimeError:
            continue
    if not results:
        raise RuntimeError(f"none of the {len(choices)} available hardware configs can hold every layer's tiles")
    return min(results, key=lambda r: r.cost.edp)


def hw_grid(limits: Limits = Limits()) -> list[HwConfig]:
    """The full hardware grid: every array dim, every legal scratchpad and accumulator capacity, every dataflow
    and bus width the limits allow; legal points within the limits only. (It took every other capacity before
    issue 36 item 4, which skipped the default's own 256/64 KiB.)"""
    out = []
    for dim in ARRAY_DIMS:
        for sp in legal_sp_kibs(dim):
            for acc in legal_acc_kibs(dim):
                for flow in limits.dataflows:
                    for bus in limits.buses:
                        hw = HwConfig(dim=dim, sp_kib=sp, acc_kib=acc, dataflow=flow, dma_buswidth=bus)
                        if hw.problem() is None and limits.allows(hw):
                            out.append(hw)
    return out


def grid_search(
    layers: list[Layer], budget: int, seed: int = 0, limits: Limits = Limits(), cost: LayerCostFn = layer_cost
) -> SearchResult:
    """A simple grid at `budget` model calls: hardware points of `hw_grid` (evenly strided through the grid
    when the budget cannot visit all, the offset set by `seed`), each scored with gemmini.h's own tiling
    (one call per layer)."""
    picks = strided(hw_grid(limits), max(1, budget // max(1, len(layers))), random.Random(seed).random())
    ev = Evaluator(budget, cost)
    try:
        for hw in picks:
            _score_library_tiling(hw, layers, ev)
    except BudgetSpent:
        pass
    return _result(ev, layers)
