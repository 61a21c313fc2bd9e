"""bench/pipeline_gpu.py runs on GPU hosts that have TVM, torch and numpy but not the service's dependencies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# Block the service-only packages the way a GPU measurement host lacks them, then load the benchmark.
BLOCKED = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"pydantic", "fastapi", "celery", "sqlalchemy", "kombu", "xgboost"}:
            raise ImportError(f"{name} is not installed on a GPU host")
sys.meta_path.insert(0, _Block())
sys.argv = ["pipeline_gpu.py", *sys.argv[1:]]
import runpy
runpy.run_path("bench/pipeline_gpu.py", run_name="__main__")
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKED, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_benchmark_imports_without_the_service_dependencies() -> None:
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    assert "bert_qk" in done.stdout and "rn50_fc" in done.stdout


def test_without_a_gpu_it_says_so_and_measures_nothing(tmp_path: Path) -> None:
    done = _run("--ops", "rn50_fc", "--trials", "2", "--out", str(tmp_path / "out.json"))
    assert done.returncode != 0 and "no CUDA GPU" in done.stderr + done.stdout
    assert not (tmp_path / "out.json").exists()
