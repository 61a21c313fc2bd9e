"""Random and grid search spending backend evaluations directly (issue 36 item 4), and backends measuring many
points at once. The backend here is a FAKE that prices each point with the analytical model and counts what it
is asked; ZigZag itself is exercised by the calibration and kind tests."""

from __future__ import annotations

from service.tuning.gemmini.area import default_budget
from service.tuning.gemmini.gemmini_h import default_mapping
from service.tuning.gemmini.model import resolve
from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, Layer, fit
from service.tuning.tuners.gemmini.backend_pick import network_edp
from service.tuning.tuners.gemmini.backend_search import backend_grid, backend_random
from service.tuning.tuners.gemmini.search import Limits, hw_grid
from tests.tuning.gemmini.fake_backends import ModelBackend

QKV = Layer.gemm("qkv", 128, 768, 768, weight=2)
CONV = Layer.conv("c", 28, 28, 64, 64, 3, 3, padding=1)
EQUAL_AREA = Limits(buses=(128,), accept=default_budget().fits)


def test_measure_points_runs_one_call_per_run_of_points_on_one_config() -> None:
    backend = ModelBackend()
    other = HwConfig(dim=16, sp_kib=128, acc_kib=128, dataflow="WS")
    points = [
        (DEFAULT_HW, QKV, resolve(DEFAULT_HW, QKV, default_mapping(DEFAULT_HW, QKV))),
        (DEFAULT_HW, CONV, resolve(DEFAULT_HW, CONV, default_mapping(DEFAULT_HW, CONV))),
        (other, QKV, resolve(other, QKV, default_mapping(other, QKV))),
    ]
    out = backend.measure_points(points)
    assert [m.layer for m in out] == ["qkv", "c", "qkv"]
    assert backend.calls == [(DEFAULT_HW, 2), (other, 1)]


def test_random_spends_at_most_its_evaluations_and_returns_the_best_it_measured() -> None:
    backend = ModelBackend()
    best = backend_random(backend, [QKV, CONV], 40, seed=2, limits=EQUAL_AREA)
    spent = sum(n for _, n in backend.calls)
    assert best.evaluations == spent <= 40 and spent % 2 == 0  # whole network samples only
    assert EQUAL_AREA.allows(best.hw) and best.hw.dma_buswidth == 128
    measured = backend.measure_points([(best.hw, lay, m) for lay, m in zip([QKV, CONV], best.mappings, strict=True)])
    assert network_edp([QKV, CONV], measured) == best.edp
    assert backend_random(ModelBackend(), [QKV, CONV], 40, seed=2, limits=EQUAL_AREA) == best  # the seed fixes it


def test_the_grid_with_enough_evaluations_measures_the_whole_grid_the_default_included() -> None:
    backend = ModelBackend()
    fitting = [
        hw
        for hw in hw_grid(EQUAL_AREA)
        if all(fit(hw, lay, resolve(hw, lay, default_mapping(hw, lay))) is None for lay in (QKV, CONV))
    ]
    best = backend_grid(backend, [QKV, CONV], 10 * len(fitting), seed=0, limits=EQUAL_AREA)
    measured = {hw for hw, _ in backend.calls}
    assert measured == set(fitting) and DEFAULT_HW in measured and best.evaluations == 2 * len(fitting)
    # with fewer evaluations it strides through the same points and spends no more than it has
    few = ModelBackend()
    part = backend_grid(few, [QKV, CONV], 20, seed=4, limits=EQUAL_AREA)
    assert part.evaluations == 20 and {hw for hw, _ in few.calls} <= set(fitting)
    assert part.edp >= best.edp
