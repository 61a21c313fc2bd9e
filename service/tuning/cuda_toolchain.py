"""How a GPU worker compiles CUDA: nvcc from the pinned PyPI wheels, through TVM's own compile callback.

Three things break a GPU worker installed from PyPI wheels before any kernel runs, each fixed here:
  - nvcc finds its headers relative to its own executable: a symlink to the wheel's nvcc on PATH fails
    with "cuda_runtime.h: No such file or directory". `install_nvcc_wrapper` writes a script that `exec`s
    the real binary (the image runs it), and `configure_cuda_compile` puts the wheel's real `bin/` first
    on PATH for this process and its children.
  - TVM compiles device code through the global `tvm_callback_cuda_compile`, which defaults to NVRTC
    whenever `cuda-bindings` is importable (torch pulls it in); NVRTC then looks for CCCL headers where
    the wheels do not put them ("cannot open source file cuda/std/cstdint"). We register our own callback
    that always runs nvcc (the toolkit the fingerprint names) and keeps the bytes it returns, so a
    uKernel's recorded hash is the hash of the device code its library embeds (`captured_device_code`).
  - TVM's CUDA runtime plugin needs `libcudart.so.13`, which the wheel keeps outside the loader's path;
    `kernelfleet.tvm_runtime.preload_cuda_runtime` loads it before TVM (the worker does this first thing).

Stdlib only at import: GPU measurement hosts have no pydantic.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path

from kernelfleet.tvm_runtime import wheel_cuda_roots

CALLBACK = "tvm_callback_cuda_compile"
_captured: list[bytes] | None = None
_registered = False


def wheel_nvcc() -> Path | None:
    """The real nvcc of the CUDA wheels installed beside this Python (nvidia-cuda-nvcc), if any."""
    for root in wheel_cuda_roots():
        candidate = root / "bin" / "nvcc"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def nvcc_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The nvcc a build uses: the pinned wheel's, else the first on PATH."""
    found = wheel_nvcc()
    if found is not None:
        return found
    on_path = shutil.which("nvcc", path=(environ or os.environ).get("PATH"))
    return Path(on_path) if on_path else None


def configure_cuda_compile(environ: MutableMapping[str, str] | None = None) -> Path | None:
    """Make every CUDA build in this process (and the processes it starts) compile with nvcc: the wheel's
    real `bin/` goes first on PATH, and TVM's compile callback is ours (nvcc, device code captured). Safe to
    call often; returns the nvcc in use (None when there is none: builds then stay CUDA source only, which
    is all a host without a GPU runtime makes anyway)."""
    env = os.environ if environ is None else environ
    nvcc = wheel_nvcc()
    if nvcc is not None:
        bin_dir = str(nvcc.parent)
        parts = env.get("PATH", "").split(os.pathsep)
        if parts[:1] != [bin_dir]:
            env["PATH"] = os.pathsep.join([bin_dir, *(p for p in parts if p and p != bin_dir)])
    # what TVM's own callback would read; ours ignores it, but child processes that never call us stay on nvcc
    env.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    _register_callback()
    return nvcc_path(env)


def compile_device_code(code: str, target: object = None) -> bytes:
    """TVM's `tvm_callback_cuda_compile`, as registered by `configure_cuda_compile`: nvcc to a fatbin for the
    arch of the target being built (TVM passes it; else the current target scope), recorded for
    `captured_device_code`."""
    from tvm.support import nvcc

    arch = getattr(getattr(target, "attrs", None), "get", lambda _k, _d=None: None)("arch")
    data = bytes(nvcc.compile_cuda(code, target_format="fatbin", arch=str(arch) if arch else None, compiler="nvcc"))
    if _captured is not None:
        _captured.append(data)
    return data


def _register_callback() -> None:
    global _registered
    if _registered:
        return
    import tvm.support.nvcc  # noqa: F401 - registers TVM's callback first, so ours replaces it and not the reverse
    import tvm_ffi

    tvm_ffi.register_global_func(CALLBACK, compile_device_code, override=True)
    _registered = True


@contextlib.contextmanager
def captured_device_code() -> Iterator[list[bytes]]:
    """Collects the device code nvcc returns to TVM while the block runs (one entry per compiled module;
    empty on a host whose TVM has no CUDA runtime, where builds keep CUDA source only)."""
    global _captured
    outer, mine = _captured, list[bytes]()
    _captured = mine
    try:
        yield mine
    finally:
        _captured = outer
        if outer is not None:
            outer.extend(mine)  # an enclosing capture sees what nested ones saw


def device_code_sha256(blobs: list[bytes]) -> str:
    """The sha256 of what ships: the single device binary TVM embedded, or '' when there is none."""
    if len(blobs) > 1:
        raise ValueError(f"expected one device binary per uKernel build, got {len(blobs)}")
    return hashlib.sha256(blobs[0]).hexdigest() if blobs else ""


def version_problems(nvcc: str, torch_cuda: str, driver_cuda: str) -> list[str]:
    """Why this host's CUDA versions do not fit together (empty when they do): nvcc must be the CUDA minor
    torch was built with (one toolkit per worker), and no newer than what the driver supports (a newer
    toolkit's device code can fail to load). Versions as '13.0.88', '13.0', '13.0'; '' means unknown."""
    problems = []
    tool, runtime, driver = (_major_minor(v) for v in (nvcc, torch_cuda, driver_cuda))
    if tool and runtime and tool != runtime:
        pin = f"{runtime[0]}.{runtime[1]}.*"
        problems.append(f"nvcc {nvcc} is not torch's CUDA {torch_cuda}: pin nvidia-cuda-nvcc to {pin}")
    if tool and driver and tool > driver:
        problems.append(f"nvcc {nvcc} is newer than the driver's CUDA {driver_cuda}: kernels may not load")
    return problems


def _major_minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def install_nvcc_wrapper(dest: Path, nvcc: Path | None = None) -> Path:
    """Write an executable `dest` that execs the wheel's real nvcc (a symlink would make nvcc look for its
    headers beside the link). Returns the nvcc it points to."""
    real = nvcc or wheel_nvcc()
    if real is None:
        raise FileNotFoundError("no nvcc in the installed CUDA wheels (pip install nvidia-cuda-nvcc)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.unlink(missing_ok=True)
    dest.write_text(f'#!/bin/sh\nexec "{real.resolve()}" "$@"\n')
    dest.chmod(dest.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return real


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.tuning.cuda_toolchain", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    wrap = sub.add_parser("install-nvcc", help="write an exec wrapper for the wheel's nvcc (the GPU image runs this)")
    wrap.add_argument("dest", type=Path)
    sub.add_parser("show", help="print the nvcc a build would use")
    args = parser.parse_args(argv)
    if args.command == "install-nvcc":
        real = install_nvcc_wrapper(args.dest)
        print(f"{args.dest} -> {real}")
    else:
        print(nvcc_path() or "no nvcc")
    return 0


if __name__ == "__main__":
    sys.exit(main())
