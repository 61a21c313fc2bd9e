"""The `firesim` backend: measures candidates on Gemmini RTL simulated by FireSim (production adapter).

Per batch of candidates on one hardware config (research note §1.8, after ucb-bar/autocomp):
1. look the config up in the bitstream registry (keyed by the full generator config; a missing bitstream
   is an error: building one is hours of Vivado, not a tuning step);
2. render a bare-metal C program (firesim_program) and the config's gemmini_params.h (gemmini_params), and
   build the program against them (gemmini-rocc-tests' bare-metal flow, or the host's build command);
3. write a private workload JSON (deploy/workloads/<bench>.json), runtime config (-c) and HWDB (-a) naming
   the bitstream, with every key of the manager's sample configs (firesim_schema; checked before running);
4. `firesim infrasetup`, then `firesim runworkload` under a timeout (`firesim kill` on timeout), each in a
   shell that sourced the checkout's sourceme-manager.sh (the environment is FireSim's, never set here);
5. parse the TUNE_RESULT lines from deploy/results-workload/<launch>-<bench>-<tag>/<job>/uartlog.
One manager invocation per FireSim checkout at a time (a file lock), since the manager keeps state there.
The run farm is externally provisioned (on-prem FPGAs, or metasimulation hosts), never EC2 by default.
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
from typing import Any

from service.tuning.gemmini.backends import firesim_schema as schema
from service.tuning.gemmini.backends.base import Backend, BackendError, Measurement
from service.tuning.gemmini.backends.firesim_program import (
    TuneResult,
    baremetal_build_cmd,
    parse_uartlog,
    render_program,
)
from service.tuning.gemmini.backends.gemmini_params import generator_args, render_params_h
from service.tuning.gemmini.space import HwConfig, Layer, Mapping


class MissingBitstream(BackendError):
    pass


class BitstreamRegistry:
    """generator-config key → {hwdb_name, bitstream_tar, generator_args}; a JSON file the FireSim host maintains.

    `generator_args` is what Gemmini's generator is (to be) given for the bitstream: Gemmini's defaultConfig
    with the searched knobs on top (gemmini_params.generator_args): dataflow, in-flight memory requests, bus
    widths, types, queue sizes... The program for it is compiled against the header those args generate."""

    def __init__(self, path: Path):
        self.path = path

    def _load(self) -> dict[str, dict[str, Any]]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def register(self, hw: HwConfig, hwdb_name: str, bitstream_tar: str) -> None:
        bad = hw.violations()
        if bad:  # Gemmini's generator would not have built it (legality.py)
            raise ValueError(f"not a config Gemmini can generate: {'; '.join(bad)}")
        data = self._load()
        data[hw.key()] = {
            "hwdb_name": hwdb_name,
            "bitstream_tar": bitstream_tar,
            "generator_config": hw.generator_config(),
            "generator_args": generator_args(hw),
        }
        self.path.write_text(json.dumps(data, indent=1, sort_keys=True))

    def configs(self) -> list[HwConfig]:
        """The registered configs Gemmini can generate (an entry its generator would refuse is not offered)."""
        from service.tuning.gemmini.space import generator_violations

        gens = [e["generator_config"] for e in self._load().values()]
        return [HwConfig.from_generator_config(g) for g in gens if not generator_violations(g)]

    def lookup(self, hw: HwConfig) -> dict[str, Any]:
        """The entry registered for exactly `hw`'s generator config (issue 36 item 6). Nothing FireSim reads names
        the Gemmini config: the runtime config names an HWDB entry, the HWDB entry a bitstream tarball, and only
        the build recipe that made the bitstream (its TARGET_CONFIG, a Chipyard config class) ties it to generator
        parameters; this adapter writes no build recipe. So the tie is this registry's record, and an entry whose
        recorded generator config or args differ from what `hw` generates (a stale or hand-edited registry) is
        refused rather than run as if it were `hw`."""
        entry = self._load().get(hw.key())
        if entry is None:
            raise MissingBitstream(
                f"no FireSim bitstream for Gemmini config {hw.key()} ({hw.generator_config()}); build one with "
                "`firesim buildbitstream` and register it"
            )
        entry.setdefault("generator_args", generator_args(hw))  # entries written before the args were recorded
        for field, want in (("generator_config", hw.generator_config()), ("generator_args", generator_args(hw))):
            if entry.get(field) != want:
                raise MissingBitstream(
                    f"the registry's bitstream {entry.get('hwdb_name')!r} under {hw.key()} records {field} "
                    f"{entry.get(field)} but {hw.key()} generates {want}: re-register it for the config it was "
                    "built from"
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
        build_cmd: str | None = None,
        rocc_tests_dir: str | Path | None = None,
        timeout_s: float = 3600.0,
        batch: int = 20,
        platform: str = "XilinxAlveoU250InstanceDeployManager",
        run_farm_hosts: Sequence[tuple[str, str]] | None = None,
        simulation_dir: str | None = None,
        fpga_db: str = "/opt/firesim-db.json",
        metasimulation: bool = False,
        metasim_host_simulator: str = "verilator",
        sourceme_args: str = "",
    ) -> None:
        self.dir = Path(firesim_dir)
        self.registry = BitstreamRegistry(Path(registry))
        self.firesim_cmd, self.build_cmd = firesim_cmd, build_cmd
        self.rocc_tests = Path(rocc_tests_dir) if rocc_tests_dir else self.dir.parent / "gemmini-rocc-tests"
        self.timeout_s, self.batch = timeout_s, batch
        # a host spec of the externally_provisioned recipe: FPGA slots, or metasimulation slots (num_metasims)
        default_hosts = [("localhost", "four_metasims_spec" if metasimulation else "one_fpgas_spec")]
        self.platform = platform
        self.run_farm_hosts = [(h, s) for h, s in run_farm_hosts] if run_farm_hosts else default_hosts
        self.simulation_dir = simulation_dir or str(Path.home() / "FIRESIM_RUNS_DIR")  # managerinit's default
        self.fpga_db, self.metasimulation, self.metasim_host_simulator = fpga_db, metasimulation, metasim_host_simulator
        self.sourceme_args = sourceme_args  # e.g. --skip-ssh-setup where the run farm needs no ssh-agent

    def available(self) -> str | None:
        if not (self.dir / "deploy").is_dir():
            return f"no FireSim checkout at {self.dir} (deploy/ missing)"
        if not (self.dir / "sourceme-manager.sh").is_file():
            return f"{self.dir} has no sourceme-manager.sh"
        env_sh = self.dir / "env.sh"
        if not env_sh.is_file() or "did not execute correctly" in env_sh.read_text(errors="replace"):
            return f"{self.dir}: FireSim's build-setup.sh has not completed (env.sh missing or marked failed)"
        if not (self.dir / "deploy" / "config_build_recipes.yaml").is_file():
            return f"{self.dir}/deploy: run `firesim managerinit --platform <platform>` first"
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
                for (r, i), res in zip(chunk, results, strict=True):
                    lay = requests[r].layers[i]
                    detail = {"correct": res.correct, "saturated": res.saturated}
                    out[r][i] = Measurement(self.name, lay.name, float(res.cycles), None, detail)
        return [[m for m in row if m is not None] for row in out]

    # -- the manager's files --------------------------------------------------------------------------
    def runtime_config(self, hwdb_name: str, workload_json: str, tag: str, nodes: int = 1) -> dict[str, Any]:
        """config_runtime.yaml: every section and key of the manager's sample (firesim_schema.RUNTIME_SECTIONS),
        the sample's values where we have no reason to differ, an externally provisioned run farm."""
        return {
            "run_farm": {
                "base_recipe": schema.EXTERNALLY_PROVISIONED_RECIPE,
                "recipe_arg_overrides": {
                    "default_platform": self.platform,
                    "default_simulation_dir": self.simulation_dir,
                    "default_fpga_db": self.fpga_db,
                    "run_farm_hosts_to_use": [{h: s} for h, s in self.run_farm_hosts],
                },
            },
            "metasimulation": {
                "metasimulation_enabled": self.metasimulation,
                "metasimulation_host_simulator": self.metasim_host_simulator,
                "metasimulation_only_plusargs": "+fesvr-step-size=128 +max-cycles=100000000",
                "metasimulation_only_vcs_plusargs": "+vcs+initreg+0 +vcs+initmem+0",
            },
            "target_config": {
                "topology": "no_net_config",
                "no_net_num_nodes": nodes,
                "link_latency": 6405,
                "switching_latency": 10,
                "net_bandwidth": 200,
                "profile_interval": -1,
                # an HWDB entry; with metasimulation, a config_build_recipes.yaml entry of the same name
                "default_hw_config": hwdb_name,
                "plusarg_passthrough": "",
            },
            "tracing": {"enable": False, "output_format": 0, "selector": 1, "start": 0, "end": -1},
            "autocounter": {"read_rate": 0},
            "workload": {"workload_name": workload_json, "terminate_on_completion": False, "suffix_tag": tag},
            "host_debug": {"zero_out_dram": False, "disable_synth_asserts": False},
            "synth_print": {"start": 0, "end": -1, "cycle_prefix": True},
        }

    @staticmethod
    def hwdb(entry: dict[str, Any]) -> dict[str, Any]:
        """config_hwdb.yaml with the one entry this run uses (firesim_schema.HWDB_ENTRY_KEYS)."""
        return {
            entry["hwdb_name"]: {
                "bitstream_tar": entry["bitstream_tar"],
                "deploy_quintuplet_override": None,
                "deploy_makefrag_override": None,
                "custom_runtime_config": None,
            }
        }

    @staticmethod
    def workload(bench: str, binary: str) -> dict[str, Any]:
        """The workload JSON: one bare-metal job, no rootfs, the uartlog copied back."""
        return {
            "benchmark_name": bench,
            "common_bootbinary": binary,
            "common_rootfs": None,
            "common_outputs": [],
            "common_simulation_outputs": ["uartlog"],
            "workloads": [
                {
                    "name": f"{bench}-job",
                    "bootbinary": binary,
                    "rootfs": None,
                    "outputs": [],
                    "simulation_outputs": [],
                }
            ],
        }

    def write_run_files(self, hw: HwConfig, entry: dict[str, Any], bench: str, tag: str) -> tuple[Path, Path]:
        """Workload JSON, config_runtime.yaml and config_hwdb.yaml for one run (JSON is YAML to the manager),
        each checked against the sample schema first. Returns (runtime, hwdb) paths."""
        workloads = self.dir / "deploy" / "workloads"
        wdir = workloads / bench
        wdir.mkdir(parents=True, exist_ok=True)
        runtime_cfg = self.runtime_config(entry["hwdb_name"], f"{bench}.json", tag)
        hwdb_cfg, wl = self.hwdb(entry), self.workload(bench, f"{bench}-baremetal")
        problems = (
            schema.runtime_problems(runtime_cfg)
            + schema.hwdb_problems(hwdb_cfg, entry["hwdb_name"])
            + schema.workload_problems(wl)
        )
        if problems:
            raise BackendError(f"generated FireSim configs break the manager's schema: {problems}")
        (workloads / f"{bench}.json").write_text(json.dumps(wl, indent=1))
        runtime, hwdb = wdir / "config_runtime.yaml", wdir / "config_hwdb.yaml"
        runtime.write_text(json.dumps(runtime_cfg, indent=1))
        hwdb.write_text(json.dumps(hwdb_cfg, indent=1))
        return runtime, hwdb

    # -- one FireSim run ----------------------------------------------------------------------------
    def _run_batch(self, hw: HwConfig, entry: dict[str, Any], cands: list[tuple[Layer, Mapping]]) -> list[TuneResult]:
        tag = uuid.uuid4().hex[:10]
        bench = f"kf-gemmini-{tag}"
        runtime, hwdb = self.write_run_files(hw, entry, bench, tag)
        wdir = runtime.parent
        src, binary = wdir / f"{bench}.c", wdir / f"{bench}-baremetal"
        src.write_text(render_program(hw, cands))
        (wdir / "include").mkdir(exist_ok=True)
        (wdir / "include" / "gemmini_params.h").write_text(render_params_h(entry["generator_args"]))
        self._build(src, binary, wdir)
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

    def _build(self, src: Path, out: Path, params_dir: Path) -> None:
        if self.build_cmd is None:
            cmd = baremetal_build_cmd(src, out, params_dir, self.rocc_tests)
        else:
            fmt = self.build_cmd.format(
                firesim_dir=self.dir,
                src=src,
                out=out,
                params_dir=params_dir,
                params_h=params_dir / "include" / "gemmini_params.h",
                rocc_tests=self.rocc_tests,
            )
            cmd = shlex.split(fmt)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except FileNotFoundError as exc:
            raise BackendError(f"building {src.name}: {exc}") from exc
        if r.returncode != 0 or not out.exists():
            raise BackendError(f"building {src.name} failed ({r.returncode}): {(r.stderr or r.stdout)[-300:]}")

    def _manager_cmd(self, verb: str, args: list[str]) -> list[str]:
        """`firesim <verb> <args>` in a bash that sourced the checkout's sourceme-manager.sh, from deploy/."""
        script = (
            'cd "$1" && shift && cmd=("$@") && set -- && '
            f"source ./sourceme-manager.sh {self.sourceme_args} >&2 && "
            '[ -n "$FIRESIM_SOURCED" ] && cd deploy && exec "${cmd[@]}"'
        )
        return ["bash", "-c", script, "kf-firesim", str(self.dir), *shlex.split(self.firesim_cmd), verb, *args]

    def _firesim(self, verb: str, args: list[str], timeout_s: float, kill_on_timeout: bool = False) -> None:
        proc = subprocess.Popen(
            self._manager_cmd(verb, args),
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
                subprocess.run(self._manager_cmd("kill", args), capture_output=True, timeout=300)
            raise BackendError(f"firesim {verb} timed out after {timeout_s:g} s (ran `firesim kill`)") from None
        if proc.returncode != 0:
            raise BackendError(f"firesim {verb} exited {proc.returncode}: {out.strip()[-300:]}")

    def _find_uartlog(self, bench: str, tag: str) -> Path:
        found = sorted((self.dir / "deploy" / "results-workload").glob(f"*-{bench}-{tag}/*/uartlog"))
        if not found:
            raise BackendError(f"firesim runworkload left no uartlog for {bench} (suffix_tag {tag})")
        return found[-1]


def main(argv: Sequence[str] | None = None) -> None:
    """Write one run's files into a FireSim checkout (for checking them with `firesim runcheck`):
    python -m service.tuning.gemmini.backends.firesim FIRESIM_DIR HWDB_NAME BITSTREAM_TAR [--metasim]"""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("firesim_dir")
    p.add_argument("hwdb_name")
    p.add_argument("bitstream_tar")
    p.add_argument("--platform", default="XilinxAlveoU250InstanceDeployManager")
    p.add_argument("--metasim", action="store_true", help="metasimulation_enabled: true")
    p.add_argument("--tag", default="runcheck")
    a = p.parse_args(argv)
    hw = HwConfig()
    be = FireSimBackend(
        a.firesim_dir, Path(a.firesim_dir) / "kf-registry.json", platform=a.platform, metasimulation=a.metasim
    )
    entry = {"hwdb_name": a.hwdb_name, "bitstream_tar": a.bitstream_tar, "generator_args": generator_args(hw)}
    bench = f"kf-gemmini-{a.tag}"
    runtime, hwdb = be.write_run_files(hw, entry, bench, a.tag)
    params = runtime.parent / "include" / "gemmini_params.h"
    params.parent.mkdir(exist_ok=True)
    params.write_text(render_params_h(entry["generator_args"]))
    print(f"firesim runcheck -c {runtime} -a {hwdb}")


if __name__ == "__main__":
    main()
