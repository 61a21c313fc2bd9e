"""Shape-generic uKernels compiled with real TVM: one binary per tile, correct for every M."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from service.models import WorkloadSpec
from service.tuning.compute import random_inputs, reference, tolerance
from service.tuning.hardware import host_target
from service.tuning.platforms import tvm_target
from service.tuning.tuners.ukernel.kernel import (
    UKernel,
    UKernelSpec,
    aligned_empty,
    build_ukernel,
    load_ukernel,
    schedule_ukernel,
)
from tests.tuning.ukernel.conftest import K, N

MS = [*range(1, 41), 61, 97, 128, 131, 257]


@pytest.mark.parametrize("name", ["mt6", "mt1"])
def test_one_binary_is_correct_for_every_m(
    name: str, ukernels: dict[str, UKernel], dense_workload: WorkloadSpec
) -> None:
    uk = ukernels[name]
    _, w = random_inputs(dense_workload, {"M": 1}, seed=1)
    packed = uk.pack_weight(w)
    for m in MS:
        x, _ = random_inputs(dense_workload, {"M": m}, seed=m)
        got = uk(x, packed)
        assert got.shape == (m, N)
        err = float(np.abs(got - reference(dense_workload)(x, w)).max())
        assert err <= tolerance(dense_workload, {"M": m}), f"{name} M={m}: max error {err}"


def test_pack_weight_layout(ukernels: dict[str, UKernel]) -> None:
    uk = ukernels["mt6"]  # nt = 32
    w = np.arange(N * K, dtype=np.float32).reshape(N, K)
    packed = uk.pack_weight(w)
    assert packed.shape == (N // 32, K, 32) and packed.ctypes.data % 64 == 0
    for b, k, c in [(0, 0, 0), (1, 5, 7), (1, 31, 31), (0, 17, 30)]:
        assert packed[b, k, c] == w[b * 32 + c, k]
    with pytest.raises(ValueError, match="weight"):
        uk.pack_weight(w[:, :16])


def test_unaligned_views_and_out(ukernels: dict[str, UKernel]) -> None:
    """Row slices start anywhere: unaligned memory must be copied, never handed to the kernel as is."""
    uk = ukernels["mt6"]
    rng = np.random.default_rng(0)
    w = rng.standard_normal((N, K), dtype=np.float32)
    packed = uk.pack_weight(w)
    x = rng.standard_normal((50, K), dtype=np.float32)
    y = np.full((50, N), np.nan, dtype=np.float32)
    for lo, hi in [(1, 14), (3, 4), (14, 50), (0, 50)]:
        uk(x[lo:hi], packed, out=y[lo:hi])  # x[1:] starts 128 bytes in, y[3:] 768: mixed alignment
    assert float(np.abs(y[:1] - x[:1] @ w.T).max()) < 1e-4
    assert float(np.abs(y - x @ w.T).max()) < 1e-4
    packed.flags.writeable = False  # read-only arrays cannot be exported through DLPack: copied instead
    aligned = aligned_empty((50, N))
    assert uk(x, packed, out=aligned) is aligned
    assert float(np.abs(aligned - x @ w.T).max()) < 1e-4
    with pytest.raises(ValueError):
        uk(x[:, :16], packed)
    with pytest.raises(ValueError):
        uk(x, w)  # unpacked weight
    with pytest.raises(ValueError):
        uk(x, packed, out=np.zeros((49, N), np.float32))


def test_export_load_content_addressed(ukernels: dict[str, UKernel], tmp_path: Path) -> None:
    uk = ukernels["mt6"]
    art = uk.export(tmp_path / "store")
    assert art.path == tmp_path / "store" / f"{art.sha256}.so"
    assert hashlib.sha256(art.path.read_bytes()).hexdigest() == art.sha256
    assert list((tmp_path / "store").iterdir()) == [art.path]  # no staging leftovers
    spec = UKernelSpec.from_dict(art.spec.to_dict())
    assert spec == uk.spec
    loaded = load_ukernel(art.path, spec, sha256=art.sha256)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((N, K), dtype=np.float32)
    x = rng.standard_normal((97, K), dtype=np.float32)
    assert float(np.abs(loaded(x, loaded.pack_weight(w)) - x @ w.T).max()) < 1e-4
    tampered = tmp_path / "tampered.so"
    shutil.copy(art.path, tampered)
    with tampered.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(ValueError, match="sha256"):
        load_ukernel(tampered, spec, sha256=art.sha256)


def test_timing(ukernels: dict[str, UKernel]) -> None:
    uk = ukernels["mt6"]
    seconds = uk.time(64, repeat=3, min_repeat_ms=5)
    assert 0 < seconds < 0.01
    assert uk.gflops(64, seconds) == pytest.approx(2 * 64 * N * K / seconds / 1e9)


def test_schedule_shape_and_bad_tiles() -> None:
    script = schedule_ukernel(N, K, 6, 32, 4, 16)["main"].script()
    assert "X_pad" in script and "T.parallel" in script  # padded X, parallel tiles
    # X is padded once, in its own parallel loop before the tiles: not again inside every (N-tile, M-tile) task
    tiles = script.index("j_0_i_0_fused in T.parallel")
    assert script.count("T.parallel(") == 2 and script.index('T.sblock("X_pad")') < tiles
    assert 'T.sblock("X_pad")' not in script[tiles:]
    target = tvm_target(host_target())
    for bad in [(6, 32, 5), (0, 32, 4)]:  # kt ∤ K, empty tile (nt ∤ N pads N: test_odd_dims.py)
        with pytest.raises(ValueError):
            build_ukernel(N, K, *bad, target)
    with pytest.raises(ValueError, match="float16"):
        build_ukernel(N, K, 6, 32, 4, target, dtype="float16")
