"""One results file per GPU session, and the GPU table of docs/gpu.md rendered from it (never typed in by hand).

    python bench/gpu_report.py env                                   # on the GPU machine: the environment facts
    python bench/gpu_report.py collect --out R.json --mode run-bench --rc 0 --seconds 300 \\
        --env-from-host --dynamic-bert bert.json [--junit pytest.xml] [--pipeline pipe.json] [--merge R.json] \\
        [--ukernels fp32.json --ukernels fp16.json ...]
    python bench/gpu_report.py render R.json [R2.json ...] [--doc docs/gpu.md]   # anywhere: markdown

`bench/gpu_session.sh` runs `collect` at the end of every command, so `$OUT/gpu_results.json` holds the
environment (GPU, driver, CUDA, torch, TVM, read at run time from nvidia-smi, torch and tvm), the GPU tests'
outcome counts and the benchmark rows. `render` merges results files of one machine (one per command, the
environment must agree), refuses a file that lacks an environment field the table must name, and with
--doc replaces the block between the gpu-table markers in place. Standard library only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

SCHEMA = "kernelfleet-gpu-results/1"
REQUIRED_ENV = ("gpu", "driver", "cuda", "torch", "tvm")  # what the table must name to mean anything
BEGIN, END = "<!-- gpu-table:begin -->", "<!-- gpu-table:end -->"
SELECTED_T = (1, 2, 4, 8, 16, 32, 61, 64, 97, 128, 512)  # per-T rows shown in docs/gpu.md; all are in the file
MODE_NAMES = {"called": "as a torch host calls them", "graph": "kernel-only (CUDA graph)"}


class ResultsError(ValueError):
    """A results file the report cannot stand on (missing environment, mixed machines, wrong schema)."""


# ---- on the GPU machine: environment facts and the one results file ----


def _run(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _smi_facts() -> dict[str, str]:
    row = _run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader"])
    out: dict[str, str] = {}
    if row.strip():
        fields = [f.strip() for f in row.splitlines()[0].split(",")]
        out.update(zip(("gpu", "driver", "compute_cap", "memory"), fields, strict=False))
    banner = re.search(r"CUDA Version:\s*([0-9.]+)", _run(["nvidia-smi"]))
    if banner:
        out["cuda_driver"] = banner.group(1)  # the newest CUDA the driver supports
    return out


def _torch_facts() -> dict[str, str]:
    try:
        import torch
    except ImportError:
        return {}
    out = {"torch": str(torch.__version__)}
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)  # the CUDA runtime torch (and so cuBLAS) was built for
    if torch.cuda.is_available():
        out["torch_gpu"] = torch.cuda.get_device_name(0)
    return out


def _tvm_facts() -> dict[str, str]:
    try:
        import tvm
    except ImportError:
        return {}
    return {"tvm": str(tvm.__version__), "tvm_cuda_enabled": str(bool(tvm.runtime.enabled("cuda")))}


def environment() -> dict[str, Any]:
    """What ran the session, read now from nvidia-smi, torch, tvm and nvcc; a fact that cannot be read is left
    out (and `render` then refuses the file rather than print a table without it)."""
    from service.tuning.cuda_toolchain import nvcc_path

    env: dict[str, Any] = {**_smi_facts(), **_torch_facts(), **_tvm_facts()}
    compiler = nvcc_path()  # what the builds use: the pinned wheel's nvcc, else the one on PATH
    nvcc = re.search(r"release ([0-9.]+)", _run([str(compiler or "nvcc"), "--version"]))
    if nvcc:
        env["nvcc"] = nvcc.group(1)
    env.update(
        python=platform.python_version(),
        cpus=os.cpu_count(),
        tvm_cuda_compile_mode=f"nvcc through KernelFleet's tvm_callback_cuda_compile ({compiler or 'no nvcc'})",
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )
    return env


def junit_counts(path: Path) -> dict[str, Any]:
    """Outcome counts from pytest's --junitxml, with the skip reasons (a GPU test skipped on the GPU machine
    is a finding, not a pass) and the failed tests' names."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    reasons: list[str] = []
    failed: list[str] = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        skip = case.find("skipped")
        if skip is not None and skip.get("message", "") not in reasons:
            reasons.append(skip.get("message", ""))
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {"passed": passed, "failed": counts["failures"], "errors": counts["errors"], "skipped": counts["skipped"],
            "skip_reasons": reasons[:10], "failed_tests": failed[:50]}  # fmt: skip


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """This command's part (environment, test counts, benchmark JSON) merged into --merge's file when it came
    from the same machine, so the last command's file holds the whole session."""
    part: dict[str, Any] = {
        "schema": SCHEMA,
        "environment": environment() if args.env_from_host else json.loads(args.env.read_text()),
        "commands": [{"mode": args.mode, "rc": args.rc, "seconds": args.seconds}],
    }
    if args.junit is not None:
        part["tests"] = junit_counts(args.junit) if args.junit.exists() else {"error": f"no {args.junit.name}"}
    for key, path in (("dynamic_bert", args.dynamic_bert), ("pipeline", args.pipeline)):
        if path is not None:
            part[key] = json.loads(path.read_text()) if path.exists() else {"error": f"no {path.name} written"}
    runs = [json.loads(path.read_text()) for path in args.ukernels or [] if path.exists()]
    if runs:  # bench/gpu_ukernels.py, one file per dtype; a file not written leaves the dtype out
        part["ukernels"] = {"runs": runs}
    if args.merge is not None and args.merge.exists():
        try:
            return merge([json.loads(args.merge.read_text()), part])
        except (ResultsError, ValueError, OSError) as exc:  # another machine's or a broken file: start afresh
            print(f"not merging {args.merge}: {exc}", file=sys.stderr)
    return part


# ---- anywhere: merge, check and render ----


def missing_env(results: Mapping[str, Any]) -> list[str]:
    env = results.get("environment") or {}
    return [key for key in REQUIRED_ENV if not str(env.get(key, "")).strip()]


def merge(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One session's results from several commands: the environment must agree on every required field; a
    later command's tests or benchmark replace an earlier one's; commands are listed in order."""
    if not parts:
        raise ResultsError("no results files")
    for part in parts:
        if part.get("schema") != SCHEMA:
            raise ResultsError(f"not a {SCHEMA} file (schema {part.get('schema')!r})")
        missing = missing_env(part)
        if missing:
            raise ResultsError(f"environment lacks {', '.join(missing)}: the table must name the GPU, driver, "
                               "CUDA, torch and TVM it ran on")  # fmt: skip
    first = parts[0]["environment"]
    for part in parts[1:]:
        differ = [k for k in REQUIRED_ENV if part["environment"][k] != first[k]]
        if differ:
            raise ResultsError(f"results from different machines or software ({', '.join(differ)} differ)")
    merged: dict[str, Any] = {"schema": SCHEMA, "environment": dict(first), "commands": []}
    for part in parts:
        merged["commands"] += part.get("commands", [])
        if "tests" in part:
            merged["tests"] = part["tests"]
        for key, items, name in (
            ("dynamic_bert", "layers", "layer"),
            ("pipeline", "rows", "operator"),
            ("ukernels", "runs", "dtype"),
        ):
            if key in part:
                merged[key] = _merge_runs(merged.get(key), part[key], items, name)
    return merged


def _merge_runs(old: Mapping[str, Any] | None, new: Mapping[str, Any], items: str, name: str) -> dict[str, Any]:
    """One benchmark's runs from several commands (e.g. one layer per command): a later entry replaces an
    earlier one of the same name, the others stay; a later command that wrote nothing erases nothing (its rc
    is in `commands`)."""
    if old is None or "error" in old:
        return dict(new)
    if "error" in new:
        return dict(old)
    by_name = {entry[name]: entry for entry in old.get(items, [])}
    by_name.update({entry[name]: entry for entry in new.get(items, [])})
    return {**old, **new, items: list(by_name.values())}


def _us(v: Any) -> str:
    return f"{v:.1f}" if _finite(v) else "—"


def _x(v: Any) -> str:
    return f"{v:.2f}×" if _finite(v) else "—"


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _us_s(seconds: Any) -> str:
    return _us(seconds * 1e6) if _finite(seconds) else "—"


def _ratio(num: Any, den: Any) -> Any:
    return num / den if _finite(num) and _finite(den) and den > 0 else None


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _ts(ts: Iterable[int]) -> str:
    """T=1, T=5–9, T=12: runs of consecutive T collapsed (a routing list can span a hundred T)."""
    runs: list[list[int]] = []
    for t in sorted(ts):
        if runs and t == runs[-1][1] + 1:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    return ", ".join(f"T={lo}" if lo == hi else f"T={lo}–{hi}" for lo, hi in runs) or "none"


def header(results: Mapping[str, Any], sources: Sequence[str]) -> list[str]:
    env = results["environment"]
    cuda = [f"CUDA {env['cuda']} (torch's runtime)"]
    cuda += [f"nvcc {env['nvcc']}"] if env.get("nvcc") else []
    cuda += [f"the driver supports CUDA ≤ {env['cuda_driver']}"] if env.get("cuda_driver") else []
    return [
        f"GPU results on **{env['gpu']}**, driver {env['driver']}, {', '.join(cuda)}, torch {env['torch']}, "
        f"TVM {env['tvm']}, {env.get('cpus', '?')} CPU cores, {env.get('date', '')}. "
        f"Rendered by `python bench/gpu_report.py render {' '.join(sources)}` from what `bash bench/gpu_session.sh` "
        "measured; commands: "
        + ", ".join(f"`{c['mode']}` (rc {c['rc']}, {c['seconds']} s)" for c in results.get("commands", []))
        + ".",
        "",
    ]


def tests_lines(tests: Mapping[str, Any] | None) -> list[str]:
    if not tests:
        return ["GPU tests: not run in these results.", ""]
    if "error" in tests:
        return [f"GPU tests: no outcome ({tests['error']}).", ""]
    if not any(tests.get(k) for k in ("passed", "failed", "errors", "skipped")):
        return ["GPU tests (`run-tests`): no test finished (see the command's rc: 124 = cut at its time budget).", ""]
    line = (f"GPU tests (`run-tests`): {tests['passed']} passed, {tests['failed']} failed, {tests['errors']} "
            f"errors, {tests['skipped']} skipped.")  # fmt: skip
    if tests.get("skipped"):
        line += " Skipped on the GPU machine: " + "; ".join(tests.get("skip_reasons", [])) + "."
    if tests.get("failed_tests"):
        line += " Failed: " + ", ".join(f"`{n}`" for n in tests["failed_tests"][:10]) + "."
    return [line, ""]


def _worst(part: Mapping[str, Any]) -> str:
    return f"T={part['worst_t']} ({_x(part['worst'])})"


def layer_summary_lines(layers: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        "Dense layers, ours vs cuBLAS fp32, fp32, batch 1 (ratio = cuBLAS µs ÷ ours µs, > 1: ours faster; geomean "
        "over the T measured in 1..T_max). *Dispatcher*: as shipped, T routed to cuBLAS count 1.0×; *uKernels*: "
        "ours at every T, no routing. Both sides of a mode are timed the same way.",
        "",
        "| layer (N×K) | mode | T measured | dispatcher geomean | dispatcher worst | uKernels geomean | "
        "uKernels worst | routed to cuBLAS | would route otherwise in this mode | routing decided |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for layer in layers:
        summary = layer.get("summary")
        name = f"{layer['layer']} ({layer.get('N')}×{layer.get('K')})"
        if not summary:
            lines.append(f"| {name} | — | incomplete run: {len(layer.get('rows', {}))} T measured | | | | | | | |")
            continue
        for mode, label in MODE_NAMES.items():
            s = summary[mode]
            if "error" in s:
                why = layer.get("graph_error") or s["error"]
                lines.append(f"| {name} | {label} | 0 | not measured: {why} | | | | | | |")
                continue
            lines.append(
                f"| {name} | {label} | {s['t_measured']} | {_x(s['dispatcher']['geomean'])} | "
                f"{_worst(s['dispatcher'])} | {_x(s['ukernels']['geomean'])} | {_worst(s['ukernels'])} | "
                f"{len(s['routed_t'])} T ({_ts(s['routed_t'])}) | {_ts(s['routing_disagrees'])} | "
                f"{summary['routing_mode']} |"
            )
    return [*lines, ""]


def layer_rows_lines(layer: Mapping[str, Any]) -> list[str]:
    rows = layer.get("rows", {})
    shown = [t for t in SELECTED_T if str(t) in rows]
    lines = [
        f"{layer['layer']} ({layer.get('N')}×{layer.get('K')}), µs per call (medians; T shown: {len(shown)} of "
        f"{len(rows)} measured, all in the results file); max relative error vs torch "
        f"{layer.get('max_rel_error', float('nan')):.1e}; TF32 and fp16 are references, kernel-only.",
        "",
        "| T | ours, called | cuBLAS fp32, called | ratio | ours, kernel-only | cuBLAS fp32, kernel-only | ratio | "
        "cuBLAS TF32 | cuBLAS fp16 | routed to cuBLAS |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in shown:
        r = rows[str(t)]
        called = (r.get("ours_called_us"), r.get("cublas_fp32_called_us"))
        graph = (r.get("ours_graph_us"), r.get("cublas_fp32_graph_us"))
        lines.append(
            _row(
                t,
                *(_us(v) for v in called),
                _x(_ratio(called[1], called[0])),
                *(_us(v) for v in graph),
                _x(_ratio(graph[1], graph[0])),
                _us(r.get("cublas_tf32_graph_us")),
                _us(r.get("cublas_fp16_graph_us")),
                "yes" if r.get("routed_to_cublas") else "no",
            )
        )
    return [*lines, ""]


def metaschedule_lines(layers: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        "MetaSchedule (random cost model) against our uKernels, both timed by TVM's time_evaluator (kernel-only); "
        "tuning time of our one run (every T) against per-shape MetaSchedule over every headline T, extrapolated "
        "from the shapes tuned.",
        "",
        "| layer | trials per shape | MS exact ÷ ours (geomean, T tuned) | MS tuned at 128, padded ÷ ours | "
        "our tuning s | MS s per shape | MS over all T, s (extrapolated) | tuning cost ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for layer in layers:
        ms, summary = layer.get("metaschedule") or {}, (layer.get("summary") or {}).get("metaschedule") or {}
        exact = ms.get("exact") or {}
        per_shape = sum(e["tuning_s"] for e in exact.values()) / len(exact) if exact else None
        lines.append(
            _row(
                layer["layer"],
                f"{ms.get('trials', '—')} ({_ts(int(t) for t in exact)})",
                _x(summary.get("geomean_ms_exact_over_ours")),
                _x(summary.get("geomean_ms_pad128_over_ours")),
                _us(layer.get("tuning_s")),
                _us(per_shape),
                _us(summary.get("ms_all_shapes_tuning_s_extrapolated")),
                _x(summary.get("tuning_cost_ratio")),
            )
        )
    return [*lines, ""]


def ukernel_lines(ukernels: Mapping[str, Any]) -> list[str]:
    """bench/gpu_ukernels.py's runs: per dtype and layer, the best correct uKernel per T against cuBLAS in the
    same dtype, kernel-only, interleaved rounds; the per-T ratios and the geomean."""
    runs = ukernels.get("runs") or []
    if not runs:
        return ["uKernels alone vs cuBLAS: not run in these results.", ""]
    ts = sorted({int(r["T"]) for run in runs for r in run.get("rows", [])})
    lines = [
        "Our uKernels alone (no tuner, no routing: the best correct uKernel per T among those `bench/gpu_ukernels.py` "
        "builds) against cuBLAS in the same dtype (`F.linear`), kernel-only: each side 50 calls in one CUDA graph, "
        "W cycled through copies twice the L2, sides interleaved, median of the rounds. cuBLAS ÷ ours per T "
        "(> 1: ours faster).",
        "",
        _row("dtype", "layer", *(f"T={t}" for t in ts), "geomean", "worst"),
        "|" + "---|" * (len(ts) + 4),
    ]
    for run in sorted(runs, key=lambda r: str(r.get("dtype"))):
        for layer, summary in sorted((run.get("summary") or {}).items()):
            ratio = {int(r["T"]): r.get("ratio") for r in run.get("rows", []) if r["layer"] == layer}
            lines.append(
                _row(
                    run.get("dtype", "?"),
                    layer,
                    *(_x(ratio.get(t)) for t in ts),
                    f"**{_x(summary.get('geomean_cublas_over_ours'))}**",
                    f"{_x(summary.get('worst_ratio'))} (T={summary.get('worst_T')})",
                )
            )
        wrong = sorted({k for r in run.get("rows", []) for k in r.get("wrong", {})})
        if wrong or any(run.get("build_failed", {}).values()):
            lines.append(f"({run.get('dtype')}: wrong or failed, never timed: {', '.join(wrong) or 'none'}; "
                         f"not built: {sum(len(v) for v in run.get('build_failed', {}).values())})")  # fmt: skip
    return [*lines, ""]


def pipeline_lines(pipeline: Mapping[str, Any]) -> list[str]:
    if "error" in pipeline:
        return [f"Pipeline vs MetaSchedule: no results ({pipeline['error']}).", ""]
    lines = [
        "Pipelined GEMMs (ALCOP) against MetaSchedule at the same trial budget; finalists re-timed interleaved on "
        "one timer (TVM time_evaluator, kernel-only); cuBLAS fp32 kernel-only (CUDA graph). µs per call.",
        "",
        "| operator | budget | trials measured (pipeline / MS) | equal budget | pipelined | unpipelined twin | "
        "twin ÷ pipelined | MetaSchedule | MS ÷ pipelined | cuBLAS fp32 | cuBLAS ÷ pipelined | "
        "tuning s (pipeline / MS) | MS cost model |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in pipeline.get("rows", []):
        p, m, c = (r.get(k) for k in ("pipelined_s", "metaschedule_s", "cublas_fp32_s"))
        twin = r.get("same_tiles_unpipelined_s")
        lines.append(
            _row(
                r["operator"],
                r.get("budget", "—"),
                f"{r.get('pipeline_trials', '—')} / {r.get('metaschedule_trials', '—')}",
                "yes" if r.get("equal_budget") else "NO",
                _us_s(p),
                _us_s(twin),
                _x(_ratio(twin, p)),
                _us_s(m),
                _x(_ratio(m, p)),
                _us_s(c),
                _x(_ratio(c, p)),
                f"{r.get('tuning_s', '—')} / {r.get('metaschedule_tuning_s', '—')}",
                r.get("metaschedule_cost_model", "—"),
            )
        )
    return [*lines, ""]


def render(results: Mapping[str, Any], sources: Sequence[str]) -> str:
    missing = missing_env(results)
    if missing:
        raise ResultsError(f"environment lacks {', '.join(missing)}: refusing to render a table that cannot say "
                           "which GPU, driver, CUDA, torch and TVM it ran on")  # fmt: skip
    lines = header(results, sources) + tests_lines(results.get("tests"))
    lines += ukernel_lines(results.get("ukernels") or {})
    bert = results.get("dynamic_bert") or {}
    layers = bert.get("layers") or []
    if layers:
        lines += layer_summary_lines(layers)
        for layer in layers:
            lines += layer_rows_lines(layer)
        lines += metaschedule_lines(layers)
    elif "error" in bert:
        lines += [f"Dense layers vs cuBLAS (tuned dispatcher): no results ({bert['error']}).", ""]
    else:
        lines += ["Dense layers vs cuBLAS: not run in these results.", ""]
    if results.get("pipeline"):
        lines += pipeline_lines(results["pipeline"])
    else:
        lines += ["Pipeline vs MetaSchedule: not run in these results.", ""]
    return "\n".join(lines).rstrip() + "\n"


def replace_block(text: str, block: str) -> str:
    """`text` with everything between the gpu-table markers replaced by `block` (the markers stay)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ResultsError(f"the file needs exactly one {BEGIN} followed by one {END}")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block.rstrip()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="print this machine's environment facts as JSON")
    c = sub.add_parser("collect", help="write one command's results file (on the GPU machine)")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--mode", required=True)
    c.add_argument("--rc", type=int, required=True)
    c.add_argument("--seconds", type=int, required=True)
    source = c.add_mutually_exclusive_group(required=True)
    source.add_argument("--env-from-host", action="store_true", help="read the environment here, now")
    source.add_argument("--env", type=Path, help="a JSON file from `env`")
    for flag in ("--junit", "--dynamic-bert", "--pipeline", "--merge"):
        c.add_argument(flag, type=Path)
    c.add_argument("--ukernels", type=Path, action="append", help="a bench/gpu_ukernels.py file (repeatable)")
    r = sub.add_parser("render", help="markdown from results files (one machine)")
    r.add_argument("results", type=Path, nargs="+")
    r.add_argument("--doc", type=Path, help="replace the gpu-table block of this markdown file in place (docs/gpu.md)")
    args = parser.parse_args(argv)
    try:
        return _command(args)
    except ResultsError as exc:
        print(f"gpu_report: {exc}", file=sys.stderr)
        return 2


def _command(args: argparse.Namespace) -> int:
    if args.command == "env":
        print(json.dumps(environment(), indent=1))
    elif args.command == "collect":
        results = collect(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
        print(f"wrote {args.out}")
    else:
        results = merge([json.loads(p.read_text()) for p in args.results])
        block = render(results, [p.name for p in args.results])
        if args.doc is None:
            print(block, end="")
        else:
            args.doc.write_text(replace_block(args.doc.read_text(), block))
            print(f"updated the GPU block of {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
