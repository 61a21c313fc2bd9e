"""A fake NVIDIA driver: a `libcuda.so.1` whose every entry point answers CUDA_ERROR_NO_DEVICE.

No GPU can exist on CI, but TVM decides how to build CUDA by whether its CUDA runtime plugin loads, and that
plugin needs `libcuda.so.1`. With this stand-in on LD_LIBRARY_PATH the plugin loads, `tvm.cuda(0).exist`
stays False (nothing can run), and builds take the route a GPU worker's do: TVM calls
`tvm_callback_cuda_compile` and embeds the device code it returns (../shared/research/tvm.md §3.1). The
symbols are read from the plugin itself, so a TVM that needs other driver calls gets them too.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CUDA_ERROR_NO_DEVICE = 100


def cuda_plugin() -> Path:
    import tvm

    return Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"


def driver_symbols(plugin: Path) -> list[str]:
    """The driver API (cu*) functions the plugin imports."""
    listing = subprocess.run(
        ["nm", "-D", "--undefined-only", str(plugin)], capture_output=True, text=True, check=True
    ).stdout
    names = {line.split()[-1].split("@")[0] for line in listing.splitlines() if line.split()}
    return sorted(n for n in names if n.startswith("cu") and n[2:3].isupper())


def missing_tools() -> list[str]:
    return [tool for tool in ("gcc", "nm") if shutil.which(tool) is None]


def build_fake_libcuda(directory: Path) -> Path:
    """Compile the fake `libcuda.so.1` into `directory`; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    symbols = driver_symbols(cuda_plugin())
    source = directory / "fake_libcuda.c"
    source.write_text(
        "/* a fake CUDA driver for hosts without a GPU: every call fails with CUDA_ERROR_NO_DEVICE */\n"
        + "".join(f"int {name}(void) {{ return {CUDA_ERROR_NO_DEVICE}; }}\n" for name in symbols)
    )
    library = directory / "libcuda.so.1"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(library), str(source)], check=True
    )
    return library
