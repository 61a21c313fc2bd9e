"""Fault injection for measurement: an evaluator that crashes or hangs some candidates' measuring process.

MetaSchedule's runner imports this by name inside its measuring process, so it lives in an importable
module. Which call does what is decided by a counter file named in KF_TEST_FAULTS.
"""

from __future__ import annotations

import os
import time
from typing import Any


def crash_or_hang_evaluator(rt_mod: Any, device: Any, evaluator_config: Any, repeated_args: Any) -> list[float]:
    from tvm.s_tir.meta_schedule.runner.local_runner import default_run_evaluator

    counter = os.environ["KF_TEST_FAULTS"]
    with open(counter, "a+") as fh:
        fh.write("x")
        fh.seek(0)
        n = len(fh.read())
    if n % 3 == 1:
        os._exit(13)  # the measuring process dies, as with a segfaulting kernel
    if n % 3 == 2:
        time.sleep(3600)  # the kernel never returns
    result: list[float] = default_run_evaluator(rt_mod, device, evaluator_config, repeated_args)
    return result
