"""What a vendor-routed call costs over calling that library directly (issue 31 item 2: ≤ 1 µs + 2 %).

For every operator the SDK routes (dense, batch_matmul, conv2d) and both libraries (numpy, PyTorch), a dispatcher
whose table routes every shape to the library is timed against the library called directly, as a host holding the
same arrays calls it, paired call by call (a, b, b, a, ...; `common.paired`): the median of the per-pair
differences and its quartiles. `accelerate`'s PyTorch route is timed the same way against the original
`nn.Linear` on the same torch tensor.

Direct calls (what a host without KernelFleet runs on the same numpy arrays):
- dense: numpy `x @ w.T` (+ bias, activation in numpy); PyTorch `F.linear(torch.from_numpy(x), W, b)` (+ activation)
  `.numpy()` with W and b held as tensors;
- batch_matmul: `np.matmul(a, btᵀ)`; `torch.bmm(from_numpy(a), from_numpy(bt)ᵀ).numpy()`, Bt contiguous and as a
  transposed view;
- conv2d (NHWC): numpy im2col GEMM; PyTorch's conv2d on the channels_last view with the filter held as a tensor.

Layers here are not in bench/ukernel_layers.py (1024×1024, 1024→4096 + GELU, 64-head attention at T = 1..128,
a 3×3 conv with 32→32 channels). Run at the host's default threads and at one thread:

    PYTHONPATH=.:clients/python .venv/bin/python bench/vendor_route_cost.py
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=.:clients/python .venv/bin/python bench/vendor_route_cost.py \\
        --out bench/results/vendor_route_cost_1thread.json
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch  # the natural order: the user's libraries first, kernelfleet after
from common import host_info, paired, us, write_json

from kernelfleet import vendor
from kernelfleet.bmm_dispatcher import BmmDispatcher
from kernelfleet.conv_dispatcher import ConvDispatcher, ConvGeometry
from kernelfleet.dispatch import DispatchTable, Interval
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import Epilogue, apply_epilogue
from kernelfleet.tuple_dispatch import TupleDispatchTable

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "results" / "vendor_route_cost.json"
GOAL_US, GOAL_REL = 1.0, 0.02  # issue 31 item 2: a routed call costs at most 1 µs + 2 % over the direct call

Case = tuple[str, Callable[[], object], Callable[[], object]]  # (name, routed call, direct call)
F = torch.nn.functional


def _dense_pair(
    d: Dispatcher, library: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, epilogue: Epilogue
) -> tuple[Callable[[], object], Callable[[], object]]:
    """(routed, direct) for one layer, library and S."""
    wt, bt = torch.from_numpy(w), None if b is None else torch.from_numpy(b)
    act = F.gelu if epilogue.activation == "gelu" else None

    def routed() -> object:
        return d(x, w, bias=b)

    def direct() -> object:
        if library == vendor.NUMPY:
            return apply_epilogue(x @ w.T, b, epilogue)
        y = F.linear(torch.from_numpy(x), wt, bt)
        return (y if act is None else act(y)).numpy()

    return routed, direct


def dense_cases(rng: np.random.Generator, rows: list[int]) -> list[Case]:
    out: list[Case] = []
    for N, K, epilogue in ((1024, 1024, Epilogue()), (4096, 1024, Epilogue(True, "gelu"))):
        w = rng.standard_normal((N, K), dtype=np.float32)
        b = rng.standard_normal(N, dtype=np.float32) if epilogue.bias else None
        for library in vendor.LIBRARIES:
            table = DispatchTable((Interval(1, max(rows), None, library),), {}, epilogue)
            d = Dispatcher(table, {}, N=N, K=K)
            for S in rows:
                x = rng.standard_normal((S, K), dtype=np.float32)
                name = f"dense {N}x{K} {epilogue.describe()} {library} S={S}"
                out.append((name, *_dense_pair(d, library, x, w, b, epilogue)))
    return out


def accelerate_cases(rows: list[int]) -> list[Case]:
    from kernelfleet.torch import AcceleratedLinear
    from kernelfleet.torch_fusion import dense_layer

    torch.manual_seed(0)
    linear = torch.nn.Linear(1024, 1024).eval()
    dense = dense_layer(linear)
    assert dense is not None
    table = DispatchTable((Interval(1, max(rows), None, vendor.TORCH),), {}, Epilogue(True))
    d = Dispatcher(table, {}, N=1024, K=1024)
    layer = AcceleratedLinear("layer", linear, dense, d, "bench", fused_bias=True, activation=None, max_rows=max(rows))
    out: list[Case] = []
    for S in rows:
        x = torch.randn(S, 1024)
        layer(x)  # the first call for S finds its route; later ones take the PyTorch route's fast path
        out.append((f"accelerate Linear 1024x1024 torch S={S}", lambda x=x: layer(x), lambda x=x: linear(x)))
    return out


def bmm_cases(rng: np.random.Generator, rows: list[int]) -> list[Case]:
    heads, dh = 12, 64
    out: list[Case] = []
    for library in vendor.LIBRARIES:
        table = TupleDispatchTable(("M", "N"), ((1,), (1,)), (max(rows), max(rows)), (vendor.route_of(library),))
        d = BmmDispatcher(table, {}, {"B": heads, "K": dh})
        for T in rows:
            a = rng.standard_normal((heads, T, dh), dtype=np.float32)
            for layout in ("BNK", "BKN"):
                kv = rng.standard_normal((heads, T, dh) if layout == "BNK" else (heads, dh, T), dtype=np.float32)
                bt = kv if layout == "BNK" else kv.transpose(0, 2, 1)
                if library == vendor.NUMPY:

                    def direct(a: np.ndarray = a, bt: np.ndarray = bt) -> object:
                        return np.matmul(a, bt.transpose(0, 2, 1))

                else:

                    def direct(a: np.ndarray = a, bt: np.ndarray = bt) -> object:
                        return torch.bmm(torch.from_numpy(a), torch.from_numpy(bt).transpose(1, 2)).numpy()

                name = f"bmm {heads}x{T}x{T}x{dh} Bt {layout} {library}"
                out.append((name, lambda d=d, a=a, bt=bt: d(a, bt), direct))
    return out


def conv_cases(rng: np.random.Generator, batches: list[int]) -> list[Case]:
    ci = co = 32
    hw = 28
    geometry = ConvGeometry(stride=1, padding=1, filter=(3, 3, ci, co))
    f = rng.standard_normal((3, 3, ci, co), dtype=np.float32)
    weight = vendor.torch_conv_weight(f)
    m_max = max(batches) * hw * hw
    out: list[Case] = []
    for library in vendor.LIBRARIES:
        table = DispatchTable((Interval(1, m_max, None, library),), {}, Epilogue())
        d = ConvDispatcher(Dispatcher(table, {}, N=co, K=9 * ci), geometry)
        for n in batches:
            x = rng.standard_normal((n, hw, hw, ci), dtype=np.float32)
            if library == vendor.NUMPY:
                fm = d.weight(f)

                def direct(x: np.ndarray = x, fm: np.ndarray = fm) -> object:
                    cols = geometry.columns(x, 3, 3, hw, hw)
                    return (cols @ fm.T).reshape(x.shape[0], hw, hw, co)

            else:

                def direct(x: np.ndarray = x) -> object:
                    return vendor.torch_conv2d(x, weight, 1, 1)

            out.append((f"conv3x3 {ci}->{co} {hw}x{hw} N={n} {library}", lambda d=d, x=x: d(x, f), direct))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,16,128", help="S (dense, accelerate) and T (batch_matmul)")
    parser.add_argument("--conv-batches", default="1,4")
    parser.add_argument("--paired-s", type=float, default=1.5, help="seconds of alternating calls per case")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    rows = [int(s) for s in args.rows.split(",")]
    rng = np.random.default_rng(0)
    cases = [
        *dense_cases(rng, rows),
        *accelerate_cases(rows),
        *bmm_cases(rng, rows),
        *conv_cases(rng, [int(n) for n in args.conv_batches.split(",")]),
    ]
    results: list[dict[str, Any]] = []
    with torch.inference_mode():
        for name, routed, direct in cases:
            if args.only not in name:
                continue
            for _ in range(20):  # warm both: first calls resolve routes, views, thread pools
                routed()
                direct()
            p = paired(routed, direct, args.paired_s, names=("routed", "direct"))
            budget = GOAL_US * 1e-6 + GOAL_REL * p["direct"]
            results.append({"case": name, **p, "budget_s": budget, "goal_met": p["difference"] <= budget})
            print(line(results[-1]), flush=True)
    data = {"host": host_info(), "torch_threads": torch.get_num_threads(), "goal": "1 µs + 2 %", "results": results}
    write_json(args.out, data)
    args.out.with_suffix(".txt").write_text("\n".join(report(data)) + "\n")  # the JSON is not kept in git
    print(report(data)[-1])
    print(f"wrote {args.out} and its .txt")


def line(r: dict[str, Any]) -> str:
    return (
        f"{r['case']:48s} direct {us(r['direct']):>9} µs  extra {1e6 * r['difference']:+7.2f} µs "
        f"(IQR {1e6 * r['difference_q1']:+.2f}..{1e6 * r['difference_q3']:+.2f})  "
        f"budget {1e6 * r['budget_s']:5.2f} µs  {'ok' if r['goal_met'] else 'OVER'}"
    )


def report(data: dict[str, Any]) -> list[str]:
    """The run as text: the machine, one line per case, the count within the goal."""
    host, results = data["host"], data["results"]
    head = f"{host.get('cpu_model', '?')}, {host.get('cores', '?')} cores; torch threads {data['torch_threads']}"
    met = sum(r["goal_met"] for r in results)
    return [head, *map(line, results), f"{met} of {len(results)} cases within 1 µs + 2 % of the direct call"]


if __name__ == "__main__":
    main()
