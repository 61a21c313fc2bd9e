"""The CUDA compile route a GPU worker takes, run on a host without a GPU.

A GPU worker never calls nvcc itself: TVM's build calls `tvm_callback_cuda_compile` because its CUDA runtime
is enabled there. A fake driver (fake_driver.py) enables it here, so these builds go exactly that way, in an
environment installed as the GPU image installs it (the pinned `cuda-build` wheels, cuda-bindings included,
which is what makes TVM's own callback pick NVRTC). Also: the image's nvcc wrapper, the version check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.tuning import cuda_toolchain
from tests.tuning.gpu.fake_driver import build_fake_libcuda, missing_tools

ROOT = Path(__file__).resolve().parents[3]
FATBIN_MAGIC = "50ed55ba"  # 0xBA55ED50 little-endian: nvcc's fatbin; NVRTC's default output is a cubin (ELF)
KERNEL = "#include <cuda_runtime.h>\n__global__ void k(float* a) { a[threadIdx.x] = 1.0f; }\n"

needs_toolchain = pytest.mark.skipif(
    bool(missing_tools()) or cuda_toolchain.nvcc_path() is None,
    reason=f"needs gcc, nm and nvcc (missing: {missing_tools() or ['nvcc']}; pip install -e .[dev] brings nvcc)",
)


@needs_toolchain
def test_gpu_builds_go_through_tvms_callback_to_nvcc_and_the_hash_is_of_what_ships(tmp_path: Path) -> None:
    fake = build_fake_libcuda(tmp_path / "driver")
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(fake.parent),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'clients' / 'python'}",
    }
    env.pop("TVM_CUDA_COMPILE_MODE", None)  # the worker chooses the route itself
    done = subprocess.run(
        [sys.executable, "-m", "tests.tuning.gpu.compile_route_child", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["cuda_enabled"] and not report["gpu_exists"]  # the GPU route, with nothing to run on
    assert len(report["ukernels"]) == 3
    for built in report["ukernels"]:
        # one fatbin from nvcc per uKernel, its hash recorded, and those very bytes inside the shipped library
        assert built["blobs"] == 1 and built["magic"] == FATBIN_MAGIC, built
        assert built["recorded_sha256"] == built["blob_sha256"] and built["blob_in_library"], built
    assert report["metaschedule"] == {"blobs": 1, "magic": FATBIN_MAGIC}


@pytest.mark.skipif(cuda_toolchain.wheel_nvcc() is None, reason="no nvcc wheel here (pip install -e .[dev])")
def test_the_images_nvcc_wrapper_compiles_where_a_symlink_does_not(tmp_path: Path) -> None:
    source = tmp_path / "k.cu"
    source.write_text(KERNEL)
    real = cuda_toolchain.wheel_nvcc()
    assert real is not None
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "nvcc").symlink_to(real)  # what the image used to do
    cuda_toolchain.install_nvcc_wrapper(tmp_path / "wrap" / "nvcc", real)

    def compile_with(nvcc: Path) -> subprocess.CompletedProcess[str]:
        argv = [str(nvcc), "--cubin", "-arch", "sm_90", "-o", str(tmp_path / "k.cubin"), str(source)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)

    linked = compile_with(tmp_path / "link" / "nvcc")
    assert linked.returncode != 0 and "cuda_runtime.h" in linked.stdout + linked.stderr
    wrapped = compile_with(tmp_path / "wrap" / "nvcc")
    assert wrapped.returncode == 0, wrapped.stderr
    assert (tmp_path / "k.cubin").stat().st_size > 0


def test_the_image_installs_the_wrapper_not_a_symlink() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "python -m service.tuning.cuda_toolchain install-nvcc /usr/local/bin/nvcc" in dockerfile
    assert "ln -s" not in dockerfile


def test_configure_puts_the_pinned_nvcc_first_and_the_route_on_nvcc(tmp_path: Path) -> None:
    env = {"PATH": f"/usr/local/bin{os.pathsep}/usr/bin"}
    cuda_toolchain.configure_cuda_compile(env)
    assert env["TVM_CUDA_COMPILE_MODE"] == "nvcc"
    wheel = cuda_toolchain.wheel_nvcc()
    if wheel is not None:
        assert env["PATH"].split(os.pathsep)[0] == str(wheel.parent)
        cuda_toolchain.configure_cuda_compile(env)  # idempotent
        assert env["PATH"].split(os.pathsep).count(str(wheel.parent)) == 1
    import tvm_ffi

    callback = tvm_ffi.get_global_func(cuda_toolchain.CALLBACK)
    assert callback is not None  # ours now (TVM's was registered first and replaced)


def test_versions_that_do_not_fit_are_named() -> None:
    assert cuda_toolchain.version_problems("13.0.88", "13.0", "13.0") == []
    assert cuda_toolchain.version_problems("13.0.88", "", "") == []
    mixed = cuda_toolchain.version_problems("13.5.37", "13.2", "13.0")
    assert len(mixed) == 2 and "pin nvidia-cuda-nvcc to 13.2.*" in mixed[0] and "newer than the driver" in mixed[1]


def test_the_gpu_extra_pins_one_cuda_minor() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [d for d in extras["cuda-build"] if d.startswith("nvidia-")]
    assert {d.split("==")[0] for d in pins} >= {"nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm"}
    assert all(d.endswith("==13.0.*") for d in pins), pins  # torch 2.13.0's CUDA (cuda-toolkit==13.0.3)
    assert "torch==2.13.0" in extras["gpu"] and "kernelfleet-service[cuda-build,sass]" in extras["gpu"]
    # the SASS readers inspect cubins only; they are not part of the toolchain a kernel is built with
    assert {d.split("==")[0] for d in extras["sass"]} == {"nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"}
