"""bench/gpu_session.sh on a CPU host: it parses, and it stops up front, naming every missing prerequisite, before
any GPU minute is spent (run with a PATH that lacks nvidia-smi, g++ and nvcc)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.bench.modules import ROOT

SCRIPT = ROOT / "bench" / "gpu_session.sh"
TOOLS = ("dirname", "mkdir", "cat", "tee", "tar", "xz", "cksum", "rm", "cp", "timeout")  # what it may call early


def _bin(tmp_path: Path, *fakes: str) -> Path:
    """A PATH with the basic tools only, plus `fakes` as executables that succeed (stand-ins, not the tools)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found:
            (bindir / tool).symlink_to(found)
    for fake in fakes:
        (bindir / fake).write_text("#!/bin/sh\nexit 0\n")
        (bindir / fake).chmod(0o755)
    return bindir


def _run(tmp_path: Path, bindir: Path, mode: str = "run-tests", **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": str(bindir), "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "HOME": str(tmp_path)}
    return subprocess.run(
        ["/bin/bash", str(SCRIPT), mode],
        env=base | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_script_parses() -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def _bare_python(bindir: Path) -> str:
    """This Python without its site-packages (-S): no nvcc wheel, no torch, as on a machine that lacks them."""
    shim = bindir / "bare-python"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    shim.chmod(0o755)
    return str(shim)


def test_missing_prerequisites_are_named_together_and_nothing_runs(tmp_path: Path) -> None:
    bindir = _bin(tmp_path)
    done = _run(tmp_path, bindir, PYTHON=_bare_python(bindir))
    assert done.returncode == 3, done.stdout + done.stderr
    for needle in ("nvidia-smi is missing", "no C/C++ compiler (g++", "no nvcc", "torch"):
        assert needle in done.stderr
    assert not (tmp_path / "out").exists()  # stopped before the tests: no results, no GPU time


def test_present_tools_are_not_reported(tmp_path: Path) -> None:
    done = _run(tmp_path, _bin(tmp_path, "nvidia-smi", "g++", "nvcc"))
    assert done.returncode == 3  # torch with CUDA and TVM with CUDA are still missing on a CPU host
    assert "nvidia-smi" not in done.stderr and "compiler" not in done.stderr and "nvcc" not in done.stderr


def test_nvcc_from_the_pip_wheel_is_found(tmp_path: Path) -> None:
    wheel_bin = tmp_path / "site" / "nvidia" / "cu13" / "bin"
    wheel_bin.mkdir(parents=True)
    (wheel_bin / "nvcc").write_text("#!/bin/sh\nexit 0\n")
    (wheel_bin / "nvcc").chmod(0o755)
    pythonpath = os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])
    done = _run(tmp_path, _bin(tmp_path, "g++"), PYTHONPATH=pythonpath)
    assert done.returncode == 3
    assert f"nvcc: from the nvidia-cuda-nvcc wheel, {wheel_bin / 'nvcc'}" in done.stdout
    assert "no nvcc" not in done.stderr


def test_unknown_mode_and_missing_layer_are_usage_errors(tmp_path: Path) -> None:
    assert _run(tmp_path, _bin(tmp_path), mode="nope").returncode == 2
    done = _run(tmp_path, tmp_path / "bin", mode="run-bench-full")
    assert done.returncode == 2 and "run-bench-full LAYER" in done.stderr


FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu*) echo "Stand-in GPU, 999.99, 9.0, 81559 MiB";;
  -L) echo "GPU 0: Stand-in GPU";;
  *) echo "| NVIDIA-SMI 999.99   Driver Version: 999.99   CUDA Version: 13.0 |";;
esac
"""
FAKE_TORCH = """__version__ = "0.0+standin"
class version:
    cuda = "13.0"
class cuda:
    is_available = staticmethod(lambda: True)
    get_device_name = staticmethod(lambda index=0: "Stand-in GPU")
"""
FAKE_TVM = """__version__ = "0.0+standin"
class runtime:
    enabled = staticmethod(lambda kind: True)
class _Device:
    exist = True
cuda = lambda index=0: _Device()
"""


def test_every_command_ends_with_one_merged_results_file(tmp_path: Path) -> None:
    """With stand-ins for every prerequisite (no GPU: the benchmarks then fail at their first real call), each
    command still writes $OUT/gpu_results.json with the environment it read, and the second holds both."""
    bindir = _bin(tmp_path, "g++", "nvcc")
    (bindir / "nvidia-smi").write_text(FAKE_SMI)
    (bindir / "nvidia-smi").chmod(0o755)
    for name, source in (("torch", FAKE_TORCH), ("tvm", FAKE_TVM)):
        (tmp_path / "site" / name).mkdir(parents=True)
        (tmp_path / "site" / name / "__init__.py").write_text(source)
    env = {"PYTHONPATH": str(tmp_path / "site"), "GPU_SESSION_STATE": str(tmp_path / "state")}
    first = _run(tmp_path, bindir, "run-bench", **env)
    assert first.returncode == 1, first.stdout + first.stderr  # the benchmark failed, the command did not hide it
    second = _run(tmp_path, bindir, "run-pipeline", **env)
    assert second.returncode == 1, second.stdout + second.stderr
    results = json.loads((tmp_path / "out" / "gpu_results.json").read_text())
    assert results["environment"]["gpu"] == "Stand-in GPU" and results["environment"]["driver"] == "999.99"
    assert results["environment"]["tvm_cuda_compile_mode"].startswith("nvcc through KernelFleet's")
    assert [(c["mode"], c["rc"]) for c in results["commands"]] == [("run-bench", 1), ("run-pipeline", 1)]
    assert "error" in results["dynamic_bert"] and "error" in results["pipeline"]
    assert (tmp_path / "out" / "run-bench.txt").read_text()  # the benchmark's output is kept beside it


def test_the_gpu_test_modules_collect_without_the_service_stack() -> None:
    """The GPU machine has no pydantic, fastapi, celery or sqlalchemy: a module of run-tests that imports them at
    the top fails collection, and pytest then runs no test at all. The modules are read from the script."""
    modules = sorted(set(re.findall(r"tests/[\w/]+\.py", SCRIPT.read_text())))
    assert modules, "run-tests names no test modules"
    blocked = (
        "import sys, pytest\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'pydantic', 'pydantic_core', 'fastapi', 'celery', 'sqlalchemy', 'httpx'}:\n"
        "            raise ImportError(f'{name} is not installed on the GPU machine')\n"
        "sys.meta_path.insert(0, Block())\n"
        "sys.exit(pytest.main(['-p', 'no:cacheprovider', '-q', '--collect-only', *sys.argv[1:]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocked, *modules],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'clients' / 'python'}"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_table_plan_fits_eight_minutes_and_names_every_stage(tmp_path: Path) -> None:
    done = subprocess.run(
        ["/bin/bash", str(SCRIPT), "table"],
        env={"PATH": os.environ["PATH"], "GPU_SESSION_DRY_RUN": "plan", "OUT": str(tmp_path / "out")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    stages = dict(re.findall(r"^  (\w+)\s+(\d+) s  ", done.stdout, re.MULTILINE))
    stages.pop("total", None)
    assert set(stages) == {"fp32", "fp16", "bf16", "pipeline", "dispatcher"}
    assert sum(int(v) for v in stages.values()) <= 8 * 60
    assert re.search(r"total\s+(\d+) s", done.stdout).group(1) == str(sum(int(v) for v in stages.values()))


def test_the_table_stops_before_any_gpu_minute_without_a_gpu(tmp_path: Path) -> None:
    done = _run(tmp_path, _bin(tmp_path), mode="table")
    assert done.returncode == 3 and "missing prerequisite" in done.stderr
