"""Service strings that look like rich markup print as they are (issue 34 item 10: '[/x]' crashed every reader)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kernelfleet import cli

HOSTILE = "[/x] op [bold]"


def _job() -> SimpleNamespace:
    shape = SimpleNamespace(
        shape={"M": 1},
        state=HOSTILE,
        trials_done=1,
        trials=2,
        best_latency_s=None,
        baseline_latency_s=None,
        speedup=None,
    )
    return SimpleNamespace(
        id="j[/]",
        state=HOSTILE,
        workload_hash="w[/]",
        target_fingerprint=HOSTILE,
        trials_done=1,
        trials_total=2,
        error=HOSTILE,
        waiting_for_worker=HOSTILE,
        published=False,
        publish_reason=HOSTILE,
        shapes=[shape],
    )


def _model() -> SimpleNamespace:
    op = SimpleNamespace(
        name=HOSTILE,
        occurrences=1,
        share=1.0,
        trials=2,
        job_id="j",
        state=HOSTILE,
        progress=0.5,
        skipped=None,
        error=HOSTILE,
    )
    skipped = SimpleNamespace(name=HOSTILE, skipped=HOSTILE)
    return SimpleNamespace(
        id="m",
        name=HOSTILE,
        state="running",
        jobs_done=0,
        jobs_total=1,
        trials_done=1,
        trials_total=2,
        progress=0.5,
        states={HOSTILE: 1},
        ops=[op],
        skipped=[skipped],
    )


@pytest.mark.parametrize("show", [lambda: cli._print_job(_job()), lambda: cli._print_model(_model())])
def test_markup_like_names_print_verbatim(show, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    show()
    out = capsys.readouterr().out
    assert "[/x] op" in out  # printed, not parsed (before: rich.errors.MarkupError)
