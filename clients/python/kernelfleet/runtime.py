"""How the SDK configures the thread pools of TVM (its uKernels) and OpenBLAS (numpy) in one process.

An inference host alternates tuned kernels with numpy/BLAS calls. Both libraries keep worker threads
that busy-wait after each call: TVM's for TVM_THREAD_POOL_SPIN_COUNT sched_yield()s (300000 by
default, 0.1-0.3 s), OpenBLAS's for 2^OPENBLAS_THREAD_TIMEOUT cycles (2^28 by default, about 0.1 s).
On a machine with few cores the next call of the other library then shares its cores with spinning
threads. Worse, TVM pins each worker thread to one core (TVM_BIND_THREADS=1 by default): when
OpenBLAS's spinning thread sits on that core, the pinned TVM worker cannot move away and waits a full
scheduler slice, so in some fresh processes (whichever core OpenBLAS's thread happened to land on)
every dispatcher call took 10x longer (issue 10 item 4; `bench/contention.py` measures it).

`configure_threads()` sets, unless the user set them already (environment variables win):
- TVM_NUM_THREADS = the cores this process may use (TVM assumes hyper-threading and uses half);
- TVM_BIND_THREADS = 0: TVM's workers are not pinned, so the scheduler can move them off a busy core;
- TVM_THREAD_POOL_SPIN_COUNT = 1000: TVM's workers spin about a millisecond, not 0.1-0.3 s, so they
  are off the cores before a BLAS call needs them (back-to-back TVM calls still find them awake);
- OPENBLAS_THREAD_TIMEOUT = 16: OpenBLAS's threads wait 2^16 cycles (about 25 µs) for the next
  call before sleeping, instead of 2^28 (about 0.1 s). Back-to-back numpy calls still find them
  awake, but they are asleep a few µs into a uKernel call. (The minimum, 4, made every numpy call
  wake its threads, which on a loaded machine cost milliseconds per call.) Set only when no BLAS is
  loaded yet, because OpenBLAS reads it once when it loads. `import kernelfleet` does this before it
  imports numpy, so importing kernelfleet first is enough; `blas_spin_warning()` says when numpy was
  imported first and OpenBLAS spins as it defaults.

TVM reads its variables when its thread pool starts (the first parallel kernel call), so calling
this any time before the first uKernel runs is enough; `import_tvm` calls it.
"""

from __future__ import annotations

import os
import sys

TVM_SPIN_COUNT = 1000
OPENBLAS_TIMEOUT = 16  # log2 of the cycles OpenBLAS's threads wait for work before sleeping: about 25 µs
DISABLE = "KERNELFLEET_NO_THREAD_CONFIG"  # set to 1 to leave both libraries at their defaults


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def thread_settings() -> dict[str, str]:
    """The environment `configure_threads` would set (before user overrides)."""
    settings = {
        "TVM_NUM_THREADS": str(usable_cores()),
        "TVM_BIND_THREADS": "0",
        "TVM_THREAD_POOL_SPIN_COUNT": str(TVM_SPIN_COUNT),
    }
    if not _blas_loaded():
        settings["OPENBLAS_THREAD_TIMEOUT"] = str(OPENBLAS_TIMEOUT)
    return settings


def configure_threads() -> dict[str, str]:
    """Apply `thread_settings` where the environment does not set them; returns what is in effect."""
    if os.environ.get(DISABLE, "") not in ("", "0"):
        # TVM still defaults to half the cores (hyper-threading); kernels are tuned for all of them.
        os.environ.setdefault("TVM_NUM_THREADS", str(usable_cores()))
        return {}
    return {name: os.environ.setdefault(name, value) for name, value in thread_settings().items()}


def _blas_loaded() -> bool:
    # numpy loads its BLAS when numpy itself is imported; scipy and torch bring their own, after numpy
    return "numpy" in sys.modules


def blas_spin_warning() -> str | None:
    """Why alternating with numpy may be slow in this process, or None when OpenBLAS was configured."""
    if os.environ.get(DISABLE, "") not in ("", "0") or "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return None
    return (
        "numpy was imported before kernelfleet, so OpenBLAS's threads busy-wait about 0.1 s after each call "
        "and slow the next uKernel call on a machine with few cores; import kernelfleet first or set "
        f"OPENBLAS_THREAD_TIMEOUT={OPENBLAS_TIMEOUT} before numpy loads"
    )
