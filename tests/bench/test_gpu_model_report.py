"""bench/gpu_model_report.py: the first light's 20 points next to their predictions, and the rules' new tiles."""

from __future__ import annotations

from pathlib import Path

from tests.bench.modules import load


def test_the_report_lists_every_measured_point_and_labels_predictions(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    load("gpu_model_report").main(["--out", str(out)])
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith(("| qkv |", "| ffn_down |"))]
    assert len(rows) == 20
    ratios = [float(line.split("|")[6]) for line in rows]
    assert all(0.9 <= r <= 1.25 for r in ratios), ratios
    assert "PREDICTED, not measured" in text and text.count("Geomean cuBLAS / predicted") == 2
    # §3: the screen's fp16 / bf16 proposals, predicted with the model version named, next to the H200's cuBLAS
    section = text.split("## 3.", 1)[1]
    assert "model version 2" in section and "PREDICTED" in section
    summary = [line for line in section.splitlines() if line.startswith(("| fp16 |", "| bf16 |"))]
    assert len(summary) == 4 and all("predicted" in line for line in summary)
    assert "_sk" in section and "gemv_" in section
