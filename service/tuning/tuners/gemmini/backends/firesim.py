"""The `firesim` backend: measures candidates on Gemmini RTL simulated by FireSim (production adapter).

Per batch of candidates on one hardware config (research note §1.8, after ucb-bar/autocomp):
1. look the config up in the bitstream registry (keyed by the full generator config; a missing bitstream
   is an error: building one is hours of Vivado, not a tuning step);
2. render a bare-metal C program (firesim_program) and build it with the host's build command against
   that config's gemmini_params.h;
3. write a private workload JSON (deploy/workloads/<bench>.json) and runtime config (-c), and an HWDB (-a)
   naming the bitstream;
4. `firesim infrasetup`, then `firesim runworkload` under a timeout (`firesim kill` on timeout);
5. parse the TUNE_RESULT lines from deploy/results-workload/<launch>-<bench>-<tag>/<job>/uartlog.
One manager invocation per FireSim checkout at a time (a file lock), since the manager keeps state there.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from service.tuning.tuners.gemmini.backends.base import Backend, BackendError, Measurement
from service.tuning.tuners.gemmini.backends.firesim_program import parse_uartlog, render_program
from service.tuning.tuners.gemmini.space import HwConfig, Layer, Mapping


class MissingBitstream(BackendError):
    pass


class BitstreamRegistry:
    """generator-config key → {hwdb_name, bitstream_tar, params_h}; a JSON file the FireSim host maintains."""

    def __init__(self, path: Path):
        self.path = path

    def _load(self) -> dict[str, dict[str, str]]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def register(self, hw: HwConfig, hwdb_name: str, bitstream_tar: str, params_h: str) -> None:
        bad = hw.violations()
        if bad:  # Gemmini's generator would not have built it (legality.py)
            raise ValueError(f"not a config Gemmini can generate: {'; '.join(bad)}")
        data = self._load()
        data[hw.key()] = {
            "hwdb_name": hwdb_name,
            "bitstream_tar": bitstream_tar,
            "params_h": params_h,
            "generator_config": hw.generator_config(),  # type: ignore[dict-item]
        }
        self.path.write_text(json.dumps(data, indent=1, sort_keys=True))

    def configs(self) -> list[HwConfig]:
        """The registered configs Gemmini can generate (an entry its generator would refuse is not offered)."""
        from service.tuning.tuners.gemmini.space import generator_violations

        gens = [e["generator_config"] for e in self._load().values()]
        return [HwConfig.from_generator_config(g) for g in gens if not generator_violations(g)]  # type: ignore[arg-type]

    def lookup(self, hw: HwConfig) -> dict[str, str]:
        entry = self._load().get(hw.key())
        if entry is None:
            raise MissingBitstream(
                f"no FireSim bitstream for Gemmini config {hw.key()} ({hw.generator_config()}); build one with "
                "`firesim buildbitstream` and register it"
            )
        return entry


@dataclass(frozen=True)
class Request:
    hw: HwConfig
    layers: list[Layer]
    mappings: list[Mapping]


class FireSimBackend(Backend):
    name = "firesim"

    def __init__(
        self,
        firesim_dir: str | Path,
        registry: str | Path,
        firesim_cmd: str = "firesim",
        build_cmd: str = "make -C {firesim_dir}/../gemmini-rocc-tests SRC={src} OUT={out} PARAMS_H={params_h}",
        timeout_s: float = 3600.0,
        batch: int = 20,
    ) -> None:
        self.dir = Path(firesim_dir)
        self.registry = BitstreamRegistry(Path(registry))
        self.firesim_cmd, self.build_cmd = firesim_cmd, build_cmd
        self.timeout_s, self.batch = timeout_s, batch

    def available(self) -> str | None:
        if not (self.dir / "deploy").is_dir():
            return f"no FireSim checkout at {self.dir} (deploy/ missing)"
        return None

    def version(self) -> str:
        return "firesim"

    def hardware_choices(self) -> list[HwConfig] | None:
        return self.registry.configs()  # a new config is hours of `firesim buildbitstream`, not a tuning step

    def measure(self, hw: HwConfig, layers: list[Layer], mappings: list[Mapping]) -> list[Measurement]:
        return self.measure_many([Request(hw, layers, mappings)])[0]

    def measure_many(self, requests: Sequence[Request]) -> list[list[Measurement]]:
        """Requests grouped by hardware config (one bitstream each), each group run in batches."""
        groups: dict[str, list[tuple[int, int]]] = {}
        for r_i, req in enumerate(requests):
            for l_i in range(len(req.layers)):
                groups.setdefault(req.hw.key(), []).append((r_i, l_i))
        out: list[list[Measurement | None]] = [[None] * len(r.layers) for r in requests]
        for items in groups.values():
            hw = requests[items[0][0]].hw
            entry = self.registry.lookup(hw)
            for start in range(0, len(items), self.batch):
                chunk = items[start : start + self.batch]
                cands = [(requests[r].layers[i], requests[r].mappings[i]) for r, i in chunk]
                results = self._run_batch(hw, entry, cands)
                for (r, i), (cycles, correct) in zip(chunk, results, strict=True):
                    lay = requests[r].layers[i]
                    out[r][i] = Measurement(self.name, lay.name, float(cycles), None, {"correct": correct})
        return [[m for m in row if m is not None] for row in out]

    # -- one FireSim run ----------------------------------------------------------------------------
    def _run_batch(
        self, hw: HwConfig, entry: dict[str, str], cands: list[tuple[Layer, Mapping]]
    ) -> list[tuple[int, bool]]:
        tag = uuid.uuid4().hex[:10]
        bench = f"kf-gemmini-{tag}"
        wdir = self.dir / "deploy" / "workloads" / bench
        wdir.mkdir(parents=True, exist_ok=True)
        src, binary = wdir / f"{bench}.c", wdir / f"{bench}-baremetal"
        src.write_text(render_program(hw, cands))
        self._build(src, binary, entry["params_h"])
        (self.dir / "deploy" / "workloads" / f"{bench}.json").write_text(
            json.dumps(
                {
                    "benchmark_name": bench,
                    "common_simulation_outputs": ["uartlog"],
                    "workloads": [{"name": f"{bench}-job", "bootbinary": binary.name, "rootfs": None}],
                },
                indent=1,
            )
        )
        runtime, hwdb = wdir / "config_runtime.yaml", wdir / "config_hwdb.yaml"
        # JSON is YAML: the manager reads these with its YAML loader
        runtime.write_text(
            json.dumps(
                {
                    "run_farm": {
                        "base_recipe": "run-farm-recipes/externally_provisioned.yaml",
                        "recipe_arg_overrides": {"run_farm_hosts_to_use": [{"localhost": "one_fpgas_spec"}]},
                    },
                    "metasimulation": {"metasimulation_enabled": False},
                    "target_config": {
                        "topology": "no_net_config",
                        "no_net_num_nodes": 1,
                        "default_hw_config": entry["hwdb_name"],
                        "plusarg_passthrough": "",
                    },
                    "workload": {"workload_name": f"{bench}.json", "terminate_on_completion": "no", "suffix_tag": tag},
                },
                indent=1,
            )
        )
        hwdb.write_text(
            json.dumps(
                {
                    entry["hwdb_name"]: {
                        "bitstream_tar": entry["bitstream_tar"],
                        "deploy_quintuplet_override": None,
                        "custom_runtime_config": None,
                    }
                }
            )
        )
        with open(self.dir / ".kernelfleet-firesim.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            args = ["-c", str(runtime), "-a", str(hwdb)]
            self._firesim("infrasetup", args, self.timeout_s)
            self._firesim("runworkload", args, self.timeout_s, kill_on_timeout=True)
        uartlog = self._find_uartlog(bench, tag)
        try:
            parsed = parse_uartlog(uartlog.read_text(errors="replace"), len(cands))
        except ValueError as exc:
            raise BackendError(f"{uartlog}: {exc}") from exc
        return [parsed[i] for i in range(len(cands))]

    def _build(self, src: Path, out: Path, params_h: str) -> None:
        cmd = self.build_cmd.format(firesim_dir=self.dir, src=src, out=out, params_h=params_h)
        r = subprocess.run(shlex.split(cmd), capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not out.exists():
            raise BackendError(f"building {src.name} failed ({r.returncode}): {(r.stderr or r.stdout)[-300:]}")

    def _firesim(self, verb: str, args: list[str], timeout_s: float, kill_on_timeout: bool = False) -> None:
        env = {**os.environ, "FIRESIM_SOURCED": "1"}
        cmd = [*shlex.split(self.firesim_cmd), verb, *args]
        proc = subprocess.Popen(
            cmd,
            cwd=self.dir / "deploy",
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            if kill_on_timeout:  # the simulations outlive the manager: stop them on the run farm too
                subprocess.run(
                    [*shlex.split(self.firesim_cmd), "kill", *args],
                    cwd=self.dir / "deploy",
                    env=env,
                    capture_output=True,
                    timeout=300,
                )
            raise BackendError(f"firesim {verb} timed out after {timeout_s:g} s (ran `firesim kill`)") from None
        if proc.returncode != 0:
            raise BackendError(f"firesim {verb} exited {proc.returncode}: {out.strip()[-300:]}")

    def _find_uartlog(self, bench: str, tag: str) -> Path:
        found = sorted((self.dir / "deploy" / "results-workload").glob(f"*-{bench}-{tag}/*/uartlog"))
        if not found:
            raise BackendError(f"firesim runworkload left no uartlog for {bench} (suffix_tag {tag})")
        return found[-1]
