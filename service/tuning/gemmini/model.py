"""BACO's analytical latency/energy model (thesis Table 6.2, constants Table 6.3), for Gemmini.

Memory levels: 0 = PE registers, 1 = accumulator, 2 = scratchpad, 3 = DRAM. Per DRAM-level tile (one
iteration of gemmini.h's outer loops) every level's read and write volume divided by its bandwidth gives
its latency; the tile takes max(compute, reads, writes) (BACO assumes perfect overlap, which is what WS
double-buffering buys) and the layer takes that times the sequential trip count, plus the first load and
the last store that nothing overlaps. OS matmuls in gemmini.h are not double-buffered, so their loads,
compute and stores add up instead (convs run WS only). Each layer runs with one dataflow: the array's, or on
a BOTH array the better of WS and OS for that layer (`layer_cost`).
Energy = padded MACs × EPA_PE + Σ accesses(level) × EPA(level), in pJ; a word is an int8 element (int32
in the accumulator). Compute counts the MACs the array really performs: channels padded to DIM,
so an oversized array pays for idle PEs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from service.tuning.gemmini.space import (
    DIMS,
    HwConfig,
    Layer,
    LayerFlow,
    Mapping,
    candidate_flows,
    ceil_to,
    double_buffered,
    fitting_flows,
)

# Table 6.3
EPA_PE = 0.561
EPA_REG = 0.487
EPA_DRAM = 100.0


def epa_acc(hw: HwConfig) -> float:
    return 1.94 + 0.1005 * hw.acc_kib / hw.dim  # C_1 in KiB, √N_PE = DIM


def epa_spad(hw: HwConfig) -> float:
    return 0.49 + 0.025 * hw.sp_kib


def bandwidths(hw: HwConfig) -> dict[int, float]:
    """Words per cycle per level: registers 2·N_PE, accumulator and scratchpad 2·√N_PE, DRAM the DMA bus
    (Table 6.3 fixes DRAM at 8 words/cycle; here the bus width is a search knob: dma_buswidth/8 bytes)."""
    d = hw.dim
    return {0: 2.0 * d * d, 1: 2.0 * d, 2: 2.0 * d, 3: hw.dma_buswidth / 8}


@dataclass(frozen=True)
class Cost:
    cycles: float
    energy_pj: float
    macs: int  # useful MACs
    padded_macs: float
    accesses: dict[int, float] = field(default_factory=dict)  # words per level
    bound: str = ""  # what limits a steady-state tile: compute / scratchpad / accumulator / dram
    dataflow: LayerFlow = "WS"  # the dataflow the layer ran with (on a BOTH array: the better of the two)

    @property
    def edp(self) -> float:
        return self.cycles * self.energy_pj


# a correction applied to each dataflow's Cost before the flow is chosen (a calibration to a backend)
Adjust = Callable[[HwConfig, Layer, Cost], Cost]
# what a search scores one layer with: `layer_cost`, or a calibrated version of it
LayerCostFn = Callable[[HwConfig, Layer, Mapping], Cost]


def layer_cost(hw: HwConfig, layer: Layer, m: Mapping, adjust: Adjust | None = None) -> Cost:
    """The model's cycles and energy for `layer` on `hw` under mapping `m` (assumes `fit` passed). With no
    dataflow pinned on the mapping, a BOTH array runs the layer with whichever of WS/OS that fits gives the
    lower EDP (the per-layer choice gemmini.h's callers make through tiled_matmul_type), each flow's cost
    corrected by `adjust` first where one is given."""
    flows = fitting_flows(hw, layer, m) or list(candidate_flows(hw, layer, m)) or ["WS"]
    costs = (flow_cost(hw, layer, m, f) for f in flows)
    return min(costs if adjust is None else (adjust(hw, layer, c) for c in costs), key=lambda c: c.edp)


def resolve(hw: HwConfig, layer: Layer, m: Mapping) -> Mapping:
    """`m` with its dataflow pinned to the one `layer_cost` picks (what a backend then runs)."""
    return m if m.flow is not None else m.with_flow(layer_cost(hw, layer, m).dataflow)


def flow_cost(hw: HwConfig, layer: Layer, m: Mapping, flow: LayerFlow) -> Cost:
    """The model's cycles and energy for `layer` with tiles `m` run with dataflow `flow`."""
    d = hw.dim
    trips = {x: math.ceil(layer.size(x) / m.t(x)) for x in DIMS}
    eff = {x: layer.size(x) / trips[x] for x in DIMS}  # average tile (the last one may be partial)
    tiles = math.prod(trips.values())
    red_trips = trips["C"] * trips["R"] * trips["S"]

    # rows streamed through the array: gemmini.h pads I to DIM for addressing but issues the last block
    # with its real row count, so compute and traffic use real rows (capacity uses padded ones)
    rows = eff["N"] * eff["P"] * eff["Q"]
    cc, ck = ceil_to(math.ceil(eff["C"]), d), ceil_to(math.ceil(eff["K"]), d)
    rs = eff["R"] * eff["S"]
    in_px = (
        rows
        if layer.op == "gemm"
        else eff["N"] * layer.in_rows(math.ceil(eff["P"])) * layer.in_cols(math.ceil(eff["Q"]))
    )
    in_tile, w_tile = in_px * cc, rs * cc * ck
    padded_macs = rows * rs * cc * ck

    if flow == "WS":
        w_blocks = rs * (cc / d) * (ck / d)
        compute = w_blocks * (rows + d)  # preload a DIM×DIM weight block, stream every row through it
        sp_reads = rows * rs * cc * (ck / d) + w_tile
        acc_w = rows * ck * rs * (cc / d)  # one partial-sum pass per reduction block
        acc_r = acc_w
    else:
        out_blocks = math.ceil(rows / d) * (ck / d)
        compute = out_blocks * (rs * cc + 2 * d)  # stream the reduction, then fill/drain
        sp_reads = rows * rs * cc * (ck / d) + w_tile * math.ceil(rows / d)
        acc_w = rows * ck
        acc_r = 0.0
    sp_writes = in_tile + w_tile
    dram_r = in_tile + w_tile
    dram_w = rows * ck / red_trips  # outputs (int8) leave once per output tile
    acc_r += rows * ck / red_trips  # mvout reads the finished sums

    bw = bandwidths(hw)
    parts = {
        "compute": compute,
        "accumulator": max(acc_r, acc_w) / bw[1],
        "scratchpad": max(sp_reads, sp_writes) / bw[2],
        "dram": max(dram_r, dram_w) / bw[3],
    }
    if double_buffered(layer, flow):
        tile = max(parts.values())
        cycles = tiles * tile + dram_r / bw[3] + rows * ck / bw[3]  # first load and last store
    else:
        tile = dram_r / bw[3] + max(parts["compute"], parts["accumulator"], parts["scratchpad"]) + dram_w / bw[3]
        cycles = tiles * tile
    bound = max(parts, key=lambda k: parts[k])

    accesses = {
        0: 2.0 * padded_macs * tiles,
        1: (acc_r + acc_w) * tiles,
        2: (sp_reads + sp_writes) * tiles,
        3: (dram_r + dram_w) * tiles,
    }
    cost = Cost(cycles, 0.0, layer.macs, padded_macs * tiles, accesses, bound, flow)
    return replace(cost, energy_pj=sum(energy_terms(hw, cost).values()))


def energy_terms(hw: HwConfig, cost: Cost) -> dict[str, float]:
    """The model's energy in pJ split by where it is spent (MACs, PE registers, accumulator, scratchpad, DRAM);
    their sum is `Cost.energy_pj`. A calibration weighs them separately (calibration.py)."""
    a = cost.accesses
    return {
        "mac": cost.padded_macs * EPA_PE,
        "register": a[0] * EPA_REG,
        "accumulator": a[1] * epa_acc(hw),
        "scratchpad": a[2] * epa_spad(hw),
        "dram": a[3] * EPA_DRAM,
    }


@dataclass(frozen=True)
class NetworkCost:
    cycles: float  # Σ w_i·l_i
    energy_pj: float  # Σ w_i·e_i
    layers: list[Cost]

    @property
    def edp(self) -> float:
        """BACO Eq. 6.9: (Σ w_i e_i) × (Σ w_i l_i)."""
        return self.cycles * self.energy_pj


def network_cost(
    hw: HwConfig, layers: list[Layer], mappings: list[Mapping], cost: LayerCostFn = layer_cost
) -> NetworkCost:
    costs = [cost(hw, lay, m) for lay, m in zip(layers, mappings, strict=True)]
    return NetworkCost(
        cycles=sum(lay.weight * c.cycles for lay, c in zip(layers, costs, strict=True)),
        energy_pj=sum(lay.weight * c.energy_pj for lay, c in zip(layers, costs, strict=True)),
        layers=costs,
    )
