"""The CACTI-backed SRAM cost, the Gemmini area model, resource budgets, and the zigzag backend's SRAM energies."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from service.tuning.gemmini.area import (
    ACC_BITS,
    ACC_PORTS,
    ACC_SCALE_LATENCY,
    MVIN_SCALE_LATENCY,
    MVIN_SCALE_UNITS,
    UNCONSTRAINED,
    UTILISATION,
    ResourceBudget,
    accumulator_sram,
    area_breakdown,
    config_area_mm2,
    default_budget,
    pe_area_um2,
    recalled_scaled,
    scale_unit_um2,
    scratchpad_sram,
    sram_energies,
)
from service.tuning.gemmini.backends import get_backend
from service.tuning.gemmini.space import ACC_BANKS, DEFAULT_HW, HwConfig, Layer, Mapping
from service.tuning.gemmini.sram import clear_memory_cache, sram_cost

pytest.importorskip("zigzag")


def test_cacti_runs_for_real_and_is_cached_on_disk(tmp_path: Path) -> None:
    cache = tmp_path / "cacti.json"
    clear_memory_cache()
    c = sram_cost(64 * 1024, 4, 128, tech_nm=45, cache_file=cache)  # one default scratchpad bank geometry
    assert c.area_mm2 > 0 and c.read_pj > 0 and c.write_pj > 0 and c.access_ns > 0
    assert not c.clamped and c.macros_per_bank == 1 and c.source.startswith("cacti7")
    stored = json.loads(cache.read_text())
    assert "45nm/16384B/128b" in stored  # 64 KiB / 4 banks, 128-bit rows
    clear_memory_cache()
    again = sram_cost(64 * 1024, 4, 128, tech_nm=45, cache_file=cache)  # from the file this time
    assert again == c


def test_area_grows_with_capacity_banks_and_row_width() -> None:
    small, big = sram_cost(64 * 1024, 4, 128), sram_cost(256 * 1024, 4, 128)
    assert big.area_mm2 > 2 * small.area_mm2
    assert big.read_pj > small.read_pj  # longer bitlines/wordlines per access
    assert sram_cost(64 * 1024, 8, 128).area_mm2 > sram_cost(64 * 1024, 2, 128).area_mm2  # more periphery
    assert sram_cost(64 * 1024, 2, 512).read_pj > sram_cost(64 * 1024, 2, 128).read_pj  # wider row, more bits
    a = [config_area_mm2(replace(DEFAULT_HW, dim=d)) for d in (8, 16, 32)]
    assert a[0] < a[1] < a[2]


def test_tiny_and_wide_banks_are_costed_not_rejected() -> None:
    tiny = sram_cost(2 * 1024, 4, 1024)  # DIM=128 scratchpad of 2 KiB: 4 rows per bank
    assert tiny.clamped and tiny.macros_per_bank == 8 and tiny.area_mm2 > 0
    wide = sram_cost(4096 * 1024, 2, 4096)  # DIM=128 accumulator rows: 32 parallel 128-bit macros
    assert wide.macros_per_bank == 32 and wide.area_mm2 > sram_cost(1024 * 1024, 2, 4096).area_mm2


def test_default_config_area_is_plausible() -> None:
    """Gemmini's default (16×16, 256 KiB scratchpad, 64 KiB accumulator) at 45 nm.

    Floor: 320 KiB of 6T bitcells at Intel 45 nm's 0.346 µm² (Mistry et al., IEDM 2007 [recalled]) is
    0.91 mm²; SRAM macros add decoders, sense amps and I/O (array efficiency well under 100 %), so the
    scratchpad + accumulator must come out above ~0.9× that floor and below 3× it. The SRAMs must
    dominate the array (Gemmini's memories are most of its area: Genc et al., DAC 2021 [recalled]).
    Total: 1.0–3.0 mm² at 45 nm."""
    b = area_breakdown(DEFAULT_HW)
    sram = b["scratchpad_mm2"] + b["accumulator_mm2"]
    floor = 320 * 1024 * 8 * 0.346e-6
    assert 0.9 * floor < sram < 3 * floor
    assert b["pe_array_mm2"] < sram
    assert 0.05 < b["pe_array_mm2"] < 0.5  # 256 PEs of ~500–900 µm² of cells each, placed at 60 % utilisation
    assert 1.0 < b["total_mm2"] < 3.0
    assert b["total_mm2"] == pytest.approx(sum(v for k, v in b.items() if k != "total_mm2"))
    assert config_area_mm2(DEFAULT_HW, tech_nm=22) < b["total_mm2"] / 2  # a smaller node shrinks it


def test_budget_fits_and_rejects() -> None:
    budget = default_budget()
    assert budget.fits(DEFAULT_HW)  # equal area fits
    assert budget.area_mm2 == pytest.approx(config_area_mm2(DEFAULT_HW))
    assert not budget.fits(replace(DEFAULT_HW, dim=32))  # 4× the PEs with the same memories
    assert not budget.fits(replace(DEFAULT_HW, sp_kib=512))
    assert not budget.fits(replace(DEFAULT_HW, dma_buswidth=256))
    assert budget.fits(HwConfig(dim=16, sp_kib=128, acc_kib=64))
    why = budget.why_not(replace(DEFAULT_HW, sp_kib=1024))
    assert why is not None and "mm²" in why
    assert UNCONSTRAINED.fits(HwConfig(dim=128, sp_kib=8192, acc_kib=4096, dma_buswidth=512))
    assert not ResourceBudget(max_pes=64).fits(DEFAULT_HW)
    assert not ResourceBudget(max_sram_kib=256).fits(DEFAULT_HW)


def test_zigzag_energies_come_from_cacti() -> None:
    small, big = HwConfig(dim=16, sp_kib=64, acc_kib=64), HwConfig(dim=16, sp_kib=1024, acc_kib=64)
    es, eb = sram_energies(small), sram_energies(big)
    assert eb["scratchpad"]["read_pj"] > es["scratchpad"]["read_pj"]  # a bigger bank costs more per access
    assert eb["accumulator"] == es["accumulator"]
    assert es["source"].startswith("cacti7")

    layer = Layer.gemm("g", M=64, N=64, K=64)
    m = Mapping({"N": 64, "K": 64, "C": 64, "P": 1, "Q": 1, "R": 1, "S": 1})
    zz = get_backend("zigzag", timeout_s=300)
    assert zz.version().endswith("+cacti-sram")
    (a,) = zz.measure(small, [layer], [m])
    (b,) = zz.measure(big, [layer], [m])
    (t,) = get_backend("zigzag", timeout_s=300, sram_energy="table63").measure(small, [layer], [m])
    assert a.detail["sram_energy"].startswith("cacti7") and t.detail["sram_energy"] == "baco-table-6.3"
    assert a.cycles == b.cycles == t.cycles  # energies only
    assert a.energy_pj and b.energy_pj and t.energy_pj
    assert b.energy_pj > a.energy_pj  # only the scratchpad size changed: CACTI's per-access energy moved it
    assert a.energy_pj != pytest.approx(t.energy_pj, rel=0.005)  # another source: not the same total (2 % apart here)


def test_co_explore_stays_within_the_area_budget() -> None:
    from service.tuning.tuners.gemmini.search import Limits, co_explore

    budget = default_budget()
    layer = Layer.gemm("g", M=256, N=256, K=256)
    r = co_explore([layer], 200, seed=0, limits=Limits(buses=(128,), accept=budget.fits))
    assert budget.fits(r.hw)
    assert all(budget.fits(hw) for hw in r.explored)
    with pytest.raises(ValueError):
        co_explore([layer], 10, start_hw=replace(DEFAULT_HW, dim=32), limits=Limits(accept=budget.fits))


def test_recalled_constants_scale_inside_the_block_and_only_there() -> None:
    """Issue 36 item 2: an equal-area claim is re-checked with the recalled cell areas at x0.5 and x2; the PE
    array's share scales, the SRAM's (CACTI) does not, the default budget moves with it, and the block restores."""
    big = replace(DEFAULT_HW, dim=32)
    before, default_before = area_breakdown(big), config_area_mm2(DEFAULT_HW)
    with recalled_scaled(mac=2.0):
        doubled = area_breakdown(big)
        budget, default_doubled = default_budget(), config_area_mm2(DEFAULT_HW)
    assert area_breakdown(big) == before and config_area_mm2(DEFAULT_HW) == default_before
    assert doubled["scratchpad_mm2"] == before["scratchpad_mm2"]
    assert before["pe_array_mm2"] < doubled["pe_array_mm2"] < 2 * before["pe_array_mm2"]  # registers unscaled
    assert budget.area_mm2 == pytest.approx(default_doubled) and default_doubled > default_before
    with recalled_scaled(dff=0.5):
        assert area_breakdown(big)["total_mm2"] < before["total_mm2"]
    with pytest.raises(ValueError, match="positive"), recalled_scaled(mac=0):
        pass


def test_the_accumulator_is_priced_two_ported_as_default_config_builds_it() -> None:
    """Issue 36 item 2: one read and one write port per accumulator bank (it reads and writes a row in the same
    cycle); CACTI prices that macro at about twice the single-ported one, and reading it costs more."""
    one = sram_cost(DEFAULT_HW.acc_bytes, ACC_BANKS, DEFAULT_HW.dim * ACC_BITS)
    two = accumulator_sram(DEFAULT_HW)
    assert ACC_PORTS == (0, 1, 1)
    assert 1.8 < two.area_mm2 / one.area_mm2 < 2.4 and two.read_pj > one.read_pj
    assert area_breakdown(DEFAULT_HW)["accumulator_mm2"] == pytest.approx(two.area_mm2)


def test_scale_units_grow_with_the_array_dim_and_mvins_do_not() -> None:
    """Issue 36 item 2: defaultConfig's acc_scale_args builds one fp32 scale unit per column (num_scale_units -1),
    mvin_scale_args four whatever DIM; both were hidden in a flat overhead share before."""
    small, big = area_breakdown(DEFAULT_HW), area_breakdown(replace(DEFAULT_HW, dim=32))
    per_column = scale_unit_um2(ACC_SCALE_LATENCY) / 1e6 / UTILISATION
    assert big["scale_units_mm2"] - small["scale_units_mm2"] == pytest.approx(16 * per_column)
    mvin = MVIN_SCALE_UNITS * scale_unit_um2(MVIN_SCALE_LATENCY) / 1e6 / UTILISATION
    assert small["scale_units_mm2"] == pytest.approx(16 * per_column + mvin)
    with recalled_scaled(fp=2.0):
        doubled = area_breakdown(DEFAULT_HW)
    assert small["scale_units_mm2"] < doubled["scale_units_mm2"] < 2 * small["scale_units_mm2"]  # registers unscaled
    assert doubled["pe_array_mm2"] == small["pe_array_mm2"]


def test_placement_utilisation_spreads_the_logic_and_not_the_sram_macros() -> None:
    b = area_breakdown(DEFAULT_HW)
    cells = DEFAULT_HW.dim**2 * pe_area_um2(DEFAULT_HW) / 1e6
    assert UTILISATION == 0.60 and b["pe_array_mm2"] == pytest.approx(cells / UTILISATION)
    assert b["scratchpad_mm2"] == pytest.approx(scratchpad_sram(DEFAULT_HW).area_mm2)  # a macro, placed as is
    # a budget below the logic alone is refused before any CACTI run, naming the logic
    why = ResourceBudget(area_mm2=0.5).why_not(replace(DEFAULT_HW, dim=32))
    assert why is not None and why.startswith("logic alone")
