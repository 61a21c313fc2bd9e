"""How the SDK configures the thread pool of TVM (its uKernels) in a process that also runs numpy and PyTorch.

An inference host alternates tuned kernels with numpy/BLAS calls. Both libraries keep worker threads
that busy-wait after each call: TVM's for TVM_THREAD_POOL_SPIN_COUNT sched_yield()s (300000 by
default, 0.1-0.3 s), OpenBLAS's for 2^OPENBLAS_THREAD_TIMEOUT cycles (2^28 by default, about 0.1 s).
On a machine with few cores the next call of the other library then shares its cores with spinning
threads. Worse, TVM pins each worker thread to one core (TVM_BIND_THREADS=1 by default): when
OpenBLAS's spinning thread sits on that core, the pinned TVM worker cannot move away and waits a full
scheduler slice, so in some fresh processes (whichever core OpenBLAS's thread happened to land on)
every dispatcher call took 10x longer (issue 10 item 4; `bench/contention.py` measures it).

`configure_threads()` sets TVM's own settings, unless the user set them already (environment variables win):
- TVM_NUM_THREADS = the cores this process may use (TVM assumes hyper-threading and uses half);
- TVM_BIND_THREADS = 0: TVM's workers are not pinned, so the scheduler can move them off a busy core;
- TVM_THREAD_POOL_SPIN_COUNT = 1000: TVM's workers spin about a millisecond, not 0.1-0.3 s, so they
  are off the cores before a BLAS call needs them (back-to-back TVM calls still find them awake).

It leaves numpy's OpenBLAS and PyTorch's OpenMP as the host configured them (issue 33 item 3: setting
OPENBLAS_THREAD_TIMEOUT at import, as the SDK once did, made the host's own numpy calls wake sleeping threads on
every call: 2.7-15.7 ms medians where 0.15-0.64 ms were normal). PyTorch's threads are managed where they meet
the uKernels, inside an accelerated forward (`kernelfleet.torch_forward.ForwardScope`), and put back after it.

TVM reads its variables when its thread pool starts (the first parallel kernel call), so calling
this any time before the first uKernel runs is enough; `import_tvm` calls it.
"""

from __future__ import annotations

import os

TVM_SPIN_COUNT = 1000
DISABLE = "KERNELFLEET_NO_THREAD_CONFIG"  # set to 1 to leave both libraries at their defaults


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def thread_settings() -> dict[str, str]:
    """The environment `configure_threads` would set (before user overrides): TVM's variables only."""
    return {
        "TVM_NUM_THREADS": str(usable_cores()),
        "TVM_BIND_THREADS": "0",
        "TVM_THREAD_POOL_SPIN_COUNT": str(TVM_SPIN_COUNT),
    }


def configure_threads() -> dict[str, str]:
    """Apply `thread_settings` where the environment does not set them; returns what is in effect."""
    if os.environ.get(DISABLE, "") not in ("", "0"):
        # TVM still defaults to half the cores (hyper-threading); kernels are tuned for all of them.
        os.environ.setdefault("TVM_NUM_THREADS", str(usable_cores()))
        return {}
    return {name: os.environ.setdefault(name, value) for name, value in thread_settings().items()}
