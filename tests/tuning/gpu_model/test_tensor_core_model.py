"""The static model reads a tensor-core kernel: mma.sync FMAs, ldmatrix loads and their bank wavefronts."""

from __future__ import annotations

import pytest

from service.tuning.builder.cuda import cuda_target, pass_config
from service.tuning.gpu_model.access import analyze
from service.tuning.gpu_model.arch import sm_spec
from service.tuning.gpu_model.bound import predict
from service.tuning.tuners.pipeline.tensorcore import TensorCoreTile, schedule_tensorcore

N, K = 2304, 768


@pytest.mark.parametrize("label", ["tc32x64x32_w16x32_s3", "tc16x64x64_w16x16_s2"])
def test_every_fma_of_the_padded_problem_is_an_mma_and_ldmatrix_is_conflict_free(label: str) -> None:
    tile = TensorCoreTile.from_label(label)
    access = analyze(schedule_tensorcore(tile, N, K).mod, cuda_target("sm_90a"), pass_config("sm_90a"))
    kernel = access.kernels[0]
    m = 3 * tile.bm  # three row blocks
    assert kernel.fma_per_thread == 0
    assert kernel.mma_fma_per_thread * kernel.threads * kernel.grid(m) == m * N * K
    shared = [load for load in kernel.shared_loads if load.width_bytes == 16]
    assert shared and all(load.phase_wavefronts == load.ideal == 4 for load in shared)  # padded rows: no conflict
    predicted = predict(access, m, sm_spec("sm_90a", 132))
    assert predicted.mma_s > 0 and predicted.ffma_s == 0
