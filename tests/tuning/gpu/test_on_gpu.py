"""Kernels run on a real NVIDIA GPU: the dispatcher against torch, device tensors in and out, the full job.

Every test here skips, saying why, on a host without a GPU (CI, this repository's build machine). On a
GPU machine run them with `bash bench/gpu_session.sh run`. Module-level imports stay free of pydantic:
the GPU machine has none (the full-job test needs the service stack and skips without it).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.cuda_ukernel import NoCudaDevice, require_cuda


def _gpu_reason() -> str | None:
    try:
        require_cuda()
    except NoCudaDevice as exc:
        return f"needs an NVIDIA GPU: {exc}"
    try:
        import torch
    except ImportError:
        return "needs torch with CUDA for the reference and device tensors (not installed)"
    if not torch.cuda.is_available():
        return "needs torch with CUDA: torch sees no GPU"
    return None


REASON = _gpu_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
N, K = 768, 768  # BERT-base attention output: small enough to tune in a test
SHAPES = [*range(1, 129), 131, 257, 512]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from service.tuning import gpu
    from service.tuning.tuners.pipeline.schedule import cuda_target
    from service.tuning.tuners.ukernel.gpu_tuner import DenseRange, GPUUKernelTuner
    from service.tuning.tuners.ukernel.tuner import QuietRangeSink

    card = gpu.detect()
    assert card is not None, "TVM sees a GPU but nvidia-smi does not"
    job = DenseRange(
        N,
        K,
        s_max=512,
        validate=(1, 16, 128),
        target=cuda_target(card.arch),
        hardware=card.hardware_model(),
        work_dir=tmp_path_factory.mktemp("gpu-ukernels"),
        max_ukernels=4,
    )
    return GPUUKernelTuner().tune_dense(job, QuietRangeSink())


def test_dispatcher_matches_torch_at_every_t(outcome: Any) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    w = torch.randn(N, K, device="cuda")
    for t in SHAPES:
        x = torch.randn(t, K, device="cuda")
        y = outcome.dispatcher(x, w)
        ref = torch.nn.functional.linear(x, w)
        err = float((y - ref).abs().max() / ref.abs().max())
        assert err < 1e-4, f"T={t}: relative error {err:.2e}, program {outcome.dispatcher.program(t)}"


def test_device_tensors_in_and_out(outcome: Any) -> None:
    import numpy as np
    import torch
    import tvm

    x = torch.randn(61, K, device="cuda")
    w = torch.randn(N, K, device="cuda")
    out = torch.empty(61, N, device="cuda")
    y = outcome.dispatcher(x, w, out)
    assert y is out and y.is_cuda  # written in place on the device: no host round trip
    fresh = outcome.dispatcher(x, w)
    assert isinstance(fresh, torch.Tensor) and fresh.device == x.device
    dev = tvm.cuda(0)
    tx = tvm.runtime.tensor(x.cpu().numpy(), dev)
    tw = tvm.runtime.tensor(w.cpu().numpy(), dev)
    ty = outcome.dispatcher(tx, tw)  # TVM tensors (DLPack) in, a TVM device tensor out
    assert ty.device.dlpack_device_type() == 2
    np.testing.assert_allclose(ty.numpy(), y.cpu().numpy(), rtol=1e-5, atol=1e-4)


def test_artifacts_are_content_addressed_and_reload(outcome: Any) -> None:
    from kernelfleet.cuda_ukernel import load_cuda_ukernel, sha256_bytes

    for uid, artifact in outcome.artifacts.items():
        path = Path(artifact.path)
        assert path.name == f"{artifact.sha256}.so" and sha256_bytes(path.read_bytes()) == artifact.sha256
        assert artifact.spec.fatbin_sha256  # nvcc's device code, recorded
        again = load_cuda_ukernel(path, artifact.spec, artifact.sha256)
        assert again.time(16) > 0, uid


def test_pipeline_depth_was_searched(outcome: Any) -> None:
    for record in outcome.candidates:
        if "error" not in record:
            assert len(record["depths_s"]) >= 2, record  # at least two depths timed per uKernel


def _has_service_stack() -> bool:
    try:
        return importlib.util.find_spec("celery") is not None and importlib.util.find_spec("pydantic") is not None
    except ImportError:
        return False


@pytest.mark.skipif(not _has_service_stack(), reason="the full job needs the service stack (celery, pydantic)")
def test_full_ukernel_job_on_a_gpu_worker(tmp_path: Path, pg_url: str, redis_url: str) -> None:
    from kernelfleet.cuda_ukernel import CudaDispatcher
    from tests.helpers import Fleet, wait_for

    fleet = Fleet(tmp_path / "fleet", {"KERNELFLEET_DATABASE_URL": pg_url, "KERNELFLEET_BROKER_URL": redis_url})
    try:
        fleet.start_api()
        fleet.start_worker("gpu1")
        client = fleet.client()
        hw = wait_for(lambda: client.workers(), 90, "the GPU worker to announce itself")[0]["target"]
        assert hw["kind"] == "cuda"
        dense = {"op": "dense", "dims": {"N": N, "K": K}, "symbolic": ["M"]}
        dist = {"kind": "uniform", "dim": "M", "low": 1, "high": 128}
        target = {"kind": "cuda", "arch": hw["arch"]}
        job = client.submit(dense, target, dist, kind="ukernel", budget={"trials": 4, "max_shapes": 2})
        done = client.wait(job.id, timeout_s=900, poll_s=1.0)
        assert done.state == "succeeded", done
        assert done.target_fingerprint is not None
        dispatcher = client.dispatcher(done.workload_hash, done.target_fingerprint)
        assert isinstance(dispatcher, CudaDispatcher)
        test_dispatcher_matches_torch_at_every_t(type("O", (), {"dispatcher": dispatcher})())
    finally:
        fleet.stop()
