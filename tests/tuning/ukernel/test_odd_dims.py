"""Dense layers whose N has no lane-aligned divisor (N = 1000 with 16 fp32 lanes) and whose K is odd (999).

Before N padding, the rules found no tile ("no uKernel tile passes the hardware rules") and such a
layer got no table at all (issue 10 item 7). Now N is padded to a multiple of nt inside the kernel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernelfleet.dispatcher import Dispatcher
from kernelfleet.ukernel import load_ukernel
from service.models import WorkloadSpec
from service.tuning.hardware import host_target
from service.tuning.hardware_model import HardwareModel
from service.tuning.kinds.ukernel import verify
from service.tuning.platforms import tvm_target
from service.tuning.tuners.ukernel.kernel import build_ukernel
from service.tuning.tuners.ukernel.rules import check_tile, dense_candidates
from service.tuning.tuners.ukernel.tuner import QuietRangeSink, RangeTask, UKernelTuner

CACHES = {1: 32 << 10, 2: 1 << 20, 3: 32 << 20}
AVX512 = HardwareModel.from_cpu_description(["avx2", "fma", "avx512f"], CACHES, cores=2)  # 16 lanes
AVX2 = HardwareModel.from_cpu_description(["avx2", "fma"], CACHES, cores=2)  # 8 lanes


@pytest.mark.parametrize("hw", [AVX512, AVX2], ids=["avx512", "avx2"])
@pytest.mark.parametrize(("n", "k"), [(1000, 999), (1000, 997), (17, 13), (1, 1)])
def test_every_dense_shape_gets_tiles(hw: HardwareModel, n: int, k: int) -> None:
    cands = dense_candidates(hw, n, k, representative_m=64, distinct_mt=True)
    assert cands, f"no tile for N={n}, K={k}"
    lanes = hw.lanes()
    for c in cands:
        assert c.nt % lanes == 0 and k % c.kt == 0 and c.registers <= hw.vector_registers
        assert check_tile(hw, n, k, c.mt, c.nt, c.kt, 64, pad_n=n % c.nt != 0)[0]


def test_padding_is_used_only_when_no_aligned_tile_divides_n() -> None:
    assert all(768 % c.nt == 0 for c in dense_candidates(AVX512, 768, 768))  # unchanged for divisible N
    padded = dense_candidates(AVX512, 1000, 999, representative_m=64)
    assert any("N is padded to" in r for c in padded for r in c.reasons)
    # the padded columns are paid for in the score: mt=4, nt=64 (4 vectors) has intensity 16/8 = 2, pads no M
    # row at M=48, fills both cores with 12·16 tasks and computes 1024 columns for 1000
    tiles = {(c.mt, c.nt): c.score for c in dense_candidates(AVX512, 1000, 999, representative_m=48, top_k=500)}
    assert tiles[(4, 64)] == pytest.approx(2.0 * 1000 / 1024)


@pytest.mark.parametrize(("n", "k", "mt", "nt", "kt"), [(1000, 999, 5, 80, 3), (40, 7, 3, 32, 7), (5, 3, 1, 16, 1)])
def test_padded_kernel_is_correct_for_every_m_and_survives_export(
    tmp_path: Path, n: int, k: int, mt: int, nt: int, kt: int
) -> None:
    kernel = build_ukernel(n, k, mt, nt, kt, tvm_target(host_target()))
    assert n == kernel.spec.N and kernel.spec.n_computed % nt == 0 and kernel.spec.padded == (n % nt != 0)
    art = kernel.export(tmp_path)
    loaded = load_ukernel(art.path, art.spec, art.sha256)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, k), dtype=np.float32)
    for uk in (kernel, loaded):
        packed = uk.pack_weight(w)
        for m in (1, mt - 1 or 1, mt, mt + 1, 37):
            x = rng.standard_normal((m, k), dtype=np.float32)
            np.testing.assert_allclose(uk(x, packed), x @ w.T, rtol=1e-4, atol=1e-3)
    assert kernel.time(8, repeat=2, min_repeat_ms=1) > 0


def test_a_ukernel_job_for_n1000_k999_publishes_a_verified_table(tmp_path: Path) -> None:
    workload = WorkloadSpec(op="dense", dims={"N": 1000, "K": 999}, symbolic=["M"])
    task = RangeTask(
        workload=workload,
        s_max=24,
        validate=[24, 5],
        target=host_target(),
        max_ukernels=2,
        work_dir=tmp_path,
        representative_m=12,
        min_repeat_ms=2,
    )
    out = UKernelTuner().tune(task, QuietRangeSink())
    assert out.table.s_max == 24
    assert verify(out, workload) is None  # every S ≤ 24 and primes past it, through the SDK dispatcher
    d = Dispatcher(out.table, out.kernels, N=1000, K=999)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((1000, 999), dtype=np.float32)
    x = rng.standard_normal((29, 999), dtype=np.float32)[3:]  # unaligned rows, S past the tuned range
    np.testing.assert_allclose(d(x, w), x @ w.T, rtol=1e-4, atol=1e-3)
