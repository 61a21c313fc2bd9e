"""The `scalesim` backend: SCALE-Sim 3 (PyPI scalesim) in its own virtualenv and process.

SCALE-Sim pins nothing but crashes on numpy ≥ 2.4 and calls exit() on errors, so it never shares the
worker's interpreter. The virtualenv is created on first use (`ensure_env`: `python -m venv`, then
`pip install --no-deps scalesim==3.0.0 numpy==2.3.5 tqdm`, about 100 MB) under
$KERNELFLEET_SCALESIM_VENV or ~/.cache/kernelfleet/scalesim-venv, guarded by a file lock so concurrent
workers build it once. It simulates hardware only (no tiles): use it on small shapes as a cross-check.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from service.tuning.gemmini.backends.base import (
    CHILDREN,
    Backend,
    BackendError,
    Measurement,
    layer_payload,
    run_child,
)
from service.tuning.gemmini.space import HwConfig, Layer, Mapping

SCALESIM_PINS = ("scalesim==3.0.0", "numpy==2.3.5", "tqdm")
MAX_MACS = 64 * 1024 * 1024  # beyond ~256³ SCALE-Sim takes minutes and GBs (research note §4.5)


def venv_dir() -> Path:
    env = os.environ.get("KERNELFLEET_SCALESIM_VENV")
    return Path(env) if env else Path.home() / ".cache" / "kernelfleet" / "scalesim-venv"


def ensure_env(timeout_s: float = 600.0) -> str:
    """The isolated interpreter with SCALE-Sim, created on first use; BackendError if it cannot be built."""
    root = venv_dir()
    python = root / "bin" / "python"
    marker = root / ".kernelfleet-ready"
    if marker.exists():
        return str(python)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return str(python)
        try:
            subprocess.run(
                [sys.executable, "-m", "venv", "--clear", str(root)], check=True, timeout=timeout_s, capture_output=True
            )
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--no-deps", *SCALESIM_PINS],
                check=True,
                timeout=timeout_s,
                capture_output=True,
                text=True,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            detail = getattr(exc, "stderr", "") or ""
            raise BackendError(f"could not build the scalesim virtualenv at {root}: {exc} {detail[-300:]}") from exc
        marker.write_text(" ".join(SCALESIM_PINS))
    return str(python)


class ScaleSimBackend(Backend):
    name = "scalesim"

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s

    def version(self) -> str:
        return "scalesim-3.0.0"

    def measure(self, hw: HwConfig, layers: list[Layer], mappings: list[Mapping]) -> list[Measurement]:
        big = [lay.name for lay in layers if lay.macs > MAX_MACS]
        if big:
            raise BackendError(f"scalesim is for small shapes (≤ {MAX_MACS} MACs); too large: {big}")
        python = ensure_env()
        items = [layer_payload(hw, lay, m) for lay, m in zip(layers, mappings, strict=True)]
        answer = run_child(python, CHILDREN / "scalesim_child.py", {"items": items}, self.timeout_s)
        if "error" in answer:
            raise BackendError(answer["error"])
        return [
            Measurement(self.name, lay.name, r["cycles"], None, {**r, "mapping": "not modelled by SCALE-Sim"})
            for lay, r in zip(layers, answer["results"], strict=True)
        ]
