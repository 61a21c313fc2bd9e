"""bench/gpu_report.py on synthetic results: the results file it collects, the table it renders from it, the
docs/gpu.md block it replaces, and its refusal of results that cannot name the machine they ran on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench.modules import ROOT, load

report = load("gpu_report")
bert = load("gpu_dynamic_bert")
ukernels = load("gpu_ukernels")

ENV = {"gpu": "Synthetic GPU X1", "driver": "999.1", "cuda": "13.0", "torch": "2.99.0+cu130", "tvm": "0.27.0.post1",
       "nvcc": "13.0", "cpus": 16, "date": "2000-01-01 00:00 UTC"}  # fmt: skip


def _layer() -> dict[str, Any]:
    rows = {
        str(t): {
            "ours_called_us": 20.0 + t,
            "cublas_fp32_called_us": 25.0,
            "ours_graph_us": 4.0 + t / 8,
            "cublas_fp32_graph_us": 5.0 + t / 10,
            "cublas_tf32_graph_us": 4.0,
            "cublas_fp16_graph_us": 3.0,
            "ours_kernels_us": 4.0 + t / 8,
            "routed_to_cublas": t > 100,
        }
        for t in range(1, 129)
    }
    ms = {"trials": 32, "exact": {"16": {"us": 7.0, "tuning_s": 40.0}}}
    return {"layer": "qkv", "N": 2304, "K": 768, "rows": rows, "metaschedule": ms, "tuning_s": 90.0,
            "max_rel_error": 2e-6, "summary": bert.summarize(rows, ms, 90.0, 128, "called from Python")}  # fmt: skip


def _results(**overrides: Any) -> dict[str, Any]:
    pipeline = {"rows": [
        {"operator": "bert_fc1", "budget": 32, "pipeline_trials": 32, "metaschedule_trials": 32, "equal_budget": True,
         "pipelined_s": 20e-6, "same_tiles_unpipelined_s": 22e-6, "metaschedule_s": 30e-6, "cublas_fp32_s": 15e-6,
         "tuning_s": 50.0,
         "metaschedule_tuning_s": 40.0, "metaschedule_cost_model": "random"},
        {"operator": "bert_qk", "budget": 32, "pipeline_trials": 32, "metaschedule_trials": 12, "equal_budget": False,
         "pipelined_s": 10e-6, "metaschedule_s": None, "cublas_fp32_s": 8e-6},
    ]}  # fmt: skip
    return {
        "schema": report.SCHEMA,
        "environment": dict(ENV),
        "commands": [{"mode": "run-bench", "rc": 0, "seconds": 300}],
        "tests": {
            "passed": 30,
            "failed": 1,
            "errors": 0,
            "skipped": 2,
            "skip_reasons": ["needs an NVIDIA GPU"],
            "failed_tests": ["tests.x::test_y"],
        },
        "dynamic_bert": {"layers": [_layer()]},
        "pipeline": pipeline,
        **overrides,
    }


def test_render_names_the_machine_and_shows_both_modes() -> None:
    results = _results()
    text = report.render(results, ["r.json"])
    for fact in ENV.values():
        assert str(fact) in text
    summary = results["dynamic_bert"]["layers"][0]["summary"]
    for mode, label in report.MODE_NAMES.items():
        row = next(line for line in text.splitlines() if line.startswith("| qkv (2304×768) | " + label))
        assert f"{summary[mode]['dispatcher']['geomean']:.2f}×" in row
        assert f"{summary[mode]['ukernels']['geomean']:.2f}×" in row
        assert f"T={summary[mode]['ukernels']['worst_t']} " in row
        assert f"{len(summary[mode]['routed_t'])} T" in row
    assert "30 passed, 1 failed, 0 errors, 2 skipped" in text and "needs an NVIDIA GPU" in text


def test_render_per_t_rows_and_pipeline_budget() -> None:
    text = report.render(_results(), ["r.json"])
    t16 = next(line for line in text.splitlines() if line.startswith("| 16 |"))
    assert t16 == "| 16 | 36.0 | 25.0 | 0.69× | 6.0 | 6.6 | 1.10× | 4.0 | 3.0 | no |"
    fc1 = next(line for line in text.splitlines() if line.startswith("| bert_fc1 |"))
    assert "| 32 / 32 | yes | 20.0 | 22.0 | 1.10× | 30.0 | 1.50× | 15.0 | 0.75× |" in fc1
    qk = next(line for line in text.splitlines() if line.startswith("| bert_qk |"))
    assert "| 32 / 12 | NO |" in qk and "| — |" in qk  # MetaSchedule found nothing: no number, no ratio


def _ukernel_run(dtype: str, ratios: dict[int, float]) -> dict[str, Any]:
    rows = [{"layer": "qkv", "T": t, "cublas_us": 5.0 * r, "ours_us": 5.0, "ratio": r} for t, r in ratios.items()]
    rows[0]["wrong"] = {"tc_bad": "max relative error 0.5"}
    return {"dtype": dtype, "rows": rows, "build_failed": {"qkv": {}}, "summary": ukernels.summarize(rows)}


def test_render_shows_ukernels_alone_per_dtype_with_geomean_worst_and_wrong_kernels() -> None:
    text = report.render(_results(ukernels={"runs": [_ukernel_run("float16", {1: 2.0, 16: 0.5})]}), ["r.json"])
    row = next(line for line in text.splitlines() if line.startswith("| float16 | qkv |"))
    assert row == "| float16 | qkv | 2.00× | 0.50× | **1.00×** | 0.50× (T=16) |"
    assert "wrong or failed, never timed: tc_bad" in text


def test_ukernel_runs_merge_by_dtype_and_a_cut_test_run_says_so() -> None:
    first = _results(ukernels={"runs": [_ukernel_run("float32", {1: 1.5})]})
    second = _results(ukernels={"runs": [_ukernel_run("float16", {1: 1.2})]}, tests={"passed": 0, "failed": 0,
                      "errors": 0, "skipped": 0})  # fmt: skip
    merged = report.merge([first, second])
    assert sorted(r["dtype"] for r in merged["ukernels"]["runs"]) == ["float16", "float32"]
    assert "no test finished" in report.render(merged, ["a.json", "b.json"])


@pytest.mark.parametrize("field", report.REQUIRED_ENV)
def test_a_results_file_missing_an_environment_field_is_refused(
    tmp_path: Path, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _results()
    del results["environment"][field]
    path = tmp_path / "gpu_results.json"
    path.write_text(json.dumps(results))
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{report.BEGIN}\nno GPU numbers yet\n{report.END}\nbottom\n")
    before = readme.read_text()
    assert report.main(["render", str(path), "--doc", str(readme)]) == 2
    assert field in capsys.readouterr().err
    assert readme.read_text() == before


def test_readme_block_is_replaced_in_place(tmp_path: Path) -> None:
    path = tmp_path / "gpu_results.json"
    path.write_text(json.dumps(_results()))
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{report.BEGIN}\nno GPU numbers yet\n{report.END}\nbottom\n")
    assert report.main(["render", str(path), "--doc", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith(f"top\n{report.BEGIN}\nGPU results on **Synthetic GPU X1**")
    assert text.endswith(f"{report.END}\nbottom\n") and "no GPU numbers yet" not in text


def test_the_gpu_doc_has_one_gpu_block_that_says_whether_numbers_exist() -> None:
    text = (ROOT / "docs" / "gpu.md").read_text()
    report.replace_block(text, "x")  # raises unless exactly one begin marker precedes one end marker
    block = text.split(report.BEGIN)[1].split(report.END)[0]
    # until a results file is rendered in, the block must say so rather than show numbers
    assert "GPU results on **" in block or "No GPU numbers yet" in block
    with pytest.raises(report.ResultsError):
        report.replace_block(text + report.END, "x")


def test_merging_commands_of_one_machine_and_refusing_two() -> None:
    first = _results(commands=[{"mode": "run-tests", "rc": 0, "seconds": 100}])
    del first["dynamic_bert"], first["pipeline"]
    other_layer = {**_layer(), "layer": "attn_out"}
    second = _results(dynamic_bert={"layers": [other_layer]})
    del second["tests"]
    merged = report.merge([first, second])
    assert [c["mode"] for c in merged["commands"]] == ["run-tests", "run-bench"]
    assert merged["tests"] == first["tests"] and merged["dynamic_bert"]["layers"][0]["layer"] == "attn_out"
    with pytest.raises(report.ResultsError, match="gpu"):
        report.merge([first, _results(environment={**ENV, "gpu": "Another GPU"})])


def test_layers_from_separate_commands_accumulate_by_name() -> None:
    qkv, attn = _layer(), {**_layer(), "layer": "attn_out"}
    newer_qkv = {**_layer(), "tuning_s": 1.0}
    merged = report.merge(
        [_results(dynamic_bert={"layers": [qkv, attn]}), _results(dynamic_bert={"layers": [newer_qkv]})]
    )
    layers = {layer["layer"]: layer for layer in merged["dynamic_bert"]["layers"]}
    assert set(layers) == {"qkv", "attn_out"} and layers["qkv"]["tuning_s"] == 1.0


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1"
skipped="1" tests="3"><testcase classname="t" name="test_ok"/><testcase classname="t" name="test_gpu">
<skipped message="needs an NVIDIA GPU: none"/></testcase><testcase classname="t" name="test_bad">
<failure message="boom"/></testcase></testsuite></testsuites>"""


def test_collect_writes_one_results_file_and_merges_the_next(tmp_path: Path) -> None:
    (tmp_path / "env.json").write_text(json.dumps(ENV))
    (tmp_path / "pytest.xml").write_text(JUNIT)
    (tmp_path / "bert.json").write_text(json.dumps({"layers": [_layer()]}))
    out = tmp_path / "gpu_results.json"
    common = ["collect", "--out", str(out), "--merge", str(out), "--env", str(tmp_path / "env.json")]
    tests = ["--mode", "run-tests", "--rc", "1", "--seconds", "9", "--junit", str(tmp_path / "pytest.xml")]
    assert report.main([*common, *tests]) == 0
    bench = ["--mode", "run-bench", "--rc", "0", "--seconds", "99", "--dynamic-bert", str(tmp_path / "bert.json")]
    assert report.main([*common, *bench, "--pipeline", str(tmp_path / "none.json")]) == 0
    results = json.loads(out.read_text())
    assert results["tests"] == {
        "passed": 1,
        "failed": 1,
        "errors": 0,
        "skipped": 1,
        "skip_reasons": ["needs an NVIDIA GPU: none"],
        "failed_tests": ["t::test_bad"],
    }
    assert [c["rc"] for c in results["commands"]] == [1, 0]
    assert results["dynamic_bert"]["layers"][0]["layer"] == "qkv"
    assert results["pipeline"] == {"error": "no none.json written"}
    assert "Pipeline vs MetaSchedule: no results (no none.json written)" in report.render(results, ["r.json"])


def test_t_lists_collapse_runs() -> None:
    assert report._ts([12, 1, 5, 6, 7, 8, 9]) == "T=1, T=5–9, T=12"
    assert report._ts([]) == "none"
