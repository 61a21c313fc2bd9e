"""The backend interface and the one way backends run third-party code: a child process with a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any, ClassVar

from service.tuning.gemmini.space import HwConfig, Layer, Mapping


class BackendError(RuntimeError):
    pass


@dataclass(frozen=True)
class Measurement:
    """One layer measured by one backend; `backend` travels with the number everywhere it is stored."""

    backend: str
    layer: str
    cycles: float
    energy_pj: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Backend(ABC):
    name: ClassVar[str]

    @abstractmethod
    def measure(self, hw: HwConfig, layers: list[Layer], mappings: list[Mapping]) -> list[Measurement]:
        """Every layer on `hw` with its mapping; raises BackendError when nothing could be measured."""

    def measure_points(self, points: Sequence[tuple[HwConfig, Layer, Mapping]]) -> list[Measurement]:
        """Each (hw, layer, mapping) measured on its own config, e.g. a calibration sample. This default makes
        one `measure` call per run of consecutive points on one config; a backend that scores many configs in
        one run overrides it."""
        out: list[Measurement] = []
        for hw, run in groupby(points, key=lambda p: p[0]):
            items = list(run)
            out += self.measure(hw, [lay for _, lay, _ in items], [m for _, _, m in items])
        return out

    def hardware_choices(self) -> list[HwConfig] | None:
        """The only hardware configs this backend can measure (FireSim: those with a bitstream), or None
        when it models any config."""
        return None

    def available(self) -> str | None:
        """Why this backend cannot run on this host, or None."""
        return None

    def version(self) -> str:
        return "unknown"


def layer_payload(hw: HwConfig, layer: Layer, m: Mapping) -> dict[str, Any]:
    """What a child process scores: the config, the layer, its tiles and the dataflow it runs with (the
    mapping's, else on a BOTH array the one the analytical model prefers for this layer)."""
    from service.tuning.gemmini.model import resolve

    return {"hw": hw.to_dict(), "layer": asdict(layer), "tiles": m.to_dict(), "flow": resolve(hw, layer, m).flow}


def run_child(python: str, script: Path, payload: Any, timeout_s: float) -> Any:
    """Run `script` under `python` with `payload` as JSON on stdin; its last stdout line is the JSON answer.
    The child gets its own process group so a timeout kills everything it started."""
    proc = subprocess.Popen(
        [python, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "MPLBACKEND": "Agg"},
    )
    try:
        out, err = proc.communicate(json.dumps(payload), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise BackendError(f"{script.name} timed out after {timeout_s:g} s") from None
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (err or out).strip().splitlines()[-3:]
        raise BackendError(f"{script.name} exited {proc.returncode}: {' | '.join(tail)}")
    return json.loads(lines[-1])


CHILDREN = Path(__file__).parent / "children"
MAIN_PYTHON = sys.executable
