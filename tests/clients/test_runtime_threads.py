"""The SDK's thread-pool configuration (kernelfleet.runtime): TVM unpinned with a short spin, OpenBLAS not spinning.

Each case runs in a fresh interpreter, since both libraries read their settings once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelfleet.runtime import TVM_SPIN_COUNT

ROOT = Path(__file__).resolve().parents[2]
THREAD_ENV = (
    "TVM_NUM_THREADS",
    "TVM_BIND_THREADS",
    "TVM_THREAD_POOL_SPIN_COUNT",
    "OPENBLAS_THREAD_TIMEOUT",
    "OMP_NUM_THREADS",
    "KERNELFLEET_NO_THREAD_CONFIG",
    "OMP_WAIT_POLICY",
)

# After a parallel uKernel call, the CPUs each thread of this process may run on (TVM pins its workers
# to one core each unless TVM_BIND_THREADS=0).
PROBE = textwrap.dedent(
    """
    import importlib, json, os, sys
    for name in sys.argv[1].split(","):
        importlib.import_module(name)
    import numpy as np
    from service.tuning.hardware import host_target
    from service.tuning.platforms import tvm_target
    from service.tuning.tuners.ukernel.kernel import build_ukernel
    k = build_ukernel(64, 64, 4, 16, 4, tvm_target(host_target()))
    x = np.ones((64, 64), np.float32)
    np.testing.assert_allclose(k(x, k.pack_weight(np.ones((64, 64), np.float32))), x @ x.T)
    affinity = {}
    for tid in os.listdir("/proc/self/task"):
        for line in open(f"/proc/self/task/{tid}/status"):
            if line.startswith("Cpus_allowed_list"):
                affinity[tid] = line.split(":", 1)[1].strip()
    names = ("TVM_NUM_THREADS", "TVM_BIND_THREADS", "TVM_THREAD_POOL_SPIN_COUNT", "OPENBLAS_THREAD_TIMEOUT",
             "OMP_WAIT_POLICY")
    print(json.dumps({
        "env": {n: os.environ.get(n) for n in names},
        "affinity": affinity,
    }))
    """
)


def probe(import_order: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    clean["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")])
    done = subprocess.run(
        [sys.executable, "-c", PROBE, import_order],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _pinned_threads(result: dict[str, object]) -> list[str]:
    affinity = result["affinity"]
    assert isinstance(affinity, dict)
    full = max(affinity.values(), key=len)
    return [tid for tid, cpus in affinity.items() if cpus != full]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="thread pinning needs at least 2 cores")
@pytest.mark.parametrize("order", ["kernelfleet", "numpy,torch,kernelfleet"])
def test_either_import_order_configures_tvm_alone(order: str) -> None:
    """Issue 33 item 3: the same settings whichever is imported first, and the host's libraries untouched (the
    SDK once set OPENBLAS_THREAD_TIMEOUT when imported before numpy, which slowed the host's own numpy calls)."""
    result = probe(order)
    cores = str(len(os.sched_getaffinity(0)))
    assert result["env"] == {
        "TVM_NUM_THREADS": cores,
        "TVM_BIND_THREADS": "0",
        "TVM_THREAD_POOL_SPIN_COUNT": str(TVM_SPIN_COUNT),
        "OPENBLAS_THREAD_TIMEOUT": None,
        "OMP_WAIT_POLICY": None,
    }
    assert _pinned_threads(result) == [], result["affinity"]  # TVM's worker may move off a busy core


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="thread pinning needs at least 2 cores")
def test_without_the_configuration_tvm_pins_its_workers() -> None:
    """What the configuration changes: TVM's default binds each worker thread to a single core."""
    result = probe("kernelfleet", KERNELFLEET_NO_THREAD_CONFIG="1")
    env = result["env"]
    assert isinstance(env, dict)
    assert env["TVM_BIND_THREADS"] is None
    assert len(_pinned_threads(result)) >= 1, result["affinity"]


def test_the_users_settings_win() -> None:
    result = probe("kernelfleet", TVM_THREAD_POOL_SPIN_COUNT="300000", OPENBLAS_THREAD_TIMEOUT="20")
    env = result["env"]
    assert isinstance(env, dict)
    assert env["TVM_THREAD_POOL_SPIN_COUNT"] == "300000"
    assert env["OPENBLAS_THREAD_TIMEOUT"] == "20"
