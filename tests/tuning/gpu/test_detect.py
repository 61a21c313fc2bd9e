"""GPU detection, the cuda fingerprint and queue routing, on fixed GPU descriptions (no GPU needed)."""

from __future__ import annotations

import pytest

from service.launch import worker_queues
from service.models import TargetSpec, Toolchain
from service.settings import Settings
from service.tuning import gpu, hardware
from service.tuning.platforms import host_platform, platform_for, queue_for
from service.tuning.platforms.cuda import gpu_mismatch
from tests.tuning.gpu.descriptions import ARCHES, card

TOOLCHAIN = Toolchain(tvm="0.27.0.post1")


@pytest.mark.parametrize(
    ("arch", "name", "sms", "mib", "cuda", "driver"),
    [
        ("sm_90", "NVIDIA H100 80GB HBM3", 132, 81559, "13.0", "580.159.04"),
        ("sm_80", "NVIDIA A100-SXM4-40GB", 108, 40960, "12.2", "535.104.05"),
        ("sm_75", "Tesla T4", 40, 15360, "11.4", "470.82.01"),
    ],
)
def test_parse_fixed_descriptions(arch: str, name: str, sms: int, mib: int, cuda: str, driver: str) -> None:
    desc = card(arch)
    assert (desc.arch, desc.name, desc.sm_count, desc.memory_mib) == (arch, name, sms, mib)
    assert (desc.cuda, desc.driver, desc.nvcc) == (cuda, driver, "13.0.88") and desc.uuid.startswith("GPU-")
    assert desc.regs_per_block == 65536 and desc.smem_per_block == 49152 and desc.warp_size == 32
    # without TVM's device attributes the arch table fills SM count and L2, never 0
    bare = card(arch, with_attrs=False)
    assert bare.sm_count > 0 and bare.l2_bytes > 0 and bare.smem_per_sm == desc.smem_per_sm


def test_parsers_reject_garbage() -> None:
    assert gpu.parse_compute_cap("10.0") == "sm_100"
    with pytest.raises(ValueError, match="compute capability"):
        gpu.parse_compute_cap("nine")
    with pytest.raises(ValueError, match="expected 5 fields"):
        gpu.parse_smi_query("Tesla T4, 7.5\n")
    assert gpu.parse_smi_cuda_version("no banner") == ""
    assert gpu.parse_nvcc_version("Cuda compilation tools, release 13.0, V13.0.88") == "13.0.88"


def test_fingerprint_covers_arch_device_and_versions() -> None:
    h100 = card("sm_90").to_target(TOOLCHAIN)
    assert queue_for(h100) == "gpu.sm_90" and h100.num_cores == 132
    fps = {card(a).to_target(TOOLCHAIN).fingerprint for a in ARCHES}
    assert len(fps) == 3
    base = card("sm_90")
    for change in (
        {"name": "NVIDIA H100 PCIe", "sm_count": 114},
        {"memory_mib": 95830},
        {"smem_per_block": 101376},
        {"regs_per_block": 32768},
        {"driver": "590.48.01"},
        {"cuda": "13.1"},
        {"nvcc": "13.1.0"},
    ):
        other = gpu.GPUDescription(**{**base.__dict__, **change}).to_target(TOOLCHAIN)
        assert other.fingerprint != h100.fingerprint, change
    assert base.to_target(Toolchain(tvm="0.28.0")).fingerprint != h100.fingerprint
    # a patch release of the same driver branch, or another H100 of the same part, keeps every record
    for same in ({"driver": "580.195.03"}, {"uuid": "GPU-00000000-1111-2222-3333-444444444444"}):
        other = gpu.GPUDescription(**{**base.__dict__, **same}).to_target(TOOLCHAIN)
        assert other.fingerprint == h100.fingerprint, same
        assert other.metadata != h100.metadata  # still recorded, outside the fingerprint
    assert h100.details["driver"] == "580" and h100.metadata["driver_version"] == "580.159.04"


ROWS = gpu.parse_smi_query(
    "GPU-aaaa1111-0000-0000-0000-000000000000, NVIDIA A100-SXM4-40GB, 8.0, 40960, 535.104.05\n"
    "GPU-bbbb2222-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 9.0, 81559, 580.159.04\n"
)


@pytest.mark.parametrize(
    ("visible", "name"),
    [
        (None, "NVIDIA A100-SXM4-40GB"),  # unset: CUDA's device 0 is nvidia-smi's first GPU
        ("1", "NVIDIA H100 80GB HBM3"),  # CUDA's device 0 is then nvidia-smi's row 1, not row 0
        ("1,0", "NVIDIA H100 80GB HBM3"),
        ("GPU-bbbb2222", "NVIDIA H100 80GB HBM3"),  # a UUID prefix
        ("GPU-aaaa1111-0000-0000-0000-000000000000,1", "NVIDIA A100-SXM4-40GB"),
        ("", None),
        ("-1", None),
        ("7", None),
        ("GPU-cccc", None),
    ],
)
def test_the_described_gpu_is_the_one_cuda_computes_on(visible: str | None, name: str | None) -> None:
    row = gpu.visible_row(ROWS, visible)
    assert (row["name"] if row else None) == name


def test_detect_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "visible_gpus", lambda: ROWS)
    monkeypatch.setattr(gpu, "_run", lambda argv: "CUDA Version: 13.0")
    monkeypatch.setattr(gpu, "tvm_device_attrs", lambda index=0: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpu.detect.cache_clear()
    try:
        found = gpu.detect()
        assert found is not None and found.arch == "sm_90" and found.uuid.startswith("GPU-bbbb2222")
        with pytest.raises(ValueError, match="MIG"):
            gpu.visible_row(ROWS, "MIG-1234")
    finally:
        gpu.detect.cache_clear()


def test_sm_90a_is_an_sm_90_part() -> None:
    from service.tuning.gpu_parts import base_arch
    from service.tuning.hardware_model import HardwareModel

    assert base_arch("sm_90a") == "sm_90" and base_arch("sm_100a") == "sm_100" and base_arch("sm_90") == "sm_90"
    assert HardwareModel.for_gpu("sm_90a") == HardwareModel.for_gpu("sm_90")
    wgmma = TargetSpec(kind="cuda", arch="sm_90a")
    assert queue_for(wgmma) == "gpu.sm_90"  # served by the sm_90 workers, not a queue nobody consumes
    assert gpu_mismatch(wgmma, card("sm_90")) is None


def test_a_gpu_host_runs_one_worker_per_gpu(gpu_host: gpu.GPUDescription, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.launch import worker_devices

    monkeypatch.setattr(gpu, "visible_gpus", lambda: ROWS)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    envs = worker_devices(Settings(worker_queues=None), workers=4)
    assert envs == [{"CUDA_VISIBLE_DEVICES": r["uuid"]} for r in ROWS]  # 2 GPUs: 2 workers, not 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert worker_devices(Settings(worker_queues=None), workers=1) == [{"CUDA_VISIBLE_DEVICES": ROWS[1]["uuid"]}]


def test_mismatch_on_gpu_hosts() -> None:
    h100 = card("sm_90")
    job = TargetSpec(kind="cuda", arch="sm_90")
    assert gpu_mismatch(job, h100) is None
    assert "no CUDA GPU" in str(gpu_mismatch(job, None))
    assert "sm_80" in str(gpu_mismatch(TargetSpec(kind="cuda", arch="sm_80"), h100))
    pinned = TargetSpec(kind="cuda", arch="sm_90", details={"sm_count": 114})
    assert "sm_count" in str(gpu_mismatch(pinned, h100))


@pytest.fixture
def gpu_host(monkeypatch: pytest.MonkeyPatch) -> gpu.GPUDescription:
    """This host, described as an H100 host (the detection functions are what a real one runs)."""
    h100 = card("sm_90")
    monkeypatch.setattr(gpu, "detect", lambda: h100)
    monkeypatch.delenv("KERNELFLEET_WORKER_PLATFORM", raising=False)
    return h100


def test_gpu_host_serves_only_its_gpu_queue(gpu_host: gpu.GPUDescription) -> None:
    platform, target = host_platform()
    assert platform.target_kind == "cuda" and target.arch == "sm_90"
    assert target.details["name"] == gpu_host.name and target.toolchain is not None
    assert worker_queues(Settings(worker_queues=None)) == ["gpu.sm_90", "control"]
    # the cuda platform accepts a cuda target on a GPU host, and the GPU worker refuses CPU jobs
    assert platform_for("cuda").mismatch(TargetSpec(kind="cuda", arch="sm_90")) is None
    cpu_job = hardware.host_target()
    assert "GPU worker" in str(platform_for(cpu_job).mismatch(cpu_job))
    resolved = platform_for("cuda").resolve(TargetSpec(kind="cuda", arch="sm_90"))
    assert resolved.details == gpu_host.details() and resolved.fingerprint == target.fingerprint


def test_cpu_host_never_takes_cuda_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "detect", lambda: None)
    monkeypatch.delenv("KERNELFLEET_WORKER_PLATFORM", raising=False)
    platform, target = host_platform()
    assert platform.target_kind == "llvm"
    queues = worker_queues(Settings(worker_queues=None))
    assert queues[0].startswith("cpu.") and not any(q.startswith("gpu.") for q in queues)
    assert "no CUDA GPU" in str(platform_for("cuda").mismatch(TargetSpec(kind="cuda", arch="sm_90")))
    assert hardware.mismatch(target) is None


def test_this_host_detection_runs() -> None:
    """The real detection on this host: None without nvidia-smi, a full description with a GPU."""
    found = gpu.detect()
    if found is None:
        pytest.skip("no NVIDIA GPU on this host (nvidia-smi absent or reports none): detection returned None")
    assert found.arch.startswith("sm_") and found.sm_count > 0
