"""What a fused activation costs a uKernel: libm's scalar exp/erf/tanh against the vectorisable forms.

Per activation and M, the same compiled tile (`--tile`, mt×nt×kt) is timed four ways in interleaved rounds (medians,
spread = min–max of the rounds): bare (no epilogue), + bias + activation lowered through TVM's `tirx.erf` /
`tirx.tanh` / `tirx.sigmoid` (one scalar libm call per lane on x86: what uKernels compiled until 2026-11-28),
+ bias + activation as `service.tuning.epilogue.te_activation` builds it now (te_exp / te_erf: multiplies, adds,
floor and bit moves), and PyTorch's `F.linear` + the activation, the baseline a PyTorch host runs. One thread
on every side unless `--threads`; torch and numpy are imported first.

    PYTHONPATH=.:clients/python .venv/bin/python bench/epilogue_cost.py              # BERT FFN-up, 3 activations
"""

from __future__ import annotations

from common import reexec_without_overrides, set_tvm_threads

if __name__ == "__main__":
    reexec_without_overrides()  # before numpy, torch or TVM load (see common.STRIPPED_ENV)

import argparse
import math
import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from common import cpu_model, interleaved

TORCH_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}


def libm_activation(expr: Any, activation: str) -> Any:
    """The activation through TVM's own intrinsics, as uKernels lowered it before te_exp/te_erf."""
    from tvm import tirx

    def c(v: float) -> Any:
        return tirx.const(v, "float32")

    if activation == "gelu":
        return c(0.5) * expr * (c(1.0) + tirx.erf(expr * c(1.0 / math.sqrt(2.0))))
    if activation == "gelu_tanh":
        inner = c(math.sqrt(2.0 / math.pi)) * (expr + c(0.044715) * expr * expr * expr)
        return c(0.5) * expr * (c(1.0) + tirx.tanh(inner))
    return expr * tirx.sigmoid(expr)


def build(n: int, k: int, tile: tuple[int, int, int], activation: str | None, libm: bool, target: Any) -> Any:
    from kernelfleet.epilogue import NO_EPILOGUE, Epilogue
    from service.tuning import epilogue as epilogue_module
    from service.tuning.tuners.ukernel.kernel import build_ukernel

    epi = NO_EPILOGUE if activation is None else Epilogue(True, activation)
    if not libm:
        return build_ukernel(n, k, *tile, target, epilogue=epi)
    current = epilogue_module.te_activation
    epilogue_module.te_activation = lambda expr, act, dtype="float32": libm_activation(expr, act)  # type: ignore[assignment]
    try:
        return build_ukernel(n, k, *tile, target, epilogue=epi)
    finally:
        epilogue_module.te_activation = current


def torch_side(act: Callable[[torch.Tensor], torch.Tensor], x: Any, w: Any, b: Any) -> Any:
    return act(torch.nn.functional.linear(x, w, b))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=3072)
    p.add_argument("--k", type=int, default=768)
    p.add_argument("--tile", default="4x96x4", help="mt x nt x kt")
    p.add_argument("--activations", default="gelu,gelu_tanh,silu")
    p.add_argument("--ms", default="1,8,32,64,128")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--min-sample-s", type=float, default=0.03)
    args = p.parse_args()
    set_tvm_threads(args.threads)
    torch.set_num_threads(args.threads)
    from kernelfleet.tvm_runtime import aligned_empty
    from service.tuning.platforms import host_platform, tvm_target

    target = {**tvm_target(host_platform()[1]), "num-cores": args.threads}
    mt, nt, kt = (int(v) for v in args.tile.split("x"))
    tile = (mt, nt, kt)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((args.n, args.k), dtype=np.float32) * 0.05
    bias = rng.standard_normal(args.n, dtype=np.float32)
    wt, bt = torch.from_numpy(w), torch.from_numpy(bias)
    print(f"# {cpu_model()}, {args.threads} thread(s), N={args.n} K={args.k}, tile {args.tile}")
    print("# ms per call, median (min–max) of the rounds; error: vectorised epilogue against float64 PyTorch")
    print(
        "| activation | M | bare uKernel | + libm epilogue | + vectorised epilogue | PyTorch linear + act "
        "| libm ÷ vectorised | PyTorch ÷ vectorised | max abs error |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    bare = build(args.n, args.k, tile, None, False, target)
    bare_w = bare.device_weight(bare.pack_weight(w))
    for activation in args.activations.split(","):
        libm = build(args.n, args.k, tile, activation, True, target)
        fused = build(args.n, args.k, tile, activation, False, target)
        packed = fused.device_weight(fused.pack_weight(w))
        packed_bias = fused.device_weight(fused.pack_bias(bias))
        act = TORCH_ACTIVATIONS[activation]
        for m in (int(v) for v in args.ms.split(",")):
            x = aligned_empty((m, args.k), "float32")
            x[...] = rng.standard_normal((m, args.k), dtype=np.float32)
            out = aligned_empty((m, args.n), "float32")
            xt = torch.from_numpy(x)
            sides: dict[str, Callable[[], Any]] = {
                "bare": partial(bare.run_aligned, x, bare_w, out),
                "libm": partial(libm.run_aligned, x, packed, out, packed_bias),
                "fused": partial(fused.run_aligned, x, packed, out, packed_bias),
                "torch": partial(torch_side, act, xt, wt, bt),
            }
            fused.run_aligned(x, packed, out, packed_bias)
            expected = act(torch.nn.functional.linear(xt.double(), wt.double(), bt.double())).numpy()
            err = float(np.max(np.abs(out - expected)))
            samples = interleaved(sides, args.rounds, args.min_sample_s)
            med = {name: statistics.median(v) for name, v in samples.items()}
            cells = " | ".join(
                f"{med[n] * 1e3:.3f} ({min(samples[n]) * 1e3:.3f}–{max(samples[n]) * 1e3:.3f})" for n in sides
            )
            print(
                f"| {activation} | {m} | {cells} | {med['libm'] / med['fused']:.2f}× | "
                f"{med['torch'] / med['fused']:.2f}× | {err:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
