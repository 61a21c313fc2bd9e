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
    from service.tuning.builder.cuda import cuda_target
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


@pytest.fixture(scope="module")
def unrouted(outcome: Any) -> Any:
    """The tuned table before cuBLAS routing: every T runs on our uKernels (the routed dispatcher would send
    some T to cuBLAS, and comparing cuBLAS with cuBLAS proves nothing)."""
    from kernelfleet.cuda_ukernel import CudaDispatcher
    from kernelfleet.dispatch import DispatchTable

    table = DispatchTable.from_dict(outcome.validation["tuned_table"])
    assert not any(iv.vendor for iv in table.intervals)
    return CudaDispatcher(table, outcome.kernels, N=N, K=K)


def _check_against_torch(dispatcher: Any, shapes: list[int]) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    w = torch.randn(N, K, device="cuda")
    for t in shapes:
        x = torch.randn(t, K, device="cuda")
        y = dispatcher(x, w)
        ref = torch.nn.functional.linear(x, w)
        err = float((y - ref).abs().max() / ref.abs().max())
        assert err < 1e-4, f"T={t}: relative error {err:.2e}, program {dispatcher.program(t)}"


def test_dispatcher_matches_torch_at_every_t(unrouted: Any, outcome: Any) -> None:
    _check_against_torch(unrouted, SHAPES)  # our uKernels at every T
    _check_against_torch(outcome.dispatcher, SHAPES)  # and as published, cuBLAS where it was faster


def test_launches_on_the_callers_stream_and_under_graph_capture(unrouted: Any) -> None:
    import torch

    x, w = torch.randn(61, K, device="cuda"), torch.randn(N, K, device="cuda")
    out = torch.zeros(61, N, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()  # torch's pool streams do not synchronise with the default stream
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # about a second of work queued ahead of our launch on `side`
        unrouted(x, w, out)
    early = out.cpu()  # on the default stream: our kernels, queued behind the sleep, have not run yet
    side.synchronize()
    assert float(early.abs().max()) == 0.0, "the dispatcher launched on another stream than the caller's"
    ref = torch.nn.functional.linear(x, w)
    assert float((out - ref).abs().max()) < 1e-3
    # captured in a CUDA graph: the launches must be on the capture stream (else capture fails) and replay
    graph, y = torch.cuda.CUDAGraph(), torch.empty(61, N, device="cuda")
    unrouted(x, w, y)  # warm (first-call work off the capture)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        unrouted(x, w, y)
    x.copy_(torch.randn(61, K, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert float((y - torch.nn.functional.linear(x, w)).abs().max()) < 1e-3


def test_empty_batches_and_vendor_calls_answer_in_the_callers_kind(outcome: Any) -> None:
    import numpy as np
    import torch
    import tvm

    w = torch.randn(N, K, device="cuda")
    empty = outcome.dispatcher(torch.empty(0, K, device="cuda"), w)
    assert isinstance(empty, torch.Tensor) and tuple(empty.shape) == (0, N) and empty.is_cuda
    routed = [s for s in SHAPES if outcome.dispatcher.routes_to_vendor(s)] or [1]
    s = routed[0]
    xh, wh = np.random.default_rng(0).standard_normal((s, K), dtype=np.float32), w.cpu().numpy()
    y_np = outcome.dispatcher(xh, wh)
    assert isinstance(y_np, np.ndarray) and y_np.shape == (s, N)
    dev = tvm.cuda(0)
    y_tvm = outcome.dispatcher(tvm.runtime.tensor(xh, dev), tvm.runtime.tensor(wh, dev))
    assert isinstance(y_tvm, tvm.runtime.Tensor)
    np.testing.assert_allclose(y_tvm.numpy(), y_np, rtol=1e-4, atol=1e-3)


def test_both_sides_timed_like_for_like(unrouted: Any, outcome: Any) -> None:
    from service.tuning import cublas
    from service.tuning.tuners.ukernel import gpu_routes

    card = _card()
    for s in (1, 16, 128):
        graph, called = unrouted.time_graph(s, l2_bytes=card.l2_bytes), unrouted.time_called(s, l2_bytes=card.l2_bytes)
        v_graph = cublas.time_linear(s, N, K, l2_bytes=card.l2_bytes)
        v_called = cublas.time_linear_called(s, N, K, l2_bytes=card.l2_bytes)
        assert 0 < graph < called and 0 < v_graph < v_called, (s, graph, called, v_graph, v_called)
    routes = outcome.validation["vendor_routes"]
    assert routes["routed_on"] == "kernel-only + host cost, paired rounds"
    for timing in routes["timed_s"].values():  # every round kept: kernel-only samples of both sides
        assert len(timing["kernel_only_s"][gpu_routes.UKERNEL]) == timing["rounds"] >= 3
    assert all(side["host_s"] >= 0 and len(side["samples_s"]) >= 5 for side in routes["host_cost_s"].values())


def _card() -> Any:
    from service.tuning import gpu

    card = gpu.detect()
    assert card is not None
    return card


def test_a_faulting_and_a_hanging_kernel_cost_only_their_child() -> None:
    import torch

    from service.tuning.isolation import IsolatedRunner, MeasureTimeout
    from tests.tuning.gpu import faulty_kernels

    with IsolatedRunner(timeout_s=20) as runner:
        with pytest.raises(Exception) as fault:
            runner.run(faulty_kernels.run_faulting_kernel)
        assert runner.restarts == 1, fault.value  # whatever the fault raised (error 717 on an H100), its child is gone
        with pytest.raises(MeasureTimeout):
            runner.run(faulty_kernels.run_hanging_kernel)
        assert runner.restarts == 2
        assert runner.run(faulty_kernels.sum_on_gpu) == 4.0  # a fresh child computes again
    assert float(torch.ones(4, device="cuda").sum()) == 4.0  # and this process never saw the fault


def test_split_k_ukernels_are_correct() -> None:
    import torch

    from service.tuning.builder.cuda import cuda_target
    from service.tuning.tuners.pipeline.schedule import GemmTile
    from service.tuning.tuners.ukernel.gpu_build import build_cuda_ukernel

    card = _card()
    tile = GemmTile(bm=8, bn=32, bk=32, tm=1, tn=1, stages=3, split_k=4)
    kernel = build_cuda_ukernel(tile, N, K, cuda_target(card.arch))
    w = torch.randn(N, K, device="cuda")
    for m in (1, 7, 8, 61):
        x, out = torch.randn(m, K, device="cuda"), torch.empty(m, N, device="cuda")
        kernel(x, w, out)
        torch.cuda.synchronize()
        assert float((out - torch.nn.functional.linear(x, w)).abs().max()) < 1e-3, m


@pytest.mark.parametrize("op", ["dense", "batch_matmul", "conv2d"])
def test_vendor_baselines_for_every_pipeline_op(op: str) -> None:
    from service.tuning import cublas

    sizes = {
        "dense": {"M": 64, "N": 768, "K": 768},
        "batch_matmul": {"B": 12, "M": 128, "N": 128, "K": 64},
        "conv2d": {"N": 4, "H": 28, "W": 28, "CI": 128, "CO": 128, "KH": 3, "KW": 3},
    }[op]
    attrs = {"stride": 1, "padding": 1} if op == "conv2d" else {}
    graph = cublas.time_op(op, sizes, attrs, graph=True, l2_bytes=_card().l2_bytes)
    called = cublas.time_op(op, sizes, attrs, graph=False, l2_bytes=_card().l2_bytes)
    assert 0 < graph < called < 1e-2


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
    measured = [r for r in outcome.candidates if "error" not in r]
    assert measured, [r.get("error") for r in outcome.candidates]  # not vacuous: some uKernel ran
    for record in measured:
        timed = [v for v in record["depths_s"].values() if isinstance(v, float)]
        assert len(timed) >= 2, record  # at least two depths timed per uKernel


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
        _check_against_torch(dispatcher, SHAPES)
    finally:
        fleet.stop()


@pytest.mark.skipif(not _has_service_stack(), reason="the sketch tuner needs the service stack (pydantic)")
def test_sketch_search_on_cuda_builds_runs_and_beats_nothing_silently(tmp_path: Path) -> None:
    """MetaSchedule's builder and runner on CUDA through the sketch tuner: candidates built by the fast CUDA
    builder, measured on the GPU, most of them successfully."""
    from service.models import TargetSpec, WorkloadSpec
    from service.tuning.tuners.sketch import SketchTask, SketchTuner

    card = _card()
    workload = WorkloadSpec(op="dense", dims={"N": N, "K": K}, symbolic=["M"])
    target = TargetSpec(kind="cuda", arch=card.arch, details=card.details())
    seen: list[Any] = []

    class Sink:
        def on_candidates(self, candidates: list[Any]) -> None:
            seen.extend(candidates)

        def should_stop(self) -> bool:
            return False

    outcome = SketchTuner().tune(SketchTask(workload, {"M": 16}, target, 16, tmp_path), Sink())
    ok = [c for c in seen if c.status == "ok"]
    assert outcome.best_latency_s is not None and len(ok) >= len(seen) // 2, [c.error for c in seen][:3]


@pytest.mark.skipif(not _has_service_stack(), reason="the platform needs the service stack (pydantic)")
def test_cuda_platform_times_a_kernel_as_a_torch_host_calls_it() -> None:
    """host_call hands our kernel torch CUDA tensors (what a torch host holds) and time_call times the call as a
    host makes it; the vendor is timed the same way, and kernel-only below that."""
    import numpy as np
    import tvm

    from kernelfleet.tvm_kernel import TVMKernel, module_params
    from service.models import WorkloadSpec
    from service.tuning.compute import prim_func, random_inputs, reference
    from service.tuning.platforms import platform_for, tvm_target

    platform = platform_for("cuda")
    target = platform.detect()
    assert target is not None
    workload = WorkloadSpec(op="dense", dims={"N": N, "K": K}, symbolic=["M"])
    mod = prim_func(workload, {"M": 16})
    sch = tvm.s_tir.Schedule(mod)
    block = sch.get_sblock("Y")
    i, j, _ = sch.get_loops(block)
    sch.bind(sch.fuse(i, j), "blockIdx.x")  # a trivially bound kernel: correct, not fast
    ex = tvm.compile(sch.mod, target=tvm.target.Target(tvm_target(target)))
    kernel = TVMKernel(ex, tvm_target(target), module_params(mod["main"]))
    inputs = random_inputs(workload, {"M": 16})
    call, args = platform.host_call(kernel, inputs)
    assert type(args[0]).__module__.startswith("torch")
    out = call(*args)
    assert platform.check(out, reference(workload)(*inputs), 1e-3) is None
    assert 0 < platform.time_call(call, *args) < 1e-2
    called = platform.vendor(workload, {"M": 16})
    kernel_only = platform.vendor(workload, {"M": 16}, kernel_only=True)
    assert 0 < kernel_only.seconds < called.seconds and "CUDA graph" in kernel_only.label
    assert np.isfinite(called.seconds)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_job_serves_its_dtype_correctly_at_every_t(
    dtype: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A float16 / bfloat16 ukernel run (GEMV family below T = 16, tensor-core tiles from it, K splits where N
    leaves SMs idle; sm_80+ only, as admission says): torch tensors of that dtype in, Y of that dtype out, within
    the dtype's rounding of F.linear (fp32 sums) at every T, before and after routing."""
    import torch

    from kernelfleet.cuda_ukernel import CudaDispatcher
    from kernelfleet.dispatch import DispatchTable
    from service.tuning import gpu
    from service.tuning.builder.cuda import cuda_target, supports_async_copy
    from service.tuning.tuners.ukernel.gpu_tuner import DenseRange, GPUUKernelTuner
    from service.tuning.tuners.ukernel.tuner import QuietRangeSink

    card = gpu.detect()
    assert card is not None
    if not supports_async_copy(card.arch):
        pytest.skip(f"{dtype} uKernels need sm_80+, this GPU is {card.arch}")
    n, k = 768, 3072  # BERT's ffn_down: the layer whose N leaves SMs idle (split-K tiles)
    job = DenseRange(
        n, k, s_max=128, validate=(1, 64), target=cuda_target(card.arch), hardware=card.hardware_model(),
        work_dir=tmp_path_factory.mktemp(f"gpu-{dtype}"), max_ukernels=4, dtype=dtype,
    )  # fmt: skip
    outcome = GPUUKernelTuner().tune_dense(job, QuietRangeSink())
    unrouted = CudaDispatcher(DispatchTable.from_dict(outcome.validation["tuned_table"]), outcome.kernels, N=n, K=k)
    tdtype = getattr(torch, dtype)
    w = torch.randn(n, k, device="cuda", dtype=tdtype)
    bound = {"float16": 2e-3, "bfloat16": 1.6e-2}[dtype]  # a few units of the dtype's rounding, relative to max|Y|
    for dispatcher in (unrouted, outcome.dispatcher):
        assert dispatcher.dtype == dtype
        for t in range(1, 129):
            x = torch.randn(t, k, device="cuda", dtype=tdtype)
            y = dispatcher(x, w)
            ref = torch.nn.functional.linear(x.float(), w.float())
            assert y.dtype == tdtype and y.shape == (t, n)
            err = float((y.float() - ref).abs().max() / ref.abs().max())
            assert err < bound, f"T={t}: relative error {err:.2e}, program {dispatcher.program(t)}"
