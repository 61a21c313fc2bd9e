"""ZigZag and SCALE-Sim run for real on small shapes (each in its own process with a timeout); the FireSim
adapter runs against a scripted FAKE `firesim` (tests/tuning/gemmini/fake_firesim): its numbers are fake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.tuning.gemmini.backends import BackendError, get_backend
from service.tuning.gemmini.backends.firesim import FireSimBackend, MissingBitstream, Request
from service.tuning.gemmini.backends.firesim_program import render_program
from service.tuning.gemmini.gemmini_h import default_point
from service.tuning.gemmini.model import layer_cost
from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, Layer, Mapping
from service.tuning.tuners.gemmini.calibration import correlate
from tests.tuning.gemmini.firesim_fake import make_fake_checkout

FAKE = Path(__file__).parent / "fake_firesim"
SMALL = [Layer.gemm("g64", 64, 64, 64), Layer.conv("c8", 8, 8, 16, 16, 3, 3)]


def test_zigzag_scores_the_fixed_mapping_for_real() -> None:
    zz = get_backend("zigzag", timeout_s=120)
    why = zz.available()
    if why:
        pytest.skip(why)
    lay = Layer.gemm("g", 128, 128, 128)
    good = Mapping({"N": 128, "K": 128, "C": 128})
    small = Mapping({"N": 16, "K": 16, "C": 16})
    ws = HwConfig(dataflow="WS")  # the default array is BOTH: pin WS so both mappings run the same dataflow
    a, b = zz.measure(ws, [lay, lay], [good, small])
    assert a.backend == "zigzag" and a.cycles > 128**3 / 256 and a.energy_pj and a.energy_pj > 0
    assert b.cycles > a.cycles  # 16×16×16 tiles reload everything: ZigZag sees the mapping, not only the hw
    assert a.detail["temporal_ordering"][0] == ["B", 128]
    # the analytical model agrees on the order of magnitude
    assert 0.5 < layer_cost(ws, lay, good).cycles / a.cycles < 2


def test_zigzag_times_out_in_its_own_process() -> None:
    zz = get_backend("zigzag", timeout_s=0.5)
    with pytest.raises(BackendError, match="timed out"):
        zz.measure(DEFAULT_HW, [SMALL[0]], [Mapping({"N": 64, "K": 64, "C": 64})])


def test_scalesim_runs_for_real_in_its_isolated_env() -> None:
    ss = get_backend("scalesim", timeout_s=120)
    try:
        maps, _ = default_point(SMALL)
        got = ss.measure(DEFAULT_HW, SMALL, maps)
    except BackendError as exc:
        if "could not build the scalesim virtualenv" in str(exc):
            pytest.skip(f"no network to build SCALE-Sim's venv here: {exc}")
        raise
    assert [m.backend for m in got] == ["scalesim", "scalesim"]
    assert got[0].cycles >= 64**3 / 256  # at least the ideal compute time
    assert got[0].detail["dram_reads_ifmap"] == 64 * 64
    with pytest.raises(BackendError, match="small shapes"):
        ss.measure(DEFAULT_HW, [Layer.gemm("big", 1024, 1024, 1024)], [Mapping({})])


def test_calibration_reports_correlation_with_the_backend_named() -> None:
    r = correlate([1.0, 2.0, 3.0, 4.0], [10.0, 21.0, 29.0, 41.0], "zigzag")
    assert r["backend"] == "zigzag" and r["pearson_r"] > 0.99 and r["spearman_rho"] == pytest.approx(1.0)
    assert r["fit"]["a"] == pytest.approx(10.2, rel=0.05)


# -- FireSim adapter against the FAKE CLI --------------------------------------------------------------
@pytest.fixture
def fake_firesim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FireSimBackend:
    make_fake_checkout(tmp_path / "firesim")
    bitstream = tmp_path / "gemmini_default.tar.gz"
    bitstream.write_text("FAKE bitstream")
    backend = FireSimBackend(
        firesim_dir=tmp_path / "firesim",
        registry=tmp_path / "registry.json",
        build_cmd=f"{FAKE / 'fake_riscv_build'} {{src}} {{out}}",
        timeout_s=10,
        batch=3,
    )
    backend.registry.register(DEFAULT_HW, "gemmini_default_fake", str(bitstream))
    monkeypatch.delenv("FAKE_FIRESIM_MODE", raising=False)
    return backend


def _candidates() -> tuple[list[Layer], list[Mapping]]:
    layers = [Layer.gemm(f"g{i}", 64, 64, 64 * (i + 1)) for i in range(4)]
    return layers, [Mapping({"N": 64, "K": 64, "C": 64})] * 4


def test_fake_firesim_run_parses_one_line_per_candidate(fake_firesim: FireSimBackend) -> None:
    layers, maps = _candidates()
    got = fake_firesim.measure(DEFAULT_HW, layers, maps)  # 4 candidates in batches of 3: two FAKE runs
    assert [m.layer for m in got] == ["g0", "g1", "g2", "g3"]
    assert all(m.backend == "firesim" and m.detail["correct"] for m in got)
    assert got[1].cycles == 64 * 64 * 128 // 256 + 1000  # the FAKE formula: proves the parse, measures nothing
    runs = list((fake_firesim.dir / "deploy" / "results-workload").iterdir())
    assert len(runs) == 2
    wl = json.loads(next((fake_firesim.dir / "deploy" / "workloads").glob("*.json")).read_text())
    assert wl["common_simulation_outputs"] == ["uartlog"] and wl["workloads"][0]["rootfs"] is None


def test_fake_firesim_groups_requests_by_hardware_config(fake_firesim: FireSimBackend, tmp_path: Path) -> None:
    other = HwConfig(dim=32, sp_kib=512, acc_kib=128)
    bit = tmp_path / "other.tar.gz"
    bit.write_text("FAKE")
    fake_firesim.registry.register(other, "gemmini_32_fake", str(bit))
    layers, maps = _candidates()
    out = fake_firesim.measure_many(
        [
            Request(DEFAULT_HW, layers[:2], maps[:2]),
            Request(other, layers[2:3], [Mapping({"N": 64, "K": 64, "C": 64})]),
            Request(DEFAULT_HW, layers[3:], maps[3:]),
        ]
    )
    assert [len(r) for r in out] == [2, 1, 1]
    runtimes = sorted((fake_firesim.dir / "deploy" / "workloads").glob("*/config_runtime.yaml"))
    names = sorted(json.loads(p.read_text())["target_config"]["default_hw_config"] for p in runtimes)
    assert names == ["gemmini_32_fake", "gemmini_default_fake"]  # one run per config: 3 default ones batched


def test_fake_firesim_hung_run_times_out_and_kills(
    fake_firesim: FireSimBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FIRESIM_MODE", "hang")
    fake_firesim.timeout_s = 2
    layers, maps = _candidates()
    with pytest.raises(BackendError, match="runworkload timed out"):
        fake_firesim.measure(DEFAULT_HW, layers[:1], maps[:1])
    assert (fake_firesim.dir / "deploy" / "FAKE_KILLED").read_text() == "kill\n"


def test_fake_firesim_malformed_uartlog_is_an_error(
    fake_firesim: FireSimBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FIRESIM_MODE", "malformed")
    layers, maps = _candidates()
    with pytest.raises(BackendError, match="malformed result line"):
        fake_firesim.measure(DEFAULT_HW, layers[:1], maps[:1])


def test_fake_firesim_missing_bitstream(fake_firesim: FireSimBackend, tmp_path: Path) -> None:
    layers, maps = _candidates()
    with pytest.raises(MissingBitstream, match="no FireSim bitstream"):
        fake_firesim.measure(HwConfig(dim=64, sp_kib=1024, acc_kib=256), layers[:1], maps[:1])
    # registered but the image is gone: the FAKE manager's infrasetup fails and the adapter says so
    gone = HwConfig(dim=8)
    fake_firesim.registry.register(gone, "gemmini_gone_fake", str(tmp_path / "missing.tar.gz"))
    with pytest.raises(BackendError, match=r"infrasetup exited 1.*bitstream"):
        fake_firesim.measure(gone, layers[:1], [Mapping({"N": 64, "K": 64, "C": 64})])


def test_generated_program_calls_tiled_matmul_with_explicit_tiles() -> None:
    src = render_program(DEFAULT_HW, [(Layer.gemm("g", 64, 32, 48), Mapping({"N": 32, "K": 32, "C": 48}))])
    assert "tiled_matmul(64, 32, 48," in src and "0, false, 2, 2, 3, false" in src
    assert 'printf("TUNE_RESULT id=0 cycles=%llu correct=%d saturated=%lu\\n"' in src


def test_a_registry_entry_that_records_another_generator_config_is_refused(fake_firesim: FireSimBackend) -> None:
    """Issue 36 item 6: nothing FireSim reads names the Gemmini config (runtime → HWDB entry → bitstream tarball),
    so the registry's record is the only tie, and a record that disagrees with the key is not run as that config."""
    data = json.loads(fake_firesim.registry.path.read_text())
    entry = data[DEFAULT_HW.key()]
    assert fake_firesim.registry.lookup(DEFAULT_HW)["generator_config"] == DEFAULT_HW.generator_config()
    entry["generator_config"] = HwConfig(dim=32, sp_kib=512, acc_kib=128).generator_config()
    fake_firesim.registry.path.write_text(json.dumps(data))
    layers, maps = _candidates()
    with pytest.raises(MissingBitstream, match="records generator_config"):
        fake_firesim.measure(DEFAULT_HW, layers[:1], maps[:1])
