"""FTuner-style tile rules on fixed hardware descriptions, with expectations worked out by hand."""

from __future__ import annotations

import pytest

from service.tuning.hardware_model import HardwareModel
from service.tuning.tuners.ukernel.rules import RuleLimits, check_tile, dense_candidates

CACHES = {1: 32 << 10, 2: 1 << 20, 3: 32 << 20}
AVX512 = HardwareModel.from_cpu_description(["avx2", "fma", "avx512f"], CACHES, cores=2)  # 16 lanes, 32 regs
AVX2 = HardwareModel.from_cpu_description(["avx2", "fma"], CACHES, cores=2)  # 8 lanes, 16 regs


def test_avx512_ranking_for_bert_dense() -> None:
    # Register budget mt·v + v + 1 ≤ 32 with v = nt/16: v=4 → mt ≤ 6, v=6 → mt ≤ 4. Both reach
    # intensity mt·v/(mt+v) = 24/10 = 2.4. At M=128, mt=4 pads nothing; mt=6 pads 128 → 132.
    # kt: largest divisor of 768 with mt·v·kt ≤ 128 unrolled FMAs → 24·kt ≤ 128 → kt = 4.
    cands = dense_candidates(AVX512, 768, 768, representative_m=128)
    assert [c.tile for c in cands[:2]] == [(4, 96, 4), (6, 64, 4)]
    first, second = cands[0], cands[1]
    assert first.score == pytest.approx(2.4)
    assert second.score == pytest.approx(2.4 * 128 / 132)
    assert (second.registers, second.tasks, second.l1_tile_bytes) == (29, 22 * 12, (6 * 4 + 4 * 64) * 4)
    assert len(cands) == 8
    assert all(c.registers <= 32 and c.nt % 16 == 0 and 768 % c.nt == 0 and 768 % c.kt == 0 for c in cands)
    assert any(r.startswith("registers: 24 accumulators + 4 W + 1 broadcast = 29/32") for r in second.reasons)


def test_avx2_ranking_for_bert_dense() -> None:
    # 16 registers, 8 lanes: v=3 (nt=24) allows mt ≤ 4 → intensity 12/7; 6×16 (the classic AVX2 sgemm
    # tile, v=2) has 12/8 and pads 128 → 132. kt: 4·3·kt ≤ 128 → kt ≤ 10 → 8 (768 has no divisor 9 or 10).
    cands = dense_candidates(AVX2, 768, 768, representative_m=128)
    assert cands[0].tile == (4, 24, 8)
    assert cands[0].score == pytest.approx(12 / 7)
    assert cands[0].registers == 16
    six_by_16 = next(c for c in cands if c.tile[:2] == (6, 16))
    assert six_by_16.score == pytest.approx(1.5 * 128 / 132)
    assert all(c.registers <= 16 and c.nt % 8 == 0 for c in cands)


def test_individual_rules_reject_with_a_reason() -> None:
    ok, fills, reasons = check_tile(AVX512, 768, 768, 7, 64, 4, representative_m=128)  # 7·4 + 4 + 1 = 33
    assert not ok and fills
    assert any(r.startswith("registers FAIL: 28 accumulators") for r in reasons)
    ok, _, reasons = check_tile(AVX512, 768, 768, 4, 24, 4, representative_m=128)  # 24 is not 16-aligned
    assert not ok and reasons[0].startswith("alignment FAIL")
    ok, _, _ = check_tile(AVX2, 768, 768, 4, 24, 8, representative_m=128)  # but 3 AVX2 vectors is fine
    assert ok
    ok, _, reasons = check_tile(AVX512, 768, 768, 6, 64, 5, representative_m=128)  # 5 does not divide 768
    assert not ok and any(r.startswith("cache FAIL") for r in reasons)
    ok, _, reasons = check_tile(AVX512, 768, 768, 6, 64, 8, representative_m=128)  # 6·4·8 = 192 FMAs
    assert not ok and any(r.startswith("unroll FAIL: 192") for r in reasons)


def test_cache_rule_binds_with_a_small_l1() -> None:
    # L1 = 1 KiB, half usable: (6·kt + kt·64)·4 = 280·kt ≤ 512 → only kt = 1.
    tiny = AVX512.overridden(l1_bytes=1024)
    ok, _, reasons = check_tile(tiny, 768, 768, 6, 64, 4, representative_m=128)
    assert not ok and any("1120 B vs 512 B" in r for r in reasons)
    tile = next(c for c in dense_candidates(tiny, 768, 768, top_k=100) if c.tile[:2] == (6, 64))
    assert tile.kt == 1


def test_parallelism_filter_and_relaxation() -> None:
    # 64 cores, N=64, M=16: ceil(16/mt)·(64/nt) ≥ 64 needs nt=16 and mt=1 (16·4 = 64 tasks).
    # kt: 1·1·kt ≤ 128 and kt | 32 and kt ≤ 16 → 16.
    wide = AVX512.overridden(cores=64)
    assert [c.tile for c in dense_candidates(wide, 64, 32, representative_m=16, top_k=100)] == [(1, 16, 16)]
    # 1000 cores cannot be filled: every tile comes back, flagged.
    relaxed = dense_candidates(AVX512.overridden(cores=1000), 64, 32, representative_m=16, top_k=100)
    assert len(relaxed) > 1
    assert all("parallelism relaxed: no tile fills the cores" in c.reasons for c in relaxed)


def test_deterministic_and_distinct_mt() -> None:
    a = dense_candidates(AVX512, 768, 768, top_k=20)
    b = dense_candidates(AVX512, 768, 768, top_k=20)
    assert a == b
    distinct = dense_candidates(AVX512, 768, 768, distinct_mt=True, top_k=20)
    assert len({c.mt for c in distinct}) == len(distinct) > 8
    assert [c.tile for c in distinct[:2]] == [(4, 96, 4), (6, 64, 4)]
    limited = dense_candidates(AVX512, 768, 768, limits=RuleLimits(max_mt=4), top_k=20)
    assert max(c.mt for c in limited) == 4


def test_gpu_and_unknown_dtype_rejected() -> None:
    with pytest.raises(ValueError, match="CPU"):
        dense_candidates(HardwareModel.for_gpu("sm_80"), 768, 768)
    with pytest.raises(ValueError, match="dtype"):
        dense_candidates(AVX512, 768, 768, dtype="int8")
