"""Spike in the loop: a generated Gemmini program run on Spike's functional model of its hardware config.

What a pass proves: the program `firesim_program` writes for `hw` (compiled against that config's
gemmini_params.h, with the tuner's explicit tile factors) produces outputs bit-identical to gemmini.h's CPU
reference, on a libgemmini built from the same header, so DIM and the scratchpad/accumulator sizes it
tiles into are the config's own, and no reference output sits at the int8 limits (where a wrong sum could be
clamped to the right answer). It proves nothing about time: libgemmini is purely functional and Spike's
`rdcycle` counts instructions (research note §3), so no timing leaves this module. It is a checker, not a
measurement `Backend`: the gemmini kind runs it on the winner and the default when the tools exist.

Tools (bench/spike_tools.sh builds them into one prefix):
- KERNELFLEET_RISCV: the prefix Spike was installed into (bin/spike; include/riscv/*.h for libgemmini);
- KERNELFLEET_SPIKE: the spike binary (default $KERNELFLEET_RISCV/bin/spike);
- KERNELFLEET_LIBGEMMINI_SRC: a ucb-bar/libgemmini tree (default $KERNELFLEET_RISCV/src/libgemmini);
- KERNELFLEET_ROCC_TESTS, else GEMMINI_ROCC_TESTS: gemmini-rocc-tests with its submodules (default
  $KERNELFLEET_RISCV/src/gemmini-rocc-tests);
- KERNELFLEET_SPIKE_CACHE: per-config libgemmini builds (default $KERNELFLEET_RISCV/libgemmini-configs);
- KERNELFLEET_RISCV_CC: the bare-metal compiler (default riscv64-unknown-elf-gcc, with Debian's picolibc).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from service.tuning.gemmini.backends.firesim_program import baremetal_build_cmd, parse_uartlog, render_program
from service.tuning.gemmini.backends.gemmini_params import generator_args, render_params_h
from service.tuning.gemmini.space import HwConfig, Layer, Mapping

PICOLIBC_SPECS = Path("/usr/lib/picolibc/riscv64-unknown-elf/picolibc.specs")
# libgemmini's Makefile rule (ucb-bar/libgemmini@5b1254a), run in a directory holding the config's header
LIBGEMMINI_CXXFLAGS = ["-shared", "-std=c++17", "-fPIC", "-O3"]
# what the kind checks by default (KERNELFLEET_SPIKE_MAX_MACS overrides): Spike interprets the CPU reference too,
# ~37 M MACs/s here (BERT's FFN1, 302 M MACs, in 8 s on one Intel Xeon core), so ~30 s a config: all of BERT-base's
# distinct layers, part of ResNet-50's; layers past this total are listed as not run, never guessed
DEFAULT_MAX_MACS = 1_000_000_000


class SpikeError(RuntimeError):
    pass


class SpikeNotInstalled(SpikeError):
    pass


@dataclass(frozen=True)
class SpikeTools:
    spike: Path
    riscv: Path  # the install prefix: include/ for libgemmini's build, lib/ for the .so it loads with
    libgemmini_src: Path
    rocc_tests: Path
    cache: Path
    cc: str = "riscv64-unknown-elf-gcc"

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> SpikeTools:
        """The tools named by the environment; SpikeNotInstalled says which one is missing."""
        e = dict(os.environ if env is None else env)
        root = e.get("KERNELFLEET_RISCV", "")
        if not root and not e.get("KERNELFLEET_SPIKE"):
            raise SpikeNotInstalled("KERNELFLEET_RISCV is not set (build the tools with bench/spike_tools.sh)")
        riscv = Path(root) if root else Path(e["KERNELFLEET_SPIKE"]).resolve().parent.parent
        rocc = e.get("KERNELFLEET_ROCC_TESTS") or e.get("GEMMINI_ROCC_TESTS") or str(riscv / "src/gemmini-rocc-tests")
        tools = SpikeTools(
            spike=Path(e.get("KERNELFLEET_SPIKE") or riscv / "bin" / "spike"),
            riscv=riscv,
            libgemmini_src=Path(e.get("KERNELFLEET_LIBGEMMINI_SRC") or riscv / "src" / "libgemmini"),
            rocc_tests=Path(rocc),
            cache=Path(e.get("KERNELFLEET_SPIKE_CACHE") or riscv / "libgemmini-configs"),
            cc=e.get("KERNELFLEET_RISCV_CC") or "riscv64-unknown-elf-gcc",
        )
        why = tools.missing()
        if why:
            raise SpikeNotInstalled(why)
        return tools

    def missing(self) -> str | None:
        """Why these tools cannot run a check here, or None."""
        needs = [
            (self.spike, "spike"),
            (self.riscv / "include" / "riscv" / "extension.h", "Spike's headers"),
            (self.libgemmini_src / "gemmini.cc", "libgemmini's source"),
            (self.rocc_tests / "include" / "gemmini.h", "gemmini-rocc-tests"),
            (self.rocc_tests / "rocc-software" / "src" / "xcustom.h", "gemmini-rocc-tests' rocc-software"),
            (self.rocc_tests / "riscv-tests" / "benchmarks" / "common" / "crt.S", "gemmini-rocc-tests' riscv-tests"),
        ]
        for path, what in needs:
            if not path.exists():
                return f"{what} not installed: no {path} (bench/spike_tools.sh)"
        if not shutil.which(self.cc):
            return f"{self.cc} not installed (apt-get install gcc-riscv64-unknown-elf)"
        if self.cc == "riscv64-unknown-elf-gcc" and not PICOLIBC_SPECS.is_file():
            return "picolibc not installed (apt-get install picolibc-riscv64-unknown-elf)"
        if not shutil.which("dtc"):
            return "dtc not installed (Spike runs it at start-up: apt-get install device-tree-compiler)"
        return None


@dataclass(frozen=True)
class SpikeCheck:
    """One candidate's functional verdict. `timing` is always None: Spike counts instructions, and libgemmini
    models no Gemmini timing, so nothing here may be read as a performance number."""

    layer: str
    correct: bool  # every output equals the CPU reference bit for bit
    saturated: int  # reference outputs at the int8 limits (a clamped wrong sum would look right there)
    timing: None = None

    @property
    def passed(self) -> bool:
        return self.correct and self.saturated == 0


@dataclass(frozen=True)
class SpikeRun:
    hw_key: str
    libgemmini: str  # the per-config build's hash (of its gemmini_params.h and libgemmini's source)
    checks: tuple[SpikeCheck, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


def libgemmini_for(hw: HwConfig, tools: SpikeTools, timeout_s: float = 900) -> Path:
    """libgemmini.so compiled with `hw`'s gemmini_params.h (it sizes its scratchpad and accumulator from it),
    built once per header: cached under tools.cache by a hash of the header and the library's source."""
    header = render_params_h(generator_args(hw))
    sources = [tools.libgemmini_src / "gemmini.cc", tools.libgemmini_src / "gemmini.h"]
    h = hashlib.sha256(header.encode())
    for src in sources:
        h.update(src.read_bytes())
    h.update(str(tools.riscv).encode())
    final = tools.cache / h.hexdigest()[:16]
    so = final / "libgemmini.so"
    if so.is_file():
        return so
    tools.cache.mkdir(parents=True, exist_ok=True)
    # built aside and renamed into place, so a concurrent check never loads a half-written library
    build = Path(tempfile.mkdtemp(prefix="build-", dir=tools.cache))
    try:
        for src in sources:  # gemmini.cc includes "gemmini.h", which includes "gemmini_params.h": same dir
            shutil.copy(src, build / src.name)
        (build / "gemmini_params.h").write_text(header)
        lib = tools.riscv / "lib"
        cmd = ["g++", *LIBGEMMINI_CXXFLAGS, f"-I{tools.riscv / 'include'}", f"-L{lib}", f"-Wl,-rpath,{lib}"]
        _run([*cmd, "-o", "libgemmini.so", "gemmini.cc"], timeout_s, cwd=build, what="building libgemmini")
        try:
            build.rename(final)
        except OSError:  # another check built it first
            if not so.is_file():
                raise
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return so


def check(
    hw: HwConfig,
    candidates: list[tuple[Layer, Mapping]],
    tools: SpikeTools | None = None,
    timeout_s: float = 600,
    workdir: Path | None = None,
) -> SpikeRun:
    """Run `candidates` (all on `hw`) as one generated program under `spike --extension=gemmini` with the
    config's libgemmini; raises SpikeNotInstalled without the tools, SpikeError when a step fails."""
    tools = tools or SpikeTools.from_env()
    so = libgemmini_for(hw, tools)
    with tempfile.TemporaryDirectory(prefix="kf-spike-", dir=workdir) as tmp:
        wdir = Path(tmp)
        src, binary = wdir / "kf.c", wdir / "kf-baremetal"
        src.write_text(render_program(hw, candidates))
        (wdir / "include").mkdir()
        (wdir / "include" / "gemmini_params.h").write_text(render_params_h(generator_args(hw)))
        _run(baremetal_build_cmd(src, binary, wdir, tools.rocc_tests, cc=tools.cc), 300, what="compiling")
        env = {**os.environ, "LD_LIBRARY_PATH": str(tools.riscv / "lib")}
        cmd = [str(tools.spike), f"--extlib={so}", "--extension=gemmini", str(binary)]
        out = _run(cmd, timeout_s, env=env, what="spike")
    try:
        parsed = parse_uartlog(out, len(candidates))
    except ValueError as exc:
        raise SpikeError(f"spike output: {exc}") from exc
    checks = tuple(
        SpikeCheck(lay.name, parsed[i].correct, parsed[i].saturated) for i, (lay, _) in enumerate(candidates)
    )
    return SpikeRun(hw.key(), so.parent.name, checks)


def layer_macs(lay: Layer) -> int:
    return lay.N * lay.P * lay.Q * lay.K * lay.C * lay.R * lay.S


def verdict(
    hw: HwConfig,
    layers: list[Layer],
    mappings: list[Mapping],
    tools: SpikeTools | None = None,
    max_macs: int | None = None,
    timeout_s: float = 600,
) -> dict[str, Any]:
    """A provenance record of Spike checking `hw` with these mappings; never raises. `status` is "passed",
    "failed", or "not run: <why>" (tools absent, a failing step); layers past `max_macs` in all are listed
    under `not_run` so a pass is never read as covering them."""
    try:
        tools = tools or SpikeTools.from_env()
    except SpikeNotInstalled as exc:
        return {"status": f"not run: {exc}"}
    if max_macs is None:
        max_macs = int(os.environ.get("KERNELFLEET_SPIKE_MAX_MACS") or DEFAULT_MAX_MACS)
    picked: list[tuple[Layer, Mapping]] = []
    skipped: list[str] = []
    total = 0
    for lay, m in zip(layers, mappings, strict=True):
        macs = layer_macs(lay)
        if total + macs > max_macs:
            skipped.append(lay.name)
            continue
        picked.append((lay, m))
        total += macs
    if not picked:
        return {"status": f"not run: every layer is past the {max_macs} MAC limit for Spike", "not_run": skipped}
    try:
        run = check(hw, picked, tools, timeout_s)
    except (SpikeError, OSError, ValueError) as exc:
        return {"status": f"not run: {exc}"[:500], "not_run": [lay.name for lay in layers]}
    return {
        "status": "passed" if run.passed else "failed",
        "what": "functional only: bit-exact vs gemmini.h's CPU reference on libgemmini built for this config",
        "libgemmini": run.libgemmini,
        "checks": [{k: v for k, v in asdict(c).items() if k != "timing"} for c in run.checks],
        "not_run": skipped,
    }


def _run(
    cmd: list[str], timeout_s: float, what: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> str:
    """stdout of `cmd`; its own process group, killed whole on timeout."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SpikeError(f"{what} timed out after {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = " | ".join((err.strip() or out.strip()).splitlines()[-4:])
        raise SpikeError(f"{what} exited {proc.returncode}: {tail[-800:]}")
    return out
