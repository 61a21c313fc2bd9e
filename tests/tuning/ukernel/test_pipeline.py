"""The whole uKernel path on this host: rules → compile → measure → combine → dispatch table → run."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from service.tuning.hardware import host_target
from service.tuning.hardware_model import HardwareModel
from service.tuning.platforms import tvm_target
from service.tuning.tuners.ukernel.combine import (
    DispatchTable,
    TileCost,
    combine,
    dispatch_table,
    run_program,
    sample_ms,
)
from service.tuning.tuners.ukernel.cost import dietcode_predict, f_mk_from_measurement, spearman
from service.tuning.tuners.ukernel.kernel import aligned_empty, build_ukernel
from service.tuning.tuners.ukernel.rules import dense_candidates

N, K, S_MAX = 64, 32, 64


def test_rules_to_dispatch_table_runs_correctly() -> None:
    hw = HardwareModel.from_host()
    cands = dense_candidates(hw, N, K, representative_m=32, top_k=2, distinct_mt=True)
    assert len(cands) == 2 and cands[0].mt != cands[1].mt
    target = tvm_target(host_target())
    kernels = {f"mt{c.mt}_nt{c.nt}_kt{c.kt}": build_ukernel(N, K, c.mt, c.nt, c.kt, target) for c in cands}

    costs = []
    for uid, uk in kernels.items():
        timer = functools.partial(uk.time, repeat=3, min_repeat_ms=2)
        costs.append(TileCost.measure(uid, uk.spec.mt, timer, sample_ms(uk.spec.mt, S_MAX, points=4)))
        # DietCode's model reproduces the measurement it was fitted on
        m0, t0 = costs[-1].tiles[-1] * uk.spec.mt, costs[-1].seconds[-1]
        f_mk = f_mk_from_measurement(t0, m0, uk.spec.mt, uk.spec.nt, N, hw.cores)
        assert abs(dietcode_predict(f_mk, m0, uk.spec.mt, uk.spec.nt, N, hw.cores) - t0) < 1e-12

    programs = combine(costs, S_MAX)
    table = DispatchTable.from_dict(dispatch_table(programs).to_dict())  # as stored
    rng = np.random.default_rng(11)
    w = rng.standard_normal((N, K), dtype=np.float32)
    packed = {uid: uk.pack_weight(w) for uid, uk in kernels.items()}  # one packing per distinct nt
    for s in range(1, S_MAX + 1):
        x = rng.standard_normal((s, K), dtype=np.float32)
        pieces = table.lookup(s)
        assert pieces == programs[s - 1].pieces
        y = run_program(pieces, kernels, packed, x, aligned_empty((s, N)))
        assert float(np.abs(y - x @ w.T).max()) < 1e-4, f"S={s} {pieces}"


@pytest.mark.slow
def test_dietcode_model_tracks_measured_latency() -> None:
    """f_MK fitted at one M predicts other M: Spearman's ρ over (uKernel, S) pairs against measurements.

    Timing-based, so marked slow; the dynamic range across S (1 to 128 rows) keeps ρ far from the bound
    even on a loaded machine (0.97 measured with another job on one of the two cores).
    """
    n = k = 256
    cores = HardwareModel.from_host().cores
    target = tvm_target(host_target())
    predicted, measured = [], []
    for mt, nt, kt in [(4, 64, 4), (8, 32, 4), (1, 128, 4)]:
        uk = build_ukernel(n, k, mt, nt, kt, target)
        m0 = mt * -(-64 // mt)
        f_mk = f_mk_from_measurement(uk.time(m0, repeat=3, min_repeat_ms=5), m0, mt, nt, n, cores)
        for s in (1, 7, 16, 61, 128):
            predicted.append(dietcode_predict(f_mk, s, mt, nt, n, cores))
            measured.append(uk.time(s, repeat=3, min_repeat_ms=5))
    assert spearman(predicted, measured) > 0.8
