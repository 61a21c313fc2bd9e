"""Gemmini co-tuning (BACO) vs Gemmini-Default, measured by ZigZag.

For a subset of the thesis's GEMM/GEMV/conv shapes: the co-tuned hardware + mapping against the default
config (16×16, 256 KiB scratchpad, 64 KiB accumulator, gemmini.h's default tiling), both scored by ZigZag
(the `zigzag` backend, fixed mappings); then ResNet-50 and BERT-base layer lists co-tuned as networks against
the best single-layer-tuned hardware. Co-tuning is what the job runs (tuners/gemmini/cotune.py): a model search,
a second one on the model calibrated to ZigZag per layer family and dataflow, ZigZag picking the winner among
both shortlists and the default. Then: how well model and calibrated model agree with ZigZag per layer on
held-out configs; co-exploration vs random search vs a grid at equal model-call budgets (analytical model);
and the analytical model's cycle correlation with ZigZag over every measured point. Every contender, the
default included, runs each layer in the dataflow ZigZag measures fastest for it (on a BOTH array: WS or OS,
each with its own tiling), so no baseline is shown in a dataflow it would not pick.

    PYTHONPATH=. python bench/gemmini_cotune.py [--budget 3000] [--area-budget default|unconstrained] [--json out.json]
    PYTHONPATH=. python bench/gemmini_cotune.py --compare-only [--budget 3000] [--seeds 5]
    PYTHONPATH=. python bench/gemmini_cotune.py --compare-backend --area-budget default [--seeds 5]

--area-budget default keeps every searched config within the default config's area (area.py, CACTI 7 at 45 nm)
and its 128-bit bus: an equal-resource comparison. unconstrained (the default, as before) lets the search grow
the hardware; its gains are labelled "unconstrained" since they buy area.

--compare-only runs just the search comparison at equal model calls: co-exploration vs random search vs a
simple grid (hardware grid × gemmini.h's own tiling) on the analytical model, per benchmark layer and network,
over several seeds; it reports each baseline's best EDP over co-exploration's (>1: co-exploration found the
lower EDP), as a geomean and worst case over seeds, and Gemmini-Default (gemmini.h's tiling) likewise.

--compare-backend runs the comparison at equal ZigZag evaluations (issue 36 item 4): co-tuning as the job runs
it against random search and the full grid, each spending on ZigZag directly as many points as co-tuning
measured (backend_search.py); every EDP is ZigZag's. Every config any search scores is one Gemmini's generator
accepts (legality.py).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from typing import Any

from service.tuning.gemmini.area import RECALLED, UNCONSTRAINED, config_area_mm2, default_budget, recalled_scaled
from service.tuning.gemmini.backends import Measurement, get_backend
from service.tuning.gemmini.gemmini_h import default_point
from service.tuning.gemmini.model import layer_cost, network_cost
from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, Layer, Mapping
from service.tuning.gemmini.workloads import BERT, RESNET50, SINGLE_OPS
from service.tuning.tuners.gemmini.backend_pick import SHORTLIST
from service.tuning.tuners.gemmini.backend_search import backend_grid, backend_random
from service.tuning.tuners.gemmini.best_flow import default_options, flow_options, measured_best
from service.tuning.tuners.gemmini.calibration import agreement, calibration_sample, correlate
from service.tuning.tuners.gemmini.cotune import cotune
from service.tuning.tuners.gemmini.search import (
    Limits,
    co_explore,
    grid_search,
    random_search,
    tune_fixed_hw,
)


def _net(layers: list[Layer], ms: list[Any]) -> tuple[float, float]:
    cyc = sum(lay.weight * m.cycles for lay, m in zip(layers, ms, strict=True))
    en = sum(lay.weight * m.energy_pj for lay, m in zip(layers, ms, strict=True))
    return cyc, en


def _edp(m: Measurement) -> float:
    return m.cycles * (m.energy_pj if m.energy_pj is not None else math.nan)


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _row(co: list[float], rnd: list[float], grd: list[float], default_edp: float) -> dict[str, Any]:
    """One case of a search comparison: each baseline's best EDP over co-exploration's, per seed."""
    r_ratio = [r / c for r, c in zip(rnd, co, strict=True)]
    g_ratio = [g / c for g, c in zip(grd, co, strict=True)]
    return {
        "co_edp": co,
        "random_edp": rnd,
        "grid_edp": grd,
        "default_edp": default_edp,
        "random_over_co": r_ratio,
        "grid_over_co": g_ratio,
        "default_over_co": [default_edp / c for c in co],
        "co_beats_both": sum(r > 1 and g > 1 for r, g in zip(r_ratio, g_ratio, strict=True)),
    }


def _columns(row: dict[str, Any], seeds: int) -> str:
    r, g, d = row["random_over_co"], row["grid_over_co"], row["default_over_co"]
    return (
        f"{_geo(r):10.2f} {min(r):6.2f} {_geo(g):9.2f} {min(g):6.2f} {_geo(d):10.2f}  {row['co_beats_both']:>3}/{seeds}"
    )


def _overall(rows: dict[str, Any], t0: float) -> None:
    all_r = [x for r in rows.values() for x in r["random_over_co"]]
    all_g = [x for r in rows.values() for x in r["grid_over_co"]]
    print(
        f"over all cases and seeds: random/co geomean {_geo(all_r):.2f} (worst {min(all_r):.2f}), "
        f"grid/co geomean {_geo(all_g):.2f} (worst {min(all_g):.2f}); {time.perf_counter() - t0:.0f} s"
    )


def compare(budget: int, seeds: int, limits: Limits = Limits(), label: str = "unconstrained") -> dict[str, Any]:
    """Co-exploration vs random search vs grid at `budget` model calls, per layer and network, `seeds` seeds,
    all three within the same `limits` (e.g. the default's area)."""
    cases: list[tuple[str, list[Layer]]] = [(lay.name, [lay]) for lay in SINGLE_OPS]
    cases += [("net:ResNet-50", RESNET50), ("net:BERT-base", BERT)]
    print(
        f"search comparison at {budget} analytical-model calls, {seeds} seeds (legal configs, {label}); "
        "ratio = baseline best EDP / co-exploration best EDP (>1: co-exploration lower)"
    )
    print(
        f"{'case':18} {'random geo':>10} {'worst':>6} {'grid geo':>9} {'worst':>6} {'default/co':>10}  "
        f"{'co wins':>7}  co-explored hw (seed 0)"
    )
    rows: dict[str, Any] = {}
    t0 = time.perf_counter()
    for name, layers in cases:
        _, default = default_point(layers)
        co, rnd, grd = [], [], []
        hw0 = None
        for seed in range(seeds):
            c = co_explore(layers, budget, seed=seed, limits=limits)
            hw0 = hw0 or c.hw
            co.append(c.cost.edp)
            rnd.append(random_search(layers, budget, seed=seed, limits=limits).cost.edp)
            grd.append(grid_search(layers, budget, seed=seed, limits=limits).cost.edp)
        assert hw0 is not None
        rows[name] = _row(co, rnd, grd, default.edp)
        print(
            f"{name:18} {_columns(rows[name], seeds)}    {hw0.dim}x{hw0.dim} sp{hw0.sp_kib}K acc{hw0.acc_kib}K "
            f"{hw0.dataflow} bus{hw0.dma_buswidth}"
        )
    _overall(rows, t0)
    return {"budget": budget, "seeds": seeds, "limits": label, "cases": rows}


def _cases() -> list[tuple[str, list[Layer], int]]:
    """(name, layers, budget multiplier): the single operators, then the two networks at the headline's budgets."""
    return [(lay.name, [lay], 1) for lay in SINGLE_OPS] + [("net:ResNet-50", RESNET50, 4), ("net:BERT-base", BERT, 2)]


def compare_backend(zz: Any, budget: int, seeds: int, limits: Limits, label: str) -> dict[str, Any]:
    """Co-tuning (cotune.py, as the job runs it) against random and grid search at the same number of backend
    evaluations (issue 36 item 4): co-tuning spends its shortlists, calibration sample and the default; random and
    grid spend as many points on ZigZag directly (backend_search.py). Every EDP is ZigZag's."""
    print(
        f"search comparison at equal ZigZag evaluations (what co-tuning measured: 2 shortlists, the calibration "
        f"sample, the default), {seeds} seeds, {label}; ratio = baseline's best measured EDP / co-tuning's "
        "(>1: co-tuning lower)"
    )
    print(
        f"{'case':22} {'evals':>5} {'random geo':>10} {'worst':>6} {'grid geo':>9} {'worst':>6} "
        f"{'default/co':>10} {'co wins':>7}"
    )
    rows: dict[str, Any] = {}
    t0 = time.perf_counter()
    for name, layers, mult in _cases():
        co, rnd, grd, evals, default_edp = [], [], [], [], math.nan
        for seed in range(seeds):
            c = cotune(zz, layers, budget * mult, seed=seed, limits=limits)
            assert c.winner.measured_edp is not None
            co.append(c.winner.measured_edp)
            default_edp = c.start.measured_edp or math.nan  # the default as gemmini.h tiles it, measured by cotune
            evals.append(c.evaluations)
            rnd.append(backend_random(zz, layers, c.evaluations, seed, limits).edp)
            grd.append(backend_grid(zz, layers, c.evaluations, seed, limits).edp)
        rows[name] = {"evaluations": evals, **_row(co, rnd, grd, default_edp)}
        print(f"{name:22} {round(sum(evals) / len(evals)):5d} {_columns(rows[name], seeds)}")
    _overall(rows, t0)
    return {"seeds": seeds, "limits": label, "cases": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=3000, help="analytical-model calls per search")
    ap.add_argument("--area-budget", choices=("default", "unconstrained"), default="unconstrained")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per search in the comparison")
    ap.add_argument("--compare-only", action="store_true", help="only the co-explore/random/grid comparison")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--area-scale",
        action="append",
        default=[],
        metavar="NAME=FACTOR",
        help=f"scale a recalled area constant ({', '.join(RECALLED)}), e.g. mac=2: the headline's robustness",
    )
    ap.add_argument("--no-compare", action="store_true", help="skip the co-explore/random/grid comparison")
    ap.add_argument(
        "--compare-backend",
        action="store_true",
        help="only the comparison at equal ZigZag evaluations (random and grid measured directly; ~20 min)",
    )

    ap.add_argument(
        "--shortlist",
        type=int,
        default=SHORTLIST,
        help="explored configs ZigZag re-ranks (the product's default; 1: the model's own pick, as before issue 36)",
    )
    args = ap.parse_args()
    scales = {name: 1.0 for name in RECALLED}
    for item in args.area_scale:
        name, _, factor = item.partition("=")
        if name not in scales:
            ap.error(f"--area-scale: {name!r} is not one of {', '.join(RECALLED)}")
        scales[name] = float(factor)
    if any(v != 1.0 for v in scales.values()):
        print("recalled area constants scaled: " + ", ".join(f"{k} x{v:g}" for k, v in scales.items()))
    with recalled_scaled(**scales):
        run(args, scales)


def _write(path: str | None, result: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def run(args: argparse.Namespace, scales: dict[str, float]) -> None:
    res_budget = default_budget() if args.area_budget == "default" else UNCONSTRAINED
    accept = res_budget.fits if args.area_budget == "default" else None
    # every search of one run shares these limits: the default's area and bus, or none (labelled unconstrained)
    budget_limits = Limits(buses=(128,), accept=accept) if accept else Limits()
    if args.compare_only:
        _write(args.json, compare(args.budget, args.seeds, budget_limits, res_budget.label))
        return
    base_area = config_area_mm2(DEFAULT_HW)
    print(
        f"resource budget: {res_budget.label}"
        + (f" (≤ {res_budget.area_mm2:.3f} mm² at {res_budget.tech_nm} nm, bus ≤ 128)" if accept else "")
        + f"; default config area {base_area:.3f} mm²"
    )
    started = time.perf_counter()
    zz = get_backend("zigzag", timeout_s=300)
    if args.compare_backend:
        _write(args.json, compare_backend(zz, args.budget, args.seeds, budget_limits, res_budget.label))
        return
    pairs: list[tuple[float, float]] = []  # (model cycles, zigzag cycles)
    out: dict[str, Any] = {
        "backend": zz.version(),
        "budget": args.budget,
        "resource_budget": res_budget.to_dict(),
        "default_area_mm2": base_area,
        "single": [],
        "network": {},
    }

    print(
        f"measured by {zz.version()} (fixed mappings); search = analytical model, {args.budget} calls each in two"
        " rounds: as published, then calibrated to ZigZag per layer family and dataflow (cotune.py)"
    )
    held_out: dict[str, Any] = {}
    # every contender runs each layer in the dataflow ZigZag measures fastest (issue 36 item 1)
    d_maps, d_meas = measured_best(zz, DEFAULT_HW, SINGLE_OPS, default_options(DEFAULT_HW, SINGLE_OPS))
    d_model = network_cost(DEFAULT_HW, SINGLE_OPS, d_maps)
    pairs += [(c.cycles, m.cycles) for c, m in zip(d_model.layers, d_meas, strict=True)]
    print(
        f"the winner: ZigZag's best of each round's {args.shortlist} best explored configs, the search's start (the"
        " default hardware, searched tiles) and the default as gemmini.h tiles it; 'model pick', 'cal. pick': each"
        " round's own best, EDP gain as ZigZag measures it; 'evals': ZigZag points spent; 'model/zz', 'E m/zz': the"
        " winner's cycles and energy, model (as published) over ZigZag"
    )
    print(
        f"{'layer':16} {'default cyc':>11} {'tuned cyc':>10} {'lat x':>6} {'EDP x':>7} {'bus128 EDP x':>12} "
        f"{'model pick':>10} {'cal. pick':>9} {'evals':>5} {'model/zz':>8} {'E m/zz':>6} {'search s':>8}  "
        "tuned hw (all knobs)"
    )
    gains: dict[str, list[float]] = {"all knobs": [], "bus fixed 128": []}
    for lay, dm in zip(SINGLE_OPS, d_meas, strict=True):
        row: dict[str, Any] = {"layer": lay.name, "default_cycles": dm.cycles, "default_energy_pj": dm.energy_pj}
        for label, limits in (
            ("all knobs", Limits(buses=(128,) if accept else Limits().buses, accept=accept)),
            ("bus fixed 128", Limits(buses=(128,), accept=accept)),
        ):
            if label == "bus fixed 128" and accept:  # equal area fixes the bus already: the same search again
                row[label] = row["all knobs"]
                gains[label].append(row[label]["edp_gain"])
                continue
            t0 = time.perf_counter()
            c = cotune(zz, [lay], args.budget, seed=0, limits=limits, shortlist=args.shortlist)
            secs = time.perf_counter() - t0
            if label == "all knobs":  # how well the calibration ranks configs it was not fitted on
                points = calibration_sample([lay], 12, 1, limits)
                held_out[lay.name] = agreement(points, zz.measure_points(points), c.calibration)[lay.name]
                row["calibration"] = c.calibration.to_dict()
            # each round's own pick (the model's, the calibrated model's), as ZigZag measures it
            own = next(m for m in c.candidates if m.hw == c.first.hw)
            own2 = next(m for m in c.candidates if m.hw == c.second.hw)
            win = c.winner
            (tm,) = win.measurements
            model = layer_cost(win.hw, lay, win.mappings[0])
            pairs.append((model.cycles, tm.cycles))
            gain = _edp(dm) / _edp(tm)
            gains[label].append(gain)
            row[label] = {
                "cycles": tm.cycles,
                "energy_pj": tm.energy_pj,
                "edp_gain": gain,
                "model_pick_edp_gain": _edp(dm) / _edp(own.measurements[0]),
                "calibrated_pick_edp_gain": _edp(dm) / _edp(own2.measurements[0]),
                "evaluations": c.evaluations,
                "model_over_zigzag_cycles": model.cycles / tm.cycles,
                "model_over_zigzag_energy": model.energy_pj / tm.energy_pj if tm.energy_pj else None,
                "search_s": secs,
                "hw": win.hw.to_dict(),
                "area_mm2": config_area_mm2(win.hw),
                "mapping": win.mappings[0].to_dict(),
                "candidates": [m.to_dict() for m in c.candidates],
            }
        free, fixed = row["all knobs"], row["bus fixed 128"]
        hw = HwConfig(**free["hw"])
        print(
            f"{lay.name:16} {dm.cycles:11.0f} {free['cycles']:10.0f} {dm.cycles / free['cycles']:6.2f} "
            f"{free['edp_gain']:7.2f} {fixed['edp_gain']:12.2f} {free['model_pick_edp_gain']:10.2f} "
            f"{free['calibrated_pick_edp_gain']:9.2f} {free['evaluations']:5d} "
            f"{free['model_over_zigzag_cycles']:8.2f} {free['model_over_zigzag_energy'] or math.nan:6.2f} "
            f"{free['search_s']:8.2f}  "
            f"{hw.dim}x{hw.dim} sp{hw.sp_kib}K acc{hw.acc_kib}K {hw.dataflow} bus{hw.dma_buswidth} "
            f"area {free['area_mm2'] / base_area:.2f}x default"
        )
        out["single"].append(row)
    if held_out:
        print(
            "\nmodel vs ZigZag per layer on 12 held-out configs each (random legal hardware, half gemmini.h tiles, half"
            " random): Spearman rank correlation of EDP, and median |ln(EDP / ZigZag EDP)|, model -> calibrated"
        )
        for name, a in held_out.items():
            print(
                f"  {name:16} Spearman {a['spearman_model']:5.2f} -> {a['spearman_calibrated']:5.2f}   "
                f"|ln ratio| {a['log_error_model']:5.2f} -> {a['log_error_calibrated']:5.2f}"
            )
        out["held_out_agreement"] = held_out
    for label, g in gains.items():
        geo = math.exp(sum(math.log(x) for x in g) / len(g))
        print(
            f"single operators, {label} ({res_budget.label}): geomean EDP gain {geo:.2f}x over Gemmini-Default (zigzag)"
        )
        out[f"single_geomean_edp_gain ({label})"] = geo

    # networks: co-tuned vs the best hardware tuned for one of its layers (mappings then tuned per layer)
    for net_name, net, budget, limits in (
        ("ResNet-50", RESNET50, args.budget * 4, budget_limits),
        ("BERT-base", BERT, args.budget * 2, budget_limits),
        # what the zigzag backend's array model and the public FireSim bitstreams (leanConfig) cover
        (
            "BERT-base, WS only",
            BERT,
            args.budget * 2,
            Limits(buses=(128,) if accept else Limits().buses, dataflows=("WS",), accept=accept),
        ),
    ):
        t0 = time.perf_counter()
        # BACO starts from the default; where the limits exclude its BOTH dataflow, from the default array on WS
        start = DEFAULT_HW if DEFAULT_HW.dataflow in limits.dataflows else replace(DEFAULT_HW, dataflow="WS")
        c = cotune(zz, net, budget, seed=0, limits=limits, start_hw=start, shortlist=args.shortlist)
        co_s = time.perf_counter() - t0
        singles: list[tuple[float, str, HwConfig, list[Mapping]]] = []
        for lay in net:
            hw = co_explore([lay], args.budget, seed=0, limits=limits, start_hw=start).hw
            try:
                fixed = tune_fixed_hw(net, hw, args.budget, seed=0)
            except RuntimeError:
                continue  # this layer's hardware cannot hold some other layer's smallest tiles
            singles.append((fixed.cost.edp, lay.name, fixed.hw, fixed.mappings))
        _, s_from, s_hw, s_maps = min(singles, key=lambda x: x[0])
        _, n_def = measured_best(zz, DEFAULT_HW, net, default_options(DEFAULT_HW, net))
        _, n_single = measured_best(zz, s_hw, net, flow_options(s_hw, net, s_maps))
        own = next(m for m in c.candidates if m.hw == c.first.hw)
        own2 = next(m for m in c.candidates if m.hw == c.second.hw)
        win = c.winner
        meas = {
            "default": (DEFAULT_HW, n_def),
            f"best single-layer hw ({s_from})": (s_hw, n_single),
            "co-tuned network, model's pick": (own.hw, own.measurements),
            "co-tuned network, calibrated pick": (own2.hw, own2.measurements),
            "co-tuned network": (win.hw, win.measurements),
        }
        co_model = network_cost(win.hw, net, win.mappings)
        n_co = win.measurements
        pairs.extend((p.cycles, m.cycles) for p, m in zip(co_model.layers, n_co, strict=True))
        base_cyc, base_en = _net(net, meas["default"][1])
        print(
            f"\n{net_name} layer list (occurrence-weighted, {len(net)} distinct layers), {res_budget.label}, "
            f"measured by {zz.version()}; "
            f"co-tuning {budget} model calls and {c.evaluations} ZigZag points in {co_s:.1f} s:"
        )
        res: dict[str, Any] = {"search_s": co_s, "budget": budget, "evaluations": c.evaluations}
        for name, (hw, ms) in meas.items():
            cyc, en = _net(net, ms)
            gain = base_cyc * base_en / (cyc * en)
            print(
                f"  {name:34} cycles {cyc:12.0f}  energy {en / 1e6:9.1f} uJ  EDP gain {gain:6.2f}x  "
                f"hw {hw.dim}x{hw.dim} sp{hw.sp_kib}K acc{hw.acc_kib}K {hw.dataflow} bus{hw.dma_buswidth} "
                f"area {config_area_mm2(hw):.3f} mm² ({config_area_mm2(hw) / base_area:.2f}x)"
            )
            res[name] = {
                "cycles": cyc,
                "energy_pj": en,
                "edp_gain": gain,
                "area_mm2": config_area_mm2(hw),
                "hw": hw.to_dict(),
            }
        out["network"][net_name] = res

    out["area_scales"] = scales
    if not args.no_compare:
        print()
        out["search_comparison"] = compare(args.budget, args.seeds, budget_limits, res_budget.label)

    cal = correlate([a for a, _ in pairs], [b for _, b in pairs], zz.version())
    print(
        f"\nanalytical model vs {cal['backend']} cycles over {cal['n']} points: Pearson r {cal['pearson_r']:.3f}, "
        f"r(log) {cal['pearson_r_log']:.3f}, Spearman {cal['spearman_rho']:.3f}"
    )
    out["calibration"] = cal
    print(f"bench wall time {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
