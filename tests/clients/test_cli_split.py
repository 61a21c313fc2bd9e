"""The SDK's `kernelfleet` command holds the client commands; the service package adds the server ones."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_COMMANDS = {"standalone", "api", "worker", "beat", "migrate", "demo", "keys", "import-metaschedule",
                   "export-metaschedule"}  # fmt: skip


def _commands(help_text: str) -> set[str]:
    box = help_text.split("Commands")[-1]
    return set(re.findall(r"^│ (\S+)", box, flags=re.MULTILINE))


def test_installed_with_the_service_the_command_has_both_sets() -> None:
    from typer.testing import CliRunner

    from service.cli import app

    names = _commands(CliRunner().invoke(app, ["--help"], terminal_width=200).output)
    assert names >= SERVER_COMMANDS and {"submit", "job", "best", "dispatch", "fleet"} <= names


@pytest.mark.slow
def test_an_sdk_only_install_lists_only_commands_that_work(tmp_path: Path) -> None:
    venv = tmp_path / "sdk-only"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", f"{ROOT / 'clients' / 'python'}[cli]"],
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    exe = str(venv / "bin" / "kernelfleet")
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin"}
    top = subprocess.run([exe, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert top.returncode == 0, top.stderr
    names = _commands(top.stdout)
    assert names and not names & SERVER_COMMANDS
    for name in names:  # every listed command (and group) parses and documents itself without the service
        sub = subprocess.run([exe, name, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert sub.returncode == 0 and "service" not in sub.stderr, (name, sub.stderr)
    fleet = subprocess.run([exe, "fleet", "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert "simulate" not in _commands(fleet.stdout)
    blocked = subprocess.run(  # and the SDK's command module never imports the service
        [str(venv / "bin" / "python"), "-c", "import kernelfleet.cli, sys; assert 'service' not in sys.modules"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert blocked.returncode == 0, blocked.stderr
