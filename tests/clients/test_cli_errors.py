"""Every CLI error is one line that says how to fix it, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Fleet


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = "from kernelfleet.cli import main; main()"
    base = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "KERNELFLEET_URL": "http://127.0.0.1:9"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_malformed_shape_names_the_option_and_the_form(tmp_path: Path) -> None:
    line = _one_line(_run(["best", "--workload", "w", "--target", "t", "--shape", "M=61x"], tmp_path))
    assert "--shape 'M=61x'" in line and "NAME=INT" in line


def test_a_spec_without_a_distribution_says_what_to_add(tmp_path: Path) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"workload": {"op": "dense"}, "target": {"kind": "llvm", "mcpu": "host"}}))
    line = _one_line(_run(["submit", str(spec)], tmp_path))
    assert "no 'distribution'" in line and '"dim": "M"' in line
    spec.write_text("{not json")
    assert "is not JSON" in _one_line(_run(["submit", str(spec)], tmp_path))
    assert "cannot read the job spec" in _one_line(_run(["submit", str(tmp_path / "missing.json")], tmp_path))


def test_an_unreachable_service_says_how_to_start_one(tmp_path: Path) -> None:
    assert "kernelfleet standalone" in _one_line(_run(["jobs"], tmp_path))


@pytest.fixture
def api_only(tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path / "svc", {})
    fleet.start_api()
    yield fleet
    fleet.stop()


@pytest.mark.slow
def test_a_401_says_where_the_cli_looked_for_the_key(api_only: Fleet, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {"KERNELFLEET_URL": api_only.url}
    line = _one_line(_run(["jobs"], outside, env))
    assert "401" in line and "KERNELFLEET_API_KEY" in line and str(outside / ".kernelfleet" / "admin.key") in line
    line = _one_line(_run(["jobs"], outside, {**env, "KERNELFLEET_API_KEY": "kf_wrong"}))
    assert "from KERNELFLEET_API_KEY" in line
    ok = _run(["jobs"], outside, {**env, "KERNELFLEET_API_KEY": api_only.api_key or ""})
    assert ok.returncode == 0, ok.stderr
