"""Build a runnable kernel from a stored config (needs TVM: `pip install kernelfleet[tvm]`).

A config carries its own IRModule (TVM's JSON IR, data only) and a MetaSchedule trace; building
replays the trace on the module and compiles it for the config's target. No code from the service
is executed: the trace is a list of schedule primitives TVM interprets.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelfleet.tvm_runtime import aligned_empty, as_aligned, import_tvm

CONFIG_FORMAT_TRACE = "metaschedule-trace"


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]


class Kernel:
    """A compiled kernel: call it with numpy inputs, get the numpy output."""

    def __init__(self, executable: Any, target: Mapping[str, Any], params: Sequence[TensorInfo]) -> None:
        tvm = import_tvm()
        self._tvm = tvm
        self._exe = executable
        self._fn = executable["main"]
        self.target = dict(target)
        self.params = tuple(params)
        self.device = tvm.cpu() if target.get("kind") == "llvm" else tvm.cuda()

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        return self.params[:-1]

    @property
    def output(self) -> TensorInfo:
        return self.params[-1]

    def _check(self, arrays: Sequence[np.ndarray]) -> None:
        if len(arrays) != len(self.inputs):
            raise ValueError(f"kernel takes {len(self.inputs)} inputs, got {len(arrays)}")
        for i, (arr, info) in enumerate(zip(arrays, self.inputs, strict=True)):
            if tuple(arr.shape) != info.shape or str(arr.dtype) != info.dtype:
                raise ValueError(
                    f"input {i}: expected {info.dtype}{list(info.shape)}, got {arr.dtype}{list(arr.shape)}"
                )

    def _tensors(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        self._check(arrays)
        args = [self._tvm.runtime.tensor(np.ascontiguousarray(a), self.device) for a in arrays]
        args.append(self._tvm.runtime.tensor(np.zeros(self.output.shape, self.output.dtype), self.device))
        return args

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        """Run on numpy inputs. CPU kernels read 64-byte aligned inputs in place (others are copied once into
        aligned memory) and write straight into the returned array: no TVM-side allocation or copy-back."""
        if self.device.dlpack_device_type() != 1:  # not the CPU: stage through device tensors
            args = self._tensors(arrays)
            self._fn(*args)
            result: np.ndarray = args[-1].numpy()
            return result

        self._check(arrays)
        from_dlpack = self._tvm.runtime.from_dlpack
        args = [from_dlpack(as_aligned(a)) for a in arrays]
        out = aligned_empty(self.output.shape, self.output.dtype)
        self._fn(*args, from_dlpack(out))
        return out

    def device_args(self, *arrays: np.ndarray) -> list[Any]:
        """Inputs copied to the kernel's device once, plus an output buffer there: what a host holding its
        tensors on a GPU passes to `run_device` on every call."""
        return self._tensors(arrays)

    def run_device(self, *args: Any) -> Any:
        """Run on device tensors (TVM tensors or anything DLPack exports); returns the output argument."""
        self._fn(*args)
        return args[-1]

    def time(self, *arrays: np.ndarray, number: int = 10, repeat: int = 5) -> list[float]:
        """Seconds per call, one mean per repeat (TVM's time_evaluator)."""
        evaluator = self._exe.mod.time_evaluator("main", self.device, number=number, repeat=repeat)
        return [float(r) for r in evaluator(*self._tensors(arrays)).results]


def module_params(func: Any) -> list[TensorInfo]:
    """Dtypes and static shapes of a PrimFunc's parameters, in call order."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [TensorInfo(str(a.dtype), tuple(int(d) for d in a.shape)) for a in ArgInfo.from_prim_func(func)]


def build_kernel(config: Mapping[str, Any]) -> Kernel:
    """Replay a stored MetaSchedule trace on its module and compile it."""
    if config.get("format") != CONFIG_FORMAT_TRACE:
        raise ValueError(f"unsupported config format {config.get('format')!r}")
    tvm = import_tvm()
    import tvm_ffi
    from tvm import s_tir

    mod = tvm.ir.load_json(config["module"])
    if str(tvm_ffi.structural_hash(mod)) != config["module_hash"]:
        raise ValueError("config module does not match its recorded structural hash")
    sch = s_tir.Schedule(mod)
    s_tir.Trace.apply_json_to_schedule(config["trace"], sch)
    target = tvm.target.Target(config["target"])
    pass_config = config.get("pass_config")
    if pass_config:  # the PassContext the tuner measured under (async copies on CUDA)
        with tvm.transform.PassContext(config=dict(pass_config)):
            executable = tvm.compile(sch.mod, target=target)
    else:
        executable = tvm.compile(sch.mod, target=target)
    return Kernel(executable, config["target"], module_params(mod["main"]))


def median_seconds(fn: Any, *args: Any, repeat: int = 7, min_time_s: float = 0.02) -> float:
    """Median per-call time of a Python callable, each repeat running long enough to time reliably."""
    fn(*args)
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn(*args)
        if time.perf_counter() - t0 >= min_time_s or number >= 1 << 16:
            break
        number *= 2
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn(*args)
        samples.append((time.perf_counter() - t0) / number)
    return float(np.median(samples))
