"""How much of ZigZag's Gemmini energy is the analytical model's own constants fed back (issue 23, item 1).

For the benchmark layers (the single operators, ResNet-50 and BERT-base lists of bench/gemmini_cotune.py) on a
set of WS hardware configs with gemmini.h's default tiling: the analytical model's energy against the zigzag
backend's with SRAM energies from BACO Table 6.3 (the model's constants, "before") and from CACTI 7 at the
config's bank geometry ("after"). Also prints the area of each config (area.py).

    PYTHONPATH=. python bench/gemmini_energy_sources.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from service.tuning.gemmini.area import area_breakdown
from service.tuning.gemmini.backends import get_backend
from service.tuning.gemmini.model import layer_cost
from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, default_mapping, fit
from service.tuning.gemmini.workloads import BERT, RESNET50, SINGLE_OPS
from service.tuning.tuners.gemmini.calibration import correlate

CONFIGS = [
    DEFAULT_HW,
    HwConfig(dim=8, sp_kib=64, acc_kib=16),
    HwConfig(dim=16, sp_kib=64, acc_kib=32),
    HwConfig(dim=16, sp_kib=1024, acc_kib=256),
    HwConfig(dim=32, sp_kib=512, acc_kib=128),
    HwConfig(dim=32, sp_kib=2048, acc_kib=512),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="single operators and 3 configs only")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    layers = SINGLE_OPS if args.quick else [*SINGLE_OPS, *RESNET50, *BERT]
    configs = CONFIGS[:3] if args.quick else CONFIGS
    backends = {
        "before (table63)": get_backend("zigzag", timeout_s=600, sram_energy="table63"),
        "after (cacti)": get_backend("zigzag", timeout_s=600, sram_energy="cacti"),
    }
    model: list[float] = []
    zz: dict[str, list[float]] = {k: [] for k in backends}
    t0 = time.perf_counter()
    out: dict[str, Any] = {"configs": [], "layers": [lay.name for lay in layers]}
    for hw in configs:
        area = area_breakdown(hw)
        pts = [(lay, default_mapping(hw, lay)) for lay in layers]
        pts = [(lay, m) for lay, m in pts if fit(hw, lay, m) is None]
        print(
            f"{hw.dim}x{hw.dim} sp{hw.sp_kib}K acc{hw.acc_kib}K: area {area['total_mm2']:.3f} mm² "
            f"(sp {area['scratchpad_mm2']:.3f}, acc {area['accumulator_mm2']:.3f}, PEs {area['pe_array_mm2']:.3f}, "
            f"scale units {area['scale_units_mm2']:.3f}, "
            f"overhead {area['overhead_mm2']:.3f}); {len(pts)} layers"
        )
        model += [layer_cost(hw, lay, m).energy_pj for lay, m in pts]
        for name, be in backends.items():
            ms = be.measure(hw, [lay for lay, _ in pts], [m for _, m in pts])
            zz[name] += [float(m.energy_pj or 0.0) for m in ms]
        out["configs"].append({"hw": hw.to_dict(), "area": area, "layers": len(pts)})
    print(f"\nanalytical-model energy vs zigzag energy over {len(model)} (config, layer) points:")
    for name, ys in zz.items():
        c = correlate(model, ys, name)
        ratio = sorted(y / x for x, y in zip(model, ys, strict=True))
        print(
            f"  {name:17} Pearson r {c['pearson_r']:.4f}  r(log) {c['pearson_r_log']:.4f}  "
            f"Spearman {c['spearman_rho']:.4f}  zigzag/model median {ratio[len(ratio) // 2]:.3f} "
            f"(min {ratio[0]:.3f}, max {ratio[-1]:.3f})"
        )
        out[name] = {**c, "ratio_min": ratio[0], "ratio_median": ratio[len(ratio) // 2], "ratio_max": ratio[-1]}
    print(f"wall {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
