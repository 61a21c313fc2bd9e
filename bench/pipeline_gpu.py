"""ALCOP's operator set on one NVIDIA GPU: pipelined schedules against the same tiles unpipelined,
MetaSchedule's default search at the same trial budget, and cuBLAS (CUDA graphs).

    python bench/pipeline_gpu.py                       # every operator, 64 trials each, the GPU's arch
    python bench/pipeline_gpu.py --ops bert_qk,rn50_fc --trials 16 --out /tmp/pipe.json   # smoke run

Per operator it reports: the pipelined best (ALCOP's Anal.+XGB search, or analytical-only where xgboost is
missing), the same tiles with every pipeline off, MetaSchedule (`tune_tir`, XGBoost cost model where
available, else its random model, labelled), cuBLAS fp32 through torch in a CUDA graph, best-in-top-10 and
best-in-top-50 of the model-guided proposals against the best found, and the model's Spearman ρ.

Like for like: both searches get the same trial budget (`--trials`; the candidates each measured are recorded
and `equal_budget` says whether they match), and the finalists (pipelined best, its tiles unpipelined,
MetaSchedule's best) are re-timed after both searches on one timer, TVM's time_evaluator (kernel-only),
interleaved; the pipelined search's own best time (`pipelined_search_s`, a minimum over noisy trials) is kept
for reference only. cuBLAS is kernel-only too (a CUDA graph).

Needs a CUDA GPU (sm_80+), TVM (the wheel or ../tools/tvm-gpu-bundle.sh's bundle), torch and numpy; not
pydantic, FastAPI, Celery or the store. Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.tuning.tuners import tensor_intrinsics
from service.tuning.tuners.pipeline.model import GPUConstants, best_in_top_k
from service.tuning.tuners.pipeline.space import GemmShape, PipelineConfig
from service.tuning.tuners.pipeline.tuner import MODES, MeasuringSink, PipelineTask, PipelineTuner


@dataclass(frozen=True)
class Operator:
    name: str
    gemm: GemmShape
    what: str


# ALCOP §5.6 (thesis §3.7): BMM_BERT_QK/SV, BMM_GPT2_QK/SV, MM_BERT_FC1/FC2 and MM_RN50_FC (output 1024×64,
# reduction 2048). BERT-base: 12 heads of 64, sequence 128; GPT-2 small: 12 heads of 64, sequence 1024.
OPERATORS = {
    op.name: op
    for op in (
        Operator("bert_qk", GemmShape(12, 128, 128, 64), "batch_matmul Q·Kᵀ, BERT-base, seq 128"),
        Operator("bert_sv", GemmShape(12, 128, 64, 128), "batch_matmul S·V, BERT-base, seq 128"),
        Operator("gpt2_qk", GemmShape(12, 1024, 1024, 64), "batch_matmul Q·Kᵀ, GPT-2, seq 1024"),
        Operator("gpt2_sv", GemmShape(12, 1024, 64, 1024), "batch_matmul S·V, GPT-2, seq 1024"),
        Operator("bert_fc1", GemmShape(1, 128, 3072, 768), "dense, BERT-base FFN up, seq 128"),
        Operator("bert_fc2", GemmShape(1, 128, 768, 3072), "dense, BERT-base FFN down, seq 128"),
        Operator("rn50_fc", GemmShape(1, 64, 1024, 2048), "dense, output 1024×64, reduction 2048"),
    )
}


def detect_arch() -> str:
    import tvm

    dev = tvm.cuda(0)
    if not dev.exist:
        raise SystemExit("no CUDA GPU visible to TVM: this benchmark runs kernels and needs one")
    return "sm_" + str(dev.compute_version).replace(".", "")


class Runner:
    """Random inputs for one operator on the GPU, its numpy reference, and timing of built kernels."""

    def __init__(self, gemm: GemmShape, number: int = 20, repeat: int = 7) -> None:
        import numpy as np
        import tvm

        rng = np.random.default_rng(0)
        self.gemm, self.number, self.repeat = gemm, number, repeat
        shape_a = (gemm.m, gemm.k) if gemm.batch == 1 else (gemm.batch, gemm.m, gemm.k)
        shape_b = (gemm.n, gemm.k) if gemm.batch == 1 else (gemm.batch, gemm.n, gemm.k)
        self.a = rng.standard_normal(shape_a, dtype=np.float32)
        self.b = rng.standard_normal(shape_b, dtype=np.float32)
        self.expected = self.a @ np.swapaxes(self.b, -1, -2)
        self.dev = tvm.cuda(0)
        self.out = tvm.runtime.tensor(np.zeros(self.expected.shape, np.float32), self.dev)
        self.args_a = tvm.runtime.tensor(self.a, self.dev)
        self.args_b = tvm.runtime.tensor(self.b, self.dev)

    def seconds(self, module: Any, check: bool = True) -> float:
        import numpy as np

        args = [self.args_a, self.args_b, self.out]  # (X, W, Y) for dense_module, (A, Bt, C) for batch_matmul
        module["main"](*args)
        if check:
            err = float(np.abs(self.out.numpy() - self.expected).max())
            if not err <= 1e-3 * math.sqrt(self.gemm.k):
                raise ValueError(f"wrong result: max abs error {err:.3g}")
        timer = module.time_evaluator("main", self.dev, number=self.number, repeat=self.repeat)
        return float(np.median(timer(*args).results))


def pipeline_measure(runner: Runner, arch: str, errors: dict[str, str]) -> Any:
    from service.tuning.tuners.pipeline.lowering import build

    def measure(configs: list[PipelineConfig]) -> list[float]:
        out = []
        for c in configs:
            try:
                out.append(runner.seconds(build(c, runner.gemm, arch)))
            except Exception as exc:  # a failed build or a wrong result is a failed trial
                errors[c.key] = f"{type(exc).__name__}: {exc}"[:300]
                out.append(math.inf)
        return out

    return measure


@dataclass
class MetaScheduleRun:
    module: Any  # None when MetaSchedule found nothing that built and ran
    cost_model: str
    tuning_s: float
    trials: int  # candidates it measured (its database's records, failed ones included)


def metaschedule(gemm: GemmShape, arch: str, trials: int) -> MetaScheduleRun:
    """MetaSchedule's default CUDA search (its rules already emit 3-stage cp.async pipelines) at `trials`."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from service.tuning.builder.cuda import cuda_target, pass_config
    from service.tuning.builder.metaschedule import make_builder
    from service.tuning.tuners.pipeline.lowering import batch_matmul_module
    from service.tuning.tuners.pipeline.schedule import dense_module

    mod = (
        dense_module(gemm.n, gemm.k, gemm.m)
        if gemm.batch == 1
        else batch_matmul_module(gemm.batch, gemm.n, gemm.k, gemm.m)
    )
    try:
        import xgboost  # noqa: F401

        cost_model = "xgb"
    except ImportError:
        cost_model = "random"
    target = tvm.target.Target(cuda_target(arch))
    started = time.monotonic()
    tensor_intrinsics.load()
    with tempfile.TemporaryDirectory() as work_dir:
        db = ms.tune_tir(
            mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=min(32, trials),
            builder=make_builder(max_workers=8, timeout_sec=120, cuda=True), cost_model=cost_model,
        )  # fmt: skip
        tuning_s = time.monotonic() - started
        measured = len(db.get_all_tuning_records())
        sch = ms.tir_integration.compile_tir(db, mod, target)
    if sch is None:
        return MetaScheduleRun(None, cost_model, tuning_s, measured)
    from service.tuning.cuda_toolchain import configure_cuda_compile

    configure_cuda_compile()  # the worker's compile route (nvcc through TVM's callback)
    with target, tvm.transform.PassContext(opt_level=3, config=pass_config(arch)):
        module = tvm.tirx.build(sch.mod, target=target)
    return MetaScheduleRun(module, cost_model, tuning_s, measured)


def final_times(modules: dict[str, Any], runner: Runner, rounds: int = 3) -> tuple[dict[str, float], dict[str, str]]:
    """Each finalist re-timed on one timer (Runner.seconds: TVM time_evaluator, kernel-only), interleaved round
    by round so drift hits all alike; median of the rounds. The pipelined best is re-timed too: its search
    time is the minimum of many noisy trials and would flatter it against MetaSchedule's single build."""
    samples: dict[str, list[float]] = {name: [] for name in modules}
    errors: dict[str, str] = {}
    for first in [True] + [False] * (rounds - 1):
        for name, module in modules.items():
            if name in errors:
                continue
            try:
                samples[name].append(runner.seconds(module, check=first))
            except Exception as exc:  # a wrong result or a failed launch drops that finalist, not the rest
                errors[name] = f"{type(exc).__name__}: {exc}"[:300]
    times = {name: statistics.median(v) for name, v in samples.items() if name not in errors and v}
    return times, errors


def equal_budget(budget: int, pipeline_trials: int, ms_trials: int | None) -> bool:
    """Both searches measured the same number of candidates, up to 10 % (MetaSchedule may stop short when its
    space runs dry); the report flags a comparison where this is false."""
    if ms_trials is None:
        return False
    return abs(pipeline_trials - ms_trials) <= 0.1 * budget and max(pipeline_trials, ms_trials) <= budget


def cublas(gemm: GemmShape) -> float:
    from service.tuning import cublas as vendor

    if gemm.batch == 1:
        return vendor.time_linear(gemm.m, gemm.n, gemm.k)
    torch = vendor.torch_cuda()
    a = torch.randn(gemm.batch, gemm.m, gemm.k, device="cuda")
    bt = torch.randn(gemm.batch, gemm.n, gemm.k, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 cuBLAS, as time_linear
    return vendor.time_graph(lambda: torch.bmm(a, bt.transpose(1, 2)))


def run_operator(op: Operator, arch: str, trials: int, search: str, skip_ms: bool) -> dict[str, Any]:
    from service.tuning.tuners.pipeline.lowering import build

    runner = Runner(op.gemm)
    gpu = GPUConstants.for_arch(arch)
    errors: dict[str, str] = {}
    started = time.monotonic()
    outcome = PipelineTuner().tune(
        PipelineTask(op.gemm, gpu, trials, search),  # type: ignore[arg-type]
        MeasuringSink(pipeline_measure(runner, arch, errors)),
    )
    tuning_s = time.monotonic() - started
    best = outcome.best
    row: dict[str, Any] = {"operator": op.name, "what": op.what, "gemm": op.gemm.__dict__, "search": search,
                           "budget": trials, "pipeline_trials": len(outcome.proposals), "tuning_s": round(tuning_s, 1),
                           "timer": "TVM time_evaluator (kernel-only), finalists re-timed interleaved",
                           "failed_trials": len(errors), "errors": dict(list(errors.items())[:5])}  # fmt: skip
    if best is None:
        return {**row, "pipelined_s": None}
    measured = [p.measured_s for p in outcome.proposals]
    row.update(
        pipelined_search_s=best.measured_s,
        best_config=best.config.key,
        predicted_s=best.predicted_s,
        best_in_top_10=best_in_top_k(measured, 10),
        best_in_top_50=best_in_top_k(measured, 50),
        spearman=outcome.spearman(),
    )
    finalists = {"pipelined": build(best.config, op.gemm, arch)}
    try:
        finalists["same_tiles_unpipelined"] = build(best.config.unpipelined(), op.gemm, arch)
    except Exception as exc:
        row["same_tiles_unpipelined_error"] = f"{type(exc).__name__}: {exc}"[:300]
    if not skip_ms:
        try:
            found = metaschedule(op.gemm, arch, trials)
            row.update(metaschedule_cost_model=found.cost_model, metaschedule_tuning_s=round(found.tuning_s, 1),
                       metaschedule_trials=found.trials)  # fmt: skip
            if found.module is not None:
                finalists["metaschedule"] = found.module
        except Exception as exc:
            row["metaschedule_error"] = f"{type(exc).__name__}: {exc}"[:300]
        row["equal_budget"] = equal_budget(trials, len(outcome.proposals), row.get("metaschedule_trials"))
    times, final_errors = final_times(finalists, runner)
    row.update({f"{name}_s": times.get(name) for name in finalists})
    row.update({f"{name}_error": err for name, err in final_errors.items()})
    try:
        row["cublas_fp32_s"] = cublas(op.gemm)  # kernel-only as well: a CUDA graph of 50 calls
    except Exception as exc:
        row["cublas_error"] = str(exc)
    return row


def table(rows: list[dict[str, Any]], gpu_name: str) -> str:
    def us(v: Any) -> str:
        return f"{v * 1e6:.1f}" if isinstance(v, float) and math.isfinite(v) else "—"

    def ratio(a: Any, b: Any) -> str:
        ok = all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in (a, b))
        return f"{a / b:.2f}×" if ok else "—"

    lines = [
        f"GPU: {gpu_name}. µs per call (medians, kernel-only); speedups are the other kernel's time ÷ the "
        "pipelined best; trials = candidates measured by the pipeline search / MetaSchedule.",
        "",
        "| operator | pipelined best (config) | same tiles unpipelined | MetaSchedule | cuBLAS fp32 | vs tiles | "
        "vs MS | vs cuBLAS | trials | best-in-top-10 | best-in-top-50 | ρ |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r.get("pipelined_s")
        lines.append(
            f"| {r['operator']} | {us(p)} ({r.get('best_config', '—')}) | {us(r.get('same_tiles_unpipelined_s'))} | "
            f"{us(r.get('metaschedule_s'))} | {us(r.get('cublas_fp32_s'))} | "
            f"{ratio(r.get('same_tiles_unpipelined_s'), p)} | {ratio(r.get('metaschedule_s'), p)} | "
            f"{ratio(r.get('cublas_fp32_s'), p)} | {r.get('pipeline_trials', '—')} / "
            f"{r.get('metaschedule_trials', '—')} | {r.get('best_in_top_10', 0):.2f} | "
            f"{r.get('best_in_top_50', 0):.2f} | {r.get('spearman', float('nan')):.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(OPERATORS), help="comma-separated: " + ", ".join(OPERATORS))
    parser.add_argument("--trials", type=int, default=64, help="measured trials per operator (both searches)")
    parser.add_argument("--search", choices=MODES, default=None, help="default: anal+xgb with xgboost, else analytical")
    parser.add_argument("--skip-metaschedule", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/results/pipeline_gpu.json"))
    args = parser.parse_args(argv)
    unknown = [name for name in args.ops.split(",") if name not in OPERATORS]
    if unknown:
        parser.error(f"unknown --ops {','.join(unknown)}; choose from {', '.join(OPERATORS)}")
    ops = [OPERATORS[name] for name in args.ops.split(",")]
    arch = detect_arch()
    search = args.search
    if search is None:
        try:
            import xgboost  # noqa: F401

            search = "anal+xgb"
        except ImportError:
            search = "analytical"
    import tvm

    gpu_name = f"{tvm.cuda(0).device_name} ({arch})"
    result: dict[str, Any] = {"gpu": gpu_name, "trials": args.trials, "rows": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for op in ops:
        print(f"[{op.name}] {op.what}: {args.trials} trials, {search}", flush=True)
        result["rows"].append(run_operator(op, arch, args.trials, search, args.skip_metaschedule))
        print(json.dumps(result["rows"][-1], default=str), flush=True)
        # after every operator: a command stopped at its time limit keeps what it finished
        args.out.write_text(json.dumps(result, indent=1, default=str))
    print(table(result["rows"], gpu_name))


if __name__ == "__main__":
    main()
