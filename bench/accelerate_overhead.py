"""What `kernelfleet.torch.accelerate` adds per call: a 768×768 Linear (with bias) as an `AcceleratedLinear`.

Contenders, timed in interleaved rounds (medians; each sample at least --min-sample-ms of back-to-back calls), all
under torch.inference_mode() on the same input:
- `wrapper`: the AcceleratedLinear called with a torch tensor (checks, reshape, numpy views, the dispatcher, the
  torch tensor around its output);
- `dispatcher`: the same Dispatcher called directly with the numpy views (x, the weight view it packed, the bias);
- `stub`: the wrapper around a dispatcher that returns a preallocated output at once: the wrapper's own cost alone;
- `torch`: F.linear(x, W, b), PyTorch's CPU path (oneDNN/MKL).
The overhead is estimated twice: `paired` calls the wrapper and the dispatcher alternately, call by call, and takes
the median of the per-pair differences (robust on a loaded machine); `stub` times the wrapper's own work alone.

The uKernel is one tile chosen by the rules (as a ukernel job's first candidate), with the bias fused; the table
runs every S on it (no vendor routes), so `dispatcher` is uKernel time.

    PYTHONPATH=.:clients/python .venv/bin/python bench/accelerate_overhead.py
    PYTHONPATH=.:clients/python .venv/bin/python bench/accelerate_overhead.py --ms 1,8,32,128 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any, ClassVar

from common import Contender, calibrate, host_info, paired, python_sampler, run_rounds, us, write_json

N = K = 768
BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "results" / "accelerate_overhead.json"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ms", default="1,8,32,128", help="rows S = M per call (comma-separated)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-sample-ms", type=float, default=20.0)
    parser.add_argument("--paired-s", type=float, default=2.0, help="seconds of alternating calls per M")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    ms = [int(m) for m in args.ms.split(",")]

    import numpy as np
    import torch

    from kernelfleet.dispatch import DispatchTable, Interval, Shape
    from kernelfleet.dispatcher import Dispatcher
    from kernelfleet.epilogue import Epilogue
    from kernelfleet.torch import AcceleratedLinear
    from kernelfleet.torch_fusion import dense_layer
    from kernelfleet.tvm_runtime import aligned_empty
    from service.tuning.hardware import host_target
    from service.tuning.hardware_model import HardwareModel
    from service.tuning.platforms import tvm_target
    from service.tuning.tuners.ukernel.kernel import build_ukernel
    from service.tuning.tuners.ukernel.rules import dense_candidates

    epilogue = Epilogue(True)
    best = dense_candidates(HardwareModel.from_host(), N, K, representative_m=64, top_k=1)[0]
    kernel = build_ukernel(N, K, best.mt, best.nt, best.kt, tvm_target(host_target()), epilogue=epilogue)
    s_max = max(ms)
    table = DispatchTable((Interval(1, s_max, Shape((), "u")),), {"u": kernel.spec.mt}, epilogue)
    dispatcher = Dispatcher(table, {"u": kernel}, N=N, K=K)

    class Stub(Dispatcher):
        """The wrapper's own cost: a dispatcher that returns a ready output without running anything."""

        outputs: ClassVar[dict[int, np.ndarray]] = {}

        def __call__(self, x: Any, w: Any, out: Any = None, *, bias: Any = None) -> Any:
            return self.outputs[x.shape[0]]

    stub = Stub(table, {"u": kernel}, N=N, K=K)
    Stub.outputs = {m: aligned_empty((m, N), "float32") for m in ms}

    torch.manual_seed(0)
    linear = torch.nn.Linear(K, N).eval()
    dense = dense_layer(linear)
    assert dense is not None
    wrapper = AcceleratedLinear("layer", linear, dense, dispatcher, "bench", fused_bias=True, activation=None,
                                max_rows=s_max)  # fmt: skip
    stubbed = AcceleratedLinear("layer", linear, dense, stub, "bench", fused_bias=True, activation=None,
                                max_rows=s_max)  # fmt: skip
    wrapper.prepare()
    stubbed.prepare()
    w_view, b_view = wrapper._weight_view(linear.weight), wrapper._bias_view(linear.bias)

    results = []
    with torch.inference_mode():
        for m in ms:
            x = torch.randn(m, K)
            xa = x.numpy()
            expected = torch.nn.functional.linear(x, linear.weight, linear.bias).numpy()
            got = wrapper(x).numpy()
            err = float(np.max(np.abs(got - expected)))
            assert err < 1e-3, f"M={m}: max abs error {err}"

            def call_wrapper(x: Any = x) -> Any:
                return wrapper(x)

            def call_dispatcher(xa: Any = xa) -> Any:
                return dispatcher(xa, w_view, bias=b_view)

            def call_stub(x: Any = x) -> Any:
                return stubbed(x)

            def call_torch(x: Any = x) -> Any:
                return torch.nn.functional.linear(x, linear.weight, linear.bias)

            contenders = [
                Contender(name, python_sampler(fn), lambda: np.zeros(1), pool=pool)
                for name, fn, pool in (
                    ("wrapper", call_wrapper, "tvm"),
                    ("dispatcher", call_dispatcher, "tvm"),
                    ("stub", call_stub, "none"),
                    ("torch", call_torch, "torch"),
                )
            ]
            for c in contenders:
                c.number = calibrate(c.sample, args.min_sample_ms / 1e3)
            run_rounds(contenders, args.rounds, pause_s=0.05, settle=True)  # torch's OpenMP threads spin after F.linear
            med = {c.name: statistics.median(c.samples_s) for c in contenders}
            pair = paired(call_wrapper, call_dispatcher, args.paired_s, names=("wrapper", "dispatcher"))
            results.append({"M": m, "median_s": med, "paired_s": pair, "max_abs_error": err})
            print(
                f"M={m:4d}  wrapper {us(med['wrapper']):>8} µs  dispatcher {us(med['dispatcher']):>8} µs  "
                f"paired: wrapper {us(pair['wrapper']):>8} dispatcher {us(pair['dispatcher']):>8} "
                f"difference {us(pair['difference']):>6} µs  stub {us(med['stub']):>6} µs  "
                f"torch F.linear {us(med['torch']):>8} µs",
                flush=True,
            )
    out = {
        "layer": {"N": N, "K": K, "bias": True, "ukernel": kernel.spec.to_dict()},
        "rounds": args.rounds,
        "host": host_info(),
        "torch_threads": torch.get_num_threads(),
        "results": results,
    }
    write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
