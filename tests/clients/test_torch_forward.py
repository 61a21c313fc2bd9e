"""accelerate's whole-forward check (issue 33 item 5): per input signature, once the layers' own checks have settled,
the forward on the tables and the model's own forward alternate in blocks; the tables keep the signature only where
their forward is faster by the margin, else its forwards run as the model's own from then on. Each signature is
decided on its own; a forward whose layers all run on PyTorch is never timed."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch import nn

from kernelfleet import vendor
from kernelfleet.dispatch import DispatchTable, Interval
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import Epilogue
from kernelfleet.torch import AcceleratedLinear
from kernelfleet.torch_forward import (
    ACCELERATED,
    EAGER,
    MODEL_BLOCK,
    MODEL_CALLS,
    MODEL_SETTLE,
    MODEL_SWITCH_S,
    RECHECK_GROWTH,
    RECHECK_MIN,
    ForwardScope,
    SignatureRecord,
    input_signature,
    neighbour_decision,
)
from kernelfleet.torch_fusion import dense_layer

CHECK_FORWARDS = MODEL_SETTLE + 2 * (MODEL_CALLS // (MODEL_BLOCK - 1)) * MODEL_BLOCK  # settle + both sides' blocks


def _model(library: str, scope: ForwardScope) -> tuple[nn.Module, AcceleratedLinear]:
    """One accelerated layer whose table routes every S to `library` (numpy: a dispatcher call, as a uKernel's)."""
    linear = nn.Linear(6, 8).eval()
    dense = dense_layer(linear)
    assert dense is not None
    d = Dispatcher(DispatchTable((Interval(1, 8, None, library),), {}, Epilogue()), {}, N=8, K=6)
    layer = AcceleratedLinear("l", linear, dense, d, "w", fused_bias=False, activation=None, max_rows=8)
    layer.forward_scope = scope
    model = nn.Sequential(layer, nn.ReLU()).eval()
    scope.install(model)
    return model, layer


def _until_decided(model: nn.Module, x: torch.Tensor, scope: ForwardScope, limit: int = 50_000) -> int:
    """Forwards at `x` until the whole-forward check has chosen (each block runs MODEL_SWITCH_S before it keeps a
    forward, so a tiny model's microsecond forwards take many); how many ran."""
    n = 0
    while scope.decision((x,), {}) is None and n < limit:
        model(x)
        n += 1
    return n


def _slow(seconds: float, fn: Any) -> Any:
    def slowed(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return fn(*args, **kwargs)

    return slowed


def _losing_tables(monkeypatch: pytest.MonkeyPatch) -> tuple[ForwardScope, nn.Module, AcceleratedLinear]:
    """A one-layer model under a fresh scope whose table's calls take 4 ms more than its PyTorch ones."""
    monkeypatch.setattr(Dispatcher, "__call__", _slow(0.004, Dispatcher.__call__))
    scope = ForwardScope()
    return (scope, *_model(vendor.NUMPY, scope))


def test_a_forward_slower_on_the_tables_runs_as_the_models_own(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope, model, layer = _losing_tables(monkeypatch)
    x = torch.randn(3, 6)
    with torch.inference_mode():
        expected = torch.relu(layer._layer_in_torch(x))
        _until_decided(model, x, scope)
        calls = layer.stats.calls
        for _ in range(5):
            torch.testing.assert_close(model(x), expected)
    (decision,) = scope.decisions().values()
    assert decision["decision"] == EAGER and decision["accelerated_s"] > decision["eager_s"]
    assert layer.stats.calls == calls  # decided: the table is not called at this signature any more
    assert scope.decision((torch.empty(3, 6),), {}) == EAGER and scope.decision((torch.empty(4, 6),), {}) is None
    assert torch.get_num_threads() == 2


def test_the_calls_of_forwards_run_as_the_models_own_reach_the_dispatchers_usage_as_misses(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fleet ranks and tunes by the calls hosts report: a signature decided for the model's own forward still
    reports its layers' calls (misses, at the layer's latest PyTorch time), not silence."""
    scope, model, layer = _losing_tables(monkeypatch)
    d = layer.dispatcher
    assert isinstance(d, Dispatcher)
    x = torch.randn(3, 6)
    with torch.inference_mode():
        _until_decided(model, x, scope)
        before = d.usage(reset=True)[3]
        for _ in range(5):
            model(x)
    assert before.fallbacks > 0  # the check's own forwards were counted too
    use = d.usage()[3]
    assert use.calls == use.fallbacks == 5
    assert 0 < use.seconds < 5 * 0.004  # each at the layer's own PyTorch call in that forward: µs, not the table's


def test_a_forward_faster_on_the_tables_keeps_them(two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AcceleratedLinear, "_layer_in_torch", _slow(0.004, AcceleratedLinear._layer_in_torch))
    scope = ForwardScope()
    model, layer = _model(vendor.NUMPY, scope)
    x = torch.randn(3, 6)
    with torch.inference_mode():
        _until_decided(model, x, scope)
        calls = layer.stats.calls
        model(x)
    (decision,) = scope.decisions().values()
    assert decision["decision"] == ACCELERATED and decision["accelerated_s"] < decision["eager_s"]
    assert layer.stats.calls == calls + 1


def test_each_input_signature_is_decided_on_its_own(two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    scope, model, _ = _losing_tables(monkeypatch)
    with torch.inference_mode():
        ran = _until_decided(model, torch.randn(3, 6), scope)
        model(torch.randn(5, 6))
    decisions = scope.decisions()
    assert [d["decision"] for d in decisions.values()] == [EAGER, None]
    assert [d["forwards"] for d in decisions.values()] == [ran, 1]


def test_a_forward_all_on_pytorch_is_not_timed(two_threads: None) -> None:
    scope = ForwardScope()
    model, _ = _model(vendor.TORCH, scope)
    with torch.inference_mode():
        for _ in range(CHECK_FORWARDS):
            model(torch.randn(3, 6))
    (decision,) = scope.decisions().values()
    assert decision == {
        "forwards": CHECK_FORWARDS,
        "runs_ukernels": False,
        "decision": None,
        "accelerated_s": None,
        "eager_s": None,
        "no_ukernels": True,  # known now; a scope without the twin (own_if_no_ukernels) still runs the wrappers
        "own_forwards": 0,
        "between": None,
        "rechecks": 0,
    }


def test_one_slow_forward_at_a_switch_does_not_decide() -> None:
    """A block's first forward pays for the switch from the other side (spinning or sleeping workers): not kept."""
    record = SignatureRecord(runs_ukernels=True)
    while record.decision is None:
        mode = record.next_mode(check=True)
        position = record.forwards - MODEL_SETTLE
        first_of_block = position >= 0 and position % MODEL_BLOCK == 0
        slow = mode == ACCELERATED and first_of_block
        record.record(mode, 1.0 if slow else (0.030 if mode == ACCELERATED else 0.036), check=True)
    assert record.decision == ACCELERATED and max(record.accelerated_s) == 0.030


def _decide(seconds: Any) -> SignatureRecord:
    """A record run to its decision, each forward timed `seconds(mode, index of that side's forward)`."""
    record = SignatureRecord(runs_ukernels=True)
    done = {ACCELERATED: 0, EAGER: 0}
    while record.decision is None:
        mode = record.next_mode(check=True)
        record.record(mode, seconds(mode, done[mode]), check=True)
        done[mode] += 1
    return record


def test_clearly_slower_tables_are_dropped_after_one_block_a_side() -> None:
    """Tables 30 % behind on every forward: decided after one block per side, not after the whole check."""
    record = _decide(lambda mode, i: 0.039 if mode == ACCELERATED else 0.030)
    assert record.decision == EAGER and record.forwards == MODEL_SETTLE + 2 * MODEL_BLOCK


def test_tables_slower_by_less_than_the_early_margin_or_overlapping_take_the_whole_check() -> None:
    close = _decide(lambda mode, i: 0.0324 if mode == ACCELERATED else 0.030)  # 8 % behind: decided on medians
    assert close.decision == EAGER and close.forwards == CHECK_FORWARDS
    # one slow eager forward (kept: the second of its block) overlaps the tables' times: no early exit on one timing;
    # the whole check runs and its medians decide
    noisy = _decide(lambda mode, i: 0.039 if mode == ACCELERATED else (0.060 if i == 1 else 0.030))
    assert 0.060 in noisy.eager_s and noisy.forwards == CHECK_FORWARDS and noisy.decision == EAGER


def test_forwards_shorter_than_a_switch_are_kept_only_once_the_block_has_run_a_while() -> None:
    """Forwards of 0.1 ms (a one-layer model) run 3x slower for the first MODEL_SWITCH_S after a switch (the other
    side's workers still spinning): a block keeps none of those, so the tables' true 1.5x decides, not the switch."""
    record = SignatureRecord(runs_ukernels=True)
    since_switch, mode_before = 0.0, None
    while record.decision is None and record.forwards < 10_000:
        mode = record.next_mode(check=True)
        since_switch = 0.0 if mode != mode_before else since_switch
        steady = 0.0001 if mode == ACCELERATED else 0.00015
        seconds = steady * (3 if since_switch < MODEL_SWITCH_S and record.forwards >= MODEL_SETTLE else 1)
        record.record(mode, seconds, check=True)
        since_switch, mode_before = since_switch + seconds, mode
    assert record.decision == ACCELERATED
    assert max(record.accelerated_s) == 0.0001 and max(record.eager_s) == 0.00015


def test_a_forward_running_a_layers_in_model_check_postpones_the_whole_forward_check() -> None:
    """A forward whose layer still alternates uKernels and PyTorch (its in-model check) is no sample of the tables:
    the check starts after the next forward without one, and one in the middle of the check starts it again."""
    record = SignatureRecord(runs_ukernels=True)
    for _ in range(MODEL_SETTLE + 5):  # the layers' checks outlast the usual settling
        record.record(record.next_mode(check=True), 0.030, check=True, trials=True)
    assert record.next_mode(check=True) == ACCELERATED and record.start == MODEL_SETTLE + 6
    record.record(ACCELERATED, 0.030, check=True)  # the first forward without a trial
    assert record.next_mode(check=True) == EAGER  # the check's first block
    for _ in range(2 * MODEL_BLOCK):
        record.record(record.next_mode(check=True), 0.030, check=True)
    assert record.eager_s and record.accelerated_s
    record.record(ACCELERATED, 0.030, check=True, trials=True)  # a layer at a new route of its own: start over
    assert record.eager_s == [] and record.accelerated_s == [] and record.decision is None


def _signature(rows: int, cols: int = 6) -> tuple[Any, ...]:
    return input_signature((torch.empty(rows, cols),), {})


def _ratio(ratio: float) -> SignatureRecord:
    """A record its own check decided, the tables' forward at `ratio` × the model's own (below 1: faster)."""
    return _decide(lambda mode, i: 0.030 * ratio if mode == ACCELERATED else 0.030)


def test_a_signature_between_two_clear_decisions_alike_takes_theirs() -> None:
    """Between 4 and 6 rows, both checks won by 1.5x: 5 rows is not checked again. Disagreeing neighbours, a narrow
    win, a gap wider than NEIGHBOUR_SPAN, an unclear nearer neighbour, or a second size that differs: checked."""
    fast, slow, narrow = _ratio(1 / 1.5), _ratio(1.5), _ratio(1 / 1.04)
    assert fast.decision == ACCELERATED and slow.decision == EAGER and narrow.decision == ACCELERATED
    decided = {_signature(4): fast, _signature(6): _ratio(1 / 1.5)}
    assert neighbour_decision(_signature(5), decided) == (ACCELERATED, _signature(4), _signature(6))
    assert neighbour_decision(_signature(5), {_signature(4): slow, _signature(6): _ratio(1.5)})[0] == EAGER  # type: ignore[index]
    assert neighbour_decision(_signature(7), decided) is None  # outside the pair
    assert neighbour_decision(_signature(5, 7), decided) is None  # another size differs too
    assert neighbour_decision(_signature(5), {_signature(4): fast, _signature(6): slow}) is None
    assert neighbour_decision(_signature(5), {_signature(4): fast, _signature(6): narrow}) is None
    assert neighbour_decision(_signature(5), {_signature(2): fast, _signature(6): fast}) is None  # 3x apart
    nearer_unclear = {_signature(3): fast, _signature(4): narrow, _signature(6): fast}
    assert neighbour_decision(_signature(5), nearer_unclear) is None
    taken = SignatureRecord(decision=ACCELERATED, between=(_signature(4), _signature(6)))
    assert neighbour_decision(_signature(7), {_signature(6): fast, _signature(8): taken}) is None  # not an anchor


def test_a_forward_between_decided_signatures_skips_its_check(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the scope: 3 and 5 rows checked (the tables 4 ms slower: the model's own forward), then 4 rows takes
    that choice when its check is due, right after the layers' own checks, with no forward of the check's blocks."""
    scope, model, _ = _losing_tables(monkeypatch)
    with torch.inference_mode():
        for rows in (3, 5):
            _until_decided(model, torch.randn(rows, 6), scope)
        ran = _until_decided(model, torch.randn(4, 6), scope)
    record = scope.decisions()[repr(_signature(4))]
    assert record["decision"] == EAGER and record["between"] == [repr(_signature(3)), repr(_signature(5))]
    assert ran == MODEL_SETTLE + 1 and record["eager_s"] is None
    # its settling forwards as the model's own (both checks chose it) but the last, which learns on the tables; then
    # the decided one
    assert record["own_forwards"] == MODEL_SETTLE


def test_once_every_checked_signature_chose_the_models_own_forward_new_ones_settle_on_it(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables that lost at 3 and 4 rows: 7 rows (no neighbour on its far side) settles as the model's own forward but
    for its last settling forward, which learns the layers' calls on the tables; its own check still runs when due."""
    scope, model, layer = _losing_tables(monkeypatch)
    with torch.inference_mode():
        _until_decided(model, torch.randn(3, 6), scope)
        assert not scope.leans_eager()  # one signature is not a lean
        _until_decided(model, torch.randn(4, 6), scope)
        assert scope.leans_eager()
        calls = layer.stats.calls
        for _ in range(MODEL_SETTLE - 1):
            model(torch.randn(7, 6))
        record = scope.decisions()[repr(_signature(7))]
        assert record["decision"] is None and record["own_forwards"] == MODEL_SETTLE - 1
        assert layer.stats.calls == calls  # a signature seen fewer times than that never ran on the tables
        model(torch.randn(7, 6))
        assert layer.stats.calls == calls + 1  # the last settling forward learnt the layers' calls on them
        _until_decided(model, torch.randn(7, 6), scope)
    record = scope.decisions()[repr(_signature(7))]
    assert record["decision"] == EAGER and record["accelerated_s"] is not None and record["between"] is None


def test_tables_faster_at_any_checked_signature_end_the_lean(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the tables won their checks, new signatures settle on them, as before; one such signature among
    signatures that chose the model's own forward ends the lean too."""
    monkeypatch.setattr(AcceleratedLinear, "_layer_in_torch", _slow(0.004, AcceleratedLinear._layer_in_torch))
    scope = ForwardScope()
    model, layer = _model(vendor.NUMPY, scope)
    with torch.inference_mode():
        for rows in (3, 4):
            _until_decided(model, torch.randn(rows, 6), scope)
        assert not scope.leans_eager()
        calls = layer.stats.calls
        for _ in range(MODEL_SETTLE):
            model(torch.randn(7, 6))
    assert layer.stats.calls == calls + MODEL_SETTLE
    assert scope.decisions()[repr(_signature(7))]["own_forwards"] == 0
    mixed = ForwardScope()
    mixed._records.update({_signature(3): _ratio(1.5), _signature(5): _ratio(1.5)})
    assert mixed.leans_eager()
    mixed._leans_eager = None  # (a decision in exit() clears it: here the records are set by hand)
    mixed._records[_signature(8)] = _ratio(1 / 1.5)
    assert not mixed.leans_eager()
    taken = ForwardScope()  # decisions taken from neighbours are no evidence of their own
    taken._records.update(
        {
            _signature(3): _ratio(1.5),
            _signature(4): SignatureRecord(decision=EAGER, between=(_signature(3), _signature(5))),
        }
    )
    assert not taken.leans_eager()


def _run_until(record: SignatureRecord, forwards: int, seconds: Any) -> None:
    """Forwards on whichever side the record asks for, each timed `seconds(mode)`, until it has run `forwards`."""
    while record.forwards < forwards:
        mode = record.next_mode(check=True)
        record.record(mode, seconds(mode), check=True)


def test_a_decision_made_on_a_disturbed_check_is_checked_again_and_corrected() -> None:
    """A check that kept the tables while something slowed the model's own forward (1.5x) is checked again once the
    signature has run RECHECK_GROWTH times its forwards (RECHECK_MIN at least): the tables, 30 % slower in truth,
    are dropped then, and the new decision is revisited later still."""
    record = _decide(lambda mode, i: 0.030 if mode == ACCELERATED else 0.045)  # the disturbed check
    assert record.decision == ACCELERATED and record.rechecks == 0
    decided_at = record.forwards
    recheck_at = max(RECHECK_MIN, decided_at * RECHECK_GROWTH)
    truth = {ACCELERATED: 0.039, EAGER: 0.030}.__getitem__
    _run_until(record, recheck_at - 1, truth)
    assert record.decision == ACCELERATED and record.eager_s  # not before its time; the old samples stand
    _run_until(record, recheck_at, truth)
    assert record.decision is None and record.rechecks == 1 and not record.eager_s  # the recheck starts afresh
    assert record.next_mode(check=True) == EAGER  # its first block, at the very next forward (no settling again)
    while record.decision is None:
        record.record(record.next_mode(check=True), truth(record.next_mode(check=True)), check=True)
    assert record.decision == EAGER and record.forwards == recheck_at + 2 * MODEL_BLOCK  # clearly slower: early exit
    assert record.recheck_at == record.forwards * RECHECK_GROWTH
    assert record.as_dict()["rechecks"] == 1


def test_a_decision_taken_from_neighbours_is_checked_on_its_own_later() -> None:
    """A signature that took its neighbours' choice gets a check of its own once it has run RECHECK_MIN forwards;
    decisions that are not timings (no forward ran a table) are never reopened."""
    taken = SignatureRecord(runs_ukernels=True, forwards=MODEL_SETTLE, layer_calls=())
    taken.decide(ACCELERATED, (_signature(4), _signature(6)))
    _run_until(taken, RECHECK_MIN, lambda mode: 0.030)
    assert taken.decision is None and taken.between is None and taken.rechecks == 1
    assert not taken.check_due(check=True)  # a recheck is not answered by the neighbours again
    assert taken.next_mode(check=True) == EAGER
    untimed = SignatureRecord(runs_ukernels=True)
    _run_until(untimed, MODEL_SETTLE + 1, lambda mode: 0.030)
    untimed.record(ACCELERATED, 0.030, check=True, ran_table=False)  # every layer's calls went to PyTorch
    assert untimed.decision == EAGER and untimed.recheck_at is None
    _run_until(untimed, 20 * RECHECK_MIN, lambda mode: 0.030)
    assert untimed.decision == EAGER and untimed.rechecks == 0
