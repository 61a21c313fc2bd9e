"""The `pipeline` job page: the default panels and how well ALCOP's model and the search ranked candidates."""

from __future__ import annotations

import math

from service.api.dashboard import panels as ui
from service.api.dashboard.job_pages.base import JobPage
from service.tuning.kinds.pipeline import CONFIG_FORMAT


class PipelinePage(JobPage):
    def panels(self, data: ui.JobData, describe: ui.Describe) -> list[ui.Panel]:
        return [*ui.default_panels(data, describe=describe), model_quality(data.candidates)]


def model_quality(candidates: list[ui.CandidatePoint]) -> ui.Panel:
    """Per shape, how well the search's proposal order and the analytical model did (ALCOP Figs. 5.13–5.14)."""
    from service.tuning.tuners.pipeline.model import best_in_top_k, rank_correlation

    by_shape: dict[str, list[ui.CandidatePoint]] = {}
    for c in candidates:
        if c.config.get("format") == CONFIG_FORMAT:
            by_shape.setdefault(c.shape_key, []).append(c)
    rows: list[list[ui.Cell]] = []
    for shape, points in by_shape.items():
        measured = [c.latency_s if c.latency_s else math.inf for c in points]  # proposal order
        paired = [(c.config["predicted_s"], c.latency_s) for c in points if c.latency_s and "predicted_s" in c.config]
        rho = rank_correlation([p for p, _ in paired], [m for _, m in paired]) if len(paired) > 1 else None
        ran = sum(math.isfinite(m) for m in measured)
        quality = None if rho is None or math.isnan(rho) else round(rho, 3)
        rows.append([shape, len(points), ran, best_in_top_k(measured, 10), best_in_top_k(measured, 50), quality])
    return ui.table(
        "model",
        "Analytical model and search",
        [
            ui.Column("shape"),
            ui.Column("proposals", "count"),
            ui.Column("ran", "count"),
            ui.Column("best-in-top-10"),
            ui.Column("best-in-top-50"),
            ui.Column("Spearman ρ (predicted vs measured)"),
        ],
        rows,
        note="best-in-top-k: the best of the first k proposals ÷ the best found (1.0 = found within k)",
    )
