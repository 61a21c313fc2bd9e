"""The schedule space and ALCOP's rule checker: legal cases accepted, illegal ones rejected by rule name."""

from __future__ import annotations

import dataclasses

import pytest

from service.tuning.tuners.pipeline.rules import (
    Buffer,
    IllegalSchedule,
    Loop,
    SchedulePlan,
    Step,
    check,
    check_config,
    gemm_plan,
    require_legal,
)
from service.tuning.tuners.pipeline.space import GemmShape, PipelineConfig, enumerate_space, feasible, gemm_of


def test_operators_become_gemms() -> None:
    assert gemm_of("dense", {"M": 61, "N": 2304, "K": 768}) == GemmShape(1, 61, 2304, 768)
    assert gemm_of("batch_matmul", {"B": 12, "M": 128, "N": 128, "K": 64}) == GemmShape(12, 128, 128, 64)
    # conv2d NHWC as an implicit GEMM: M = N·OH·OW, N = CO, K = KH·KW·CI
    conv = gemm_of("conv2d", {"N": 1, "H": 14, "W": 14, "CI": 256, "CO": 256, "KH": 3, "KW": 3}, {"padding": 1})
    assert conv == GemmShape(1, 196, 256, 2304)
    with pytest.raises(ValueError, match="dense, batch_matmul and conv2d"):
        gemm_of("softmax", {})


def test_space_covers_alcop_dimensions_and_stays_feasible() -> None:
    shape = GemmShape(1, 64, 1024, 2048)
    space = enumerate_space(shape)
    assert {c.smem_stages for c in space} == {1, 2, 3, 4, 5}
    assert {c.reg_stages for c in space} == {1, 2, 3}
    assert {c.async_copy for c in space} == {False, True} and {c.fuse_inner for c in space} == {False, True}
    assert all(feasible(c, shape) is None for c in space)
    assert all(c.smem_bytes(4) <= 48 << 10 and c.threads % 32 == 0 for c in space)
    assert not any(c.fuse_inner and (c.reg_stages == 1 or c.smem_stages == 1) for c in space)
    assert not any(c.async_copy and c.smem_stages == 1 for c in space)
    big = PipelineConfig(128, 128, 32, 8, 8, smem_stages=5)
    assert "shared memory" in (feasible(big, shape) or "")
    c = space[len(space) // 2]
    assert PipelineConfig.from_dict(c.to_dict()) == c and c.unpipelined().pipelined is False


def test_every_configuration_of_the_space_is_legal() -> None:
    for config in enumerate_space(GemmShape(1, 64, 1024, 2048)):
        assert check_config(config) == [], config.key


def _rules(plan: SchedulePlan) -> set[str]:
    return {v.rule for v in check(plan)}


LEGAL = gemm_plan(PipelineConfig(32, 32, 16, 2, 4, smem_stages=4, async_copy=True, reg_stages=2, fuse_inner=True))


def _with(plan: SchedulePlan, **changes: object) -> SchedulePlan:
    return dataclasses.replace(plan, **changes)  # type: ignore[arg-type]


def _buffer(plan: SchedulePlan, name: str, **changes: object) -> SchedulePlan:
    return _with(
        plan, buffers=tuple(dataclasses.replace(b, **changes) if b.name == name else b for b in plan.buffers)  # type: ignore[arg-type]
    )


def test_alcop_case_2_pipeline_then_inline_is_legal() -> None:
    """S1 cache-read (async copy) is pipelined, then f is inlined into the copy: both goals met (§3.3)."""
    assert check(LEGAL) == []
    require_legal(LEGAL)


def test_alcop_case_1_inline_first_is_rejected() -> None:
    """Inlining f before the cache-read makes the buffer f's output, not an async copy."""
    steps = (Step("inline", "A_pad"), *(s for s in LEGAL.steps if s != Step("inline", "A_pad")))
    assert _rules(_with(LEGAL, steps=steps)) == {"async-copy", "inlining-after-pipelining"}
    with pytest.raises(IllegalSchedule, match="inlining-after-pipelining"):
        require_legal(_with(LEGAL, steps=steps))


@pytest.mark.parametrize(
    ("plan", "rule"),
    [
        # pipelined on a thread-bound loop, an unrolled loop: not sequential
        (_buffer(LEGAL, "A_shared", loop="tx"), "sequential-loop"),
        (_buffer(LEGAL, "A_local", loop="ii"), "sequential-loop"),
        # the loop's variable indexes the buffer (a stencil-like buffer filled once and used)
        (_buffer(LEGAL, "A_shared", indexed_by=frozenset({"ko"})), "sequential-loop"),
        # pipelining before the cache-read that creates the buffer
        (
            _with(LEGAL, steps=(Step("pipeline", "A_shared"), *(s for s in LEGAL.steps if s.kind != "pipeline"))),
            "cache-read-before-pipelining",
        ),
        # pipelining before tiling creates the loop
        (
            _with(LEGAL, steps=(*(s for s in LEGAL.steps if s != Step("tile", "ko")), Step("tile", "ko"))),
            "tiling-before-pipelining",
        ),
        # two shared buffers on one loop with different depths or copy kinds: different barrier positions
        (_buffer(LEGAL, "B_shared", stages=3), "sync-scope"),
        (_buffer(LEGAL, "B_shared", async_copy=False), "sync-scope"),
        # cp.async fills shared memory from global memory only
        (_buffer(LEGAL, "A_local", async_copy=True), "async-copy"),
        # the register pipeline must lie inside the shared one it is fed from
        (_buffer(LEGAL, "A_local", loop="ko"), "multi-level"),
        # fusion without an inner pipeline
        (gemm_plan(PipelineConfig(32, 32, 16, 2, 4, smem_stages=4, async_copy=True, fuse_inner=True)), "fusion"),
    ],
)
def test_illegal_cases_are_rejected_with_the_rule_named(plan: SchedulePlan, rule: str) -> None:
    assert rule in _rules(plan)
    with pytest.raises(IllegalSchedule, match=rule):
        require_legal(plan)


def test_a_buffer_filled_by_a_computation_cannot_be_pipelined() -> None:
    plan = SchedulePlan(
        loops=(Loop("bx", "blockIdx"), Loop("ko")),
        buffers=(Buffer("S2_shared", "shared", "S2", "ko", stages=3, async_copy=True),),
        steps=(Step("tile", "bx"), Step("tile", "ko"), Step("inline", "S2"), Step("cache_read", "S2_shared"),
               Step("pipeline", "S2_shared")),
        global_tensors=frozenset({"S1", "S2"}),
    )
    assert "async-copy" in _rules(plan)
    # one stage (no pipelining) of the same buffer is fine: only pipelined buffers need an async-copy producer
    single = _buffer(plan, "S2_shared", stages=1, async_copy=False)
    assert _rules(_with(single, steps=tuple(s for s in plan.steps if s.kind != "pipeline"))) == set()


def test_published_configs_match_the_kind_schema_and_broken_imports_are_refused() -> None:
    from service.tuning.kinds import KINDS
    from service.tuning.kinds.pipeline import config_record

    kind = KINDS.get("pipeline")
    gemm = GemmShape(batch=1, m=128, n=768, k=768, dtype="float32")
    config = PipelineConfig(bm=64, bn=64, bk=16, tm=4, tn=4, smem_stages=3, async_copy=True)
    record = config_record(gemm, config, "sm_90")
    assert kind.config_format() == "pipeline-gemm"
    assert kind.check_config(record) is None
    broken = {**record, "config": {**record["config"], "smem_stages": 9}}
    problem = kind.check_config(broken)
    assert problem is not None and problem.loc == ("config", "smem_stages")
