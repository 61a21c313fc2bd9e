"""What an accelerated forward decides as a whole: PyTorch's thread count during it, and whether, for inputs of one
shape, it runs on the tables at all (issue 33 items 3 and 5).

Threads. PyTorch's CPU ops run on libgomp, whose idle workers busy-wait after every parallel region (with the
default wait policy, for milliseconds). A uKernel that then needs the core such a worker spins on waits for the
scheduler: a BERT FFN-up uKernel at M = 8 took 2.6 ms in a 2-thread forward against 0.22 ms alone (Intel Xeon,
2 cores, 2026-11-28). So while a forward runs uKernels, every PyTorch op in it — the model's own and the layers
its tables route to PyTorch — runs on one thread; the caller's count is back when the outermost forward returns.
Which forwards run uKernels is learnt per input signature (the shapes of the tensors passed): the first forward at
a signature narrows at its first uKernel, later ones at their start, before any PyTorch op has woken a worker.

The whole-forward check. Each layer's uKernels were checked against its PyTorch computation inside the model
(`AcceleratedLinear`, `check_in_model`), but what the caller sees is the forward: one thread for PyTorch's ops
and the mix of libraries change it as a whole. So per input signature, once the layers' own checks have settled,
the forward on the tables and the model's own forward (every layer on PyTorch, the caller's threads, nothing
narrowed) alternate in blocks of MODEL_BLOCK forwards, the first of each block not kept (it pays for the
switch), until each side has MODEL_CALLS; the tables keep that signature only if their median is
MODEL_MARGIN faster, else its forwards run as the model's own from then on. Tables that are clearly slower stop the
check early: once each side has one block kept, every tables forward slower than every eager one by
MODEL_EARLY_MARGIN decides for the model's own forward (the check's tables blocks are what it costs the caller);
tables clearly faster stop it too, on a little more evidence: once each side has EARLY_KEEP_BLOCKS blocks kept, every
tables forward faster than every eager one by MODEL_EARLY_MARGIN keeps the tables (the check's eager blocks are
what it costs the caller there). `decisions()` says which and why.

Signatures between decided ones. A server whose sequence lengths vary sees hundreds of signatures, and each check
costs about 2 × MODEL_CALLS forwards half of which run the model's own forward. A signature whose check is due
takes its neighbours' decision without one when it lies between two signatures that differ from it in a single
size (the same tensors, every other dimension equal), at most NEIGHBOUR_SPAN times apart, whose checks both chose
the same side by at least NEIGHBOUR_MARGIN (medians; the rule and its constants are the layers' check's:
kernelfleet.in_model_check's `clear_choice` and `between_choice`): a forward whose sizes lie between two clear
decisions of the same kind is not measured again. Anything less clear (the sides disagree, a narrow win, a wide
gap, a signature outside every pair) is checked on its own, as before; `decisions()` names the pair a choice was
taken from.

A model whose tables lose. Before its check is due, a signature's forwards settle on the tables: on a machine where
the tables lose the whole forward (an Intel Xeon VM at 2 threads, where MKL's float32 GEMMs match the uKernels and
the rest of the forward runs on one thread), a server whose lengths vary runs most of its requests at signatures
seen too few times to be checked, so it ran 0.80x eager over `bench/shape_stream.py`'s stream. So once
LEAN_SIGNATURES signatures have been decided by their own checks and every one chose the model's own forward, a new
signature's settling forwards run as the model's own, but for the last one, which runs on the tables to learn the
layers' calls and whether any runs a uKernel; its check still runs when due, so a signature where the tables do win
keeps them. One signature whose check kept the tables ends the lean. (A signature seen fewer than MODEL_SETTLE times
under the lean never learns its layers' calls, so its forwards add nothing to the dispatchers' usage below.)

Decisions revisited. A check's half second of forwards can be tilted by something passing (a process busy while it
ran: in one bench run, right after the bench's own tuning, the tables kept a seq-1 Llama forward that then ran 0.79x
eager; the same check chose the model's own forward in every rerun), and a host's load changes over a server's life.
So a signature decided by timings, its own check's or its neighbours', is checked again, by a check of its own, once
it has run RECHECK_GROWTH times the forwards it had when decided (at least RECHECK_MIN): after some 500, 8,000 and
130,000 forwards, each recheck costing half of one check's forwards on the slower side, so the cost shrinks
geometrically while a wrong choice lasts a few hundred forwards instead of the process's life.

The model's own forward. Where `accelerate` built the twin of the original module tree (kernelfleet.torch_twin),
"the model's own" is that twin: the check's EAGER blocks, a signature it decided EAGER, and (`own_if_no_ukernels`)
a signature whose first forward ran no uKernel at all — every layer routed to PyTorch by its table (with no S
left to check on uKernels) or its in-model check, past the table's range, or without a table: what the layers do at
a signature depends on its shapes only, so the forwards after it would run PyTorch through the wrappers for nothing.
A forward whose layers fell back for the call itself (another dtype or device, autograd recording) teaches nothing:
the same shapes in inference mode may run uKernels. Without a twin, such forwards run every layer's PyTorch
computation through its wrapper.

Telemetry. A forward run as the model's own calls no wrapper, yet the fleet needs its calls: they are the volume
per shape it ranks and tunes by (and, without them, a model whose every forward runs as its own looks silent).
So each signature's first forward notes the (layer, S) calls it makes, and every forward run as the model's own
adds those calls to the layers' dispatchers' usage as misses (no table ran them: the fleet's measured saving counts
none for them, service.workers.fleet.savings), each at the layer's latest measured PyTorch time at S (scaled down
where they add up to more than the forward took: a first call at a shape runs cold): counted calls, not samples
(the holdout takes none from them).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# the signatures around a new one decide for it on the same terms as the S around a new S in the layers' check
from kernelfleet.in_model_check import between_choice, clear_choice

MODEL_SETTLE = 10  # forwards at a signature before its timing starts (later while a forward still runs an in-model
# check call: `record(trials=True)` postpones it; timing half-PyTorch trial forwards chose eager). The layers' checks
# settle in one or two forwards now that a table's layers pool their samples (kernelfleet.in_model_check), so these
# forwards run on the tables; 3 started the check sooner and, on a stream of varying lengths (bench/shape_stream.py),
# ran more forwards as the model's own at shapes seen a few times only (218 and 222 of 600 against 110 and 61 with 10)
MODEL_BLOCK = 3  # the check runs each side in blocks of this many forwards and keeps all but each block's first
# ... and none of a block's forwards until the block has run this long. After an eager forward at 2 threads, a
# one-layer model's tables forward (190 µs steady) ran 340-4,000 µs for the next 5-50 ms on the AMD EPYC VM (ad hoc
# probes): 2 ms blocks still timed it at 2.1 ms and chose eager, 20 ms blocks at 0.18 ms (eager 0.38) — but 20 ms
# kept GPT-2's decode steps (a new signature per step, ~2 ms forwards) checking through a whole bench run, 1.67x
# eager -> 0.98x. Forwards of 2 ms or more keep the rule "all but the block's first".
MODEL_SWITCH_S = 0.002
MODEL_CALLS = 8  # forwards kept per side (four blocks each); medians of 4 once kept eager where the tables won 1.15x
MODEL_MARGIN = 0.03  # how much faster the tables' forward must be to keep them
# early exit: once each side has a block's kept forwards, tables whose every forward is this much slower than every
# eager one are dropped then (at 2 threads they often run 1.3x behind: the rest of the check only cost the caller)
MODEL_EARLY_MARGIN = 0.15
# ... and tables whose every forward is that much faster than every eager one, over two blocks a side, are kept then
EARLY_KEEP_BLOCKS = 2
RECHECK_GROWTH = 16  # a timed decision is checked again at this many times the forwards it was made at ...
RECHECK_MIN = 256  # ... and no sooner than this many forwards at its signature
LEAN_SIGNATURES = 2  # own checks that all chose the model's own forward before new signatures settle on it
MAX_SIGNATURES = 256  # signatures remembered; a forward at another one runs on the tables unchecked
ACCELERATED, EAGER = "accelerated", "eager"
_now = time.perf_counter

Signature = tuple[Any, ...]


def input_signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Signature:
    """The shapes of the tensors a forward is called with (other arguments: their type only)."""
    return (
        tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args),
        tuple(sorted((k, tuple(v.shape)) for k, v in kwargs.items() if isinstance(v, torch.Tensor))),
    )


@dataclass
class SignatureRecord:
    """What the forwards at one input signature did: run uKernels, and how the two sides timed."""

    forwards: int = 0
    runs_ukernels: bool = False
    accelerated_s: list[float] = field(default_factory=list)
    eager_s: list[float] = field(default_factory=list)
    decision: str | None = None  # ACCELERATED or EAGER, once the check is done
    no_ukernels: bool = False  # a forward here ran no uKernel, for its shapes alone (its calls fell back for none)
    own_forwards: int = 0  # forwards run as the model's own (the check's EAGER side, its EAGER choice, no uKernels)
    start: int = MODEL_SETTLE  # the forward the check's blocks start at: after the layers' own checks are done
    block_mode: str = EAGER  # the side the check's current block runs
    block_s: float = 0.0  # seconds the current block's forwards have run
    block_kept: int = 0  # forwards the current block has kept
    layer_calls: tuple[tuple[Any, int], ...] | None = None  # (AcceleratedLinear, S) its first forward called
    own_usage: list[tuple[Any, int, tuple[Any, ...]]] | None = None  # (dispatcher, S, its layers' calls): own_calls
    between: tuple[Signature, Signature] | None = None  # the decided signatures its decision was taken from
    recheck_at: int | None = None  # the forward at which a decision made on timings is checked again
    rechecks: int = 0  # how many times it was

    @property
    def checked(self) -> bool:
        """Decided by its own check's timings (not taken from neighbours, not for running no table)."""
        return self.decision is not None and self.between is None and bool(self.accelerated_s and self.eager_s)

    @property
    def clear_decision(self) -> str | None:
        """The check's own choice where it won by NEIGHBOUR_MARGIN (medians of both sides), else None."""
        if not self.checked or self.decision is None:
            return None
        ours, theirs = statistics.median(self.accelerated_s), statistics.median(self.eager_s)
        return clear_choice(self.decision, ours, theirs, ACCELERATED)

    def decide(self, choice: str, between: tuple[Signature, Signature] | None = None) -> None:
        """A decision on timings (the check's, or its neighbours' checks' when `between` names them): revisited at
        `recheck_at` forwards."""
        self.decision, self.between = choice, between
        self.recheck_at = max(RECHECK_MIN, self.forwards * RECHECK_GROWTH)

    def reopen(self) -> None:
        """Check the decision again from the next forward on: a check of its own, the layers' calls already known."""
        self.decision = self.between = self.recheck_at = None
        self.rechecks += 1
        self.restart_check(self.forwards)

    def restart_check(self, start: int) -> None:
        """The check from its first block again, at forward `start`: no samples, the EAGER side first."""
        self.start = start
        self.accelerated_s.clear()
        self.eager_s.clear()
        self.block_mode, self.block_s, self.block_kept = EAGER, 0.0, 0

    def check_due(self, check: bool) -> bool:
        """The whole-forward check would run its first block at the next forward (its first check: a recheck is
        never taken from neighbours)."""
        return (
            check
            and not self.rechecks
            and self.decision is None
            and self.runs_ukernels
            and not self.no_ukernels
            and self.forwards >= self.start
            and not self.accelerated_s
            and not self.eager_s
            and self.block_s == 0.0
        )

    def own_calls(self) -> list[tuple[Any, int, int, float]]:
        """The dispatchers' usage one forward run as the model's own adds: its layers' calls (as the first forward
        at this signature made them) summed per (dispatcher, S) — (dispatcher, S, calls, seconds) —, each at the
        layer's latest PyTorch time at S."""
        if self.own_usage is None:
            groups: dict[tuple[int, int], tuple[Any, list[Any]]] = {}
            for layer, S in self.layer_calls or ():
                d = layer.own_call(S)
                if d is not None:
                    groups.setdefault((id(d), S), (d, []))[1].append(layer)
            self.own_usage = [(d, S, tuple(layers)) for (_, S), (d, layers) in groups.items()]
        return [(d, S, len(ls), sum(x.torch_seconds(S) for x in ls)) for d, S, ls in self.own_usage]

    def next_mode(self, check: bool, own_if_no_ukernels: bool = False, leans_eager: bool = False) -> str:
        """The side the next forward runs (`leans_eager`: the model's decided signatures all chose EAGER)."""
        if self.decision is not None:
            return self.decision
        if own_if_no_ukernels and self.no_ukernels:
            return EAGER  # nothing to compare: the model's own forward, not the wrappers on PyTorch
        if check and leans_eager and self.layer_calls is None and self.forwards < self.start - 1:
            return EAGER  # the tables lost everywhere: the forward that learns the layers' calls comes just before
            # the check, so a signature seen fewer times than that never runs on them
        if not check or not self.runs_ukernels:
            return ACCELERATED  # nothing to compare (all on PyTorch)
        if self.forwards < self.start:
            # the layers' own checks still settling; where the tables lost at every signature checked, they settle
            # during the check's own blocks and the forwards until then run as the model's own
            return EAGER if leans_eager and self.layer_calls is not None else ACCELERATED
        return self.block_mode

    def record(self, mode: str, seconds: float, check: bool, trials: bool = False, ran_table: bool = True) -> None:
        """Count a forward (`trials`: one of its layers ran an in-model check call, half of which run PyTorch;
        `ran_table`: one of its layers called a dispatcher)."""
        if trials and self.decision is None:
            # not a forward the tables will run: the check starts (again) after the next forward without one
            self.restart_check(max(self.start, self.forwards + 2))
        position = self.forwards - self.start
        timed = check and self.decision is None and self.runs_ukernels and position >= 0
        self.forwards += 1
        if check and self.recheck_at is not None and self.forwards >= self.recheck_at:
            self.reopen()
        if not timed:
            return
        if mode == ACCELERATED and not ran_table:
            # the layers' own checks sent every call at these shapes to PyTorch: the tables run nothing here, so the
            # model's own forward (the twin) runs them, without the wrappers
            self.decision = EAGER
            return
        # a block's first forward follows the other side's and pays for it (libgomp workers a 2-thread eager
        # forward left spinning, TVM workers asleep), and so do the next ones until MODEL_SWITCH_S has passed:
        # steady state is what the caller runs, so they are not kept
        settled = self.block_s >= MODEL_SWITCH_S  # (never for the block's first forward)
        self.block_s += seconds
        if not settled:
            return
        (self.eager_s if mode == EAGER else self.accelerated_s).append(seconds)
        kept = MODEL_BLOCK - 1
        self.block_kept += 1
        if self.block_kept >= kept:  # the block is done: the other side runs the next one
            self.block_mode = ACCELERATED if self.block_mode == EAGER else EAGER
            self.block_s, self.block_kept = 0.0, 0
        if (
            len(self.eager_s) >= kept
            and len(self.accelerated_s) >= kept
            and min(self.accelerated_s) > max(self.eager_s) * (1 + MODEL_EARLY_MARGIN)
        ):
            self.decide(EAGER)  # clearly slower: no overlap, by a margin five times the keeping one
            return
        if min(len(self.eager_s), len(self.accelerated_s)) >= EARLY_KEEP_BLOCKS * kept and max(self.accelerated_s) * (
            1 + MODEL_EARLY_MARGIN
        ) < min(self.eager_s):
            self.decide(ACCELERATED)  # clearly faster on every forward of two blocks a side: no more own forwards
            return
        if len(self.eager_s) >= MODEL_CALLS and len(self.accelerated_s) >= MODEL_CALLS:
            ours, theirs = statistics.median(self.accelerated_s), statistics.median(self.eager_s)
            self.decide(ACCELERATED if ours * (1 + MODEL_MARGIN) < theirs else EAGER)

    def as_dict(self) -> dict[str, Any]:
        median = statistics.median
        return {
            "forwards": self.forwards,
            "runs_ukernels": self.runs_ukernels,
            "decision": self.decision,
            "accelerated_s": median(self.accelerated_s) if self.accelerated_s else None,
            "eager_s": median(self.eager_s) if self.eager_s else None,
            "no_ukernels": self.no_ukernels,
            "own_forwards": self.own_forwards,
            "between": [repr(sig) for sig in self.between] if self.between else None,
            "rechecks": self.rechecks,
        }


def _layout_and_sizes(signature: Signature) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """What two neighbouring signatures share (each argument's rank or type, the keywords' names and ranks) and
    every size of the signature in order."""
    args, kwargs = signature
    entries = [*args, *(shape for _, shape in kwargs)]
    layout = (tuple(len(e) if isinstance(e, tuple) else e for e in entries), tuple(name for name, _ in kwargs))
    return layout, tuple(size for e in entries if isinstance(e, tuple) for size in e)


def neighbour_decision(
    signature: Signature, decided: dict[Signature, SignatureRecord]
) -> tuple[str, Signature, Signature] | None:
    """The side two decided signatures around `signature` both chose clearly, and which two (see the module's
    docstring), or None."""
    layout, sizes = _layout_and_sizes(signature)
    # differing position → the nearest smaller (larger) signature its own check decided, and its clear choice
    below: dict[int, tuple[int, Signature, str | None]] = {}
    above: dict[int, tuple[int, Signature, str | None]] = {}
    for other, record in decided.items():
        if not record.checked:
            continue
        other_layout, other_sizes = _layout_and_sizes(other)
        if other_layout != layout:
            continue
        differ = [i for i, (a, b) in enumerate(zip(sizes, other_sizes, strict=True)) if a != b]
        if len(differ) != 1:
            continue
        i = differ[0]
        size = other_sizes[i]
        side = below if size < sizes[i] else above
        if i not in side or abs(size - sizes[i]) < abs(side[i][0] - sizes[i]):
            side[i] = (size, other, record.clear_decision)
    for i in sorted(set(below) & set(above)):
        (lo, lo_sig, lo_choice), (hi, hi_sig, hi_choice) = below[i], above[i]
        choice = between_choice(lo, lo_choice, hi, hi_choice)
        if choice is not None:
            return choice, lo_sig, hi_sig
    return None


class ForwardScope:
    """Installed by `accelerate` as forward hooks on the accelerated root; the layers ask it `bypass` (run as the
    model's own) and call `narrow()` before a uKernel. `narrow_threads`: thread_policy="managed"; `check`: the
    whole-forward check (check_in_model); `own_if_no_ukernels`: a signature known to run no uKernel runs as the
    model's own (set by accelerate where it built the twin). One forward at a time is assumed: PyTorch's thread count
    is process-wide."""

    def __init__(self, *, narrow_threads: bool = True, check: bool = True, own_if_no_ukernels: bool = False) -> None:
        self.narrow_threads = narrow_threads
        self.check = check
        self.own_if_no_ukernels = own_if_no_ukernels
        self.call_fallback = False  # a layer of this forward fell back for the call itself (dtype, device, autograd)
        self.trial_call = False  # a layer of this forward ran an in-model check call (kernelfleet.torch)
        self.ran_table = False  # a layer of this forward called its dispatcher (kernelfleet.torch)
        self.learning: list[tuple[Any, int]] | None = None  # a signature's first forward: its layers' calls
        self._lock = threading.Lock()
        self._depth = 0
        self._saved = 0
        self.narrowed = False
        self.runs_ukernels = False  # this forward has run (or, by its signature, will run) a uKernel
        self.bypass = False  # this forward runs as the model's own: every layer on PyTorch, nothing narrowed
        self._records: dict[Signature, SignatureRecord] = {}
        self._current: SignatureRecord | None = None
        self._mode = ACCELERATED
        self._started = 0.0
        self._leans_eager: bool | None = None  # leans_eager(), until a signature's check decides

    def __getstate__(self) -> dict[str, Any]:  # copies of an accelerated model (deepcopy) get a lock of their own
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def enter(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with self._lock:
            self._depth += 1
            if self._depth > 1:
                return
            self._saved = torch.get_num_threads()
            self.narrowed = False
            signature = input_signature(args, kwargs)
            record = self._records.get(signature)
            if record is None and len(self._records) < MAX_SIGNATURES:
                record = self._records[signature] = SignatureRecord()
            self._current = record
            self.call_fallback = self.trial_call = self.ran_table = False
            if record is not None and record.check_due(self.check):
                taken = neighbour_decision(signature, self._records)
                if taken is not None:
                    choice, low, high = taken
                    record.decide(choice, (low, high))
            own = self.own_if_no_ukernels
            lean = record is not None and record.decision is None and self.leans_eager()
            self._mode = record.next_mode(self.check, own, lean) if record is not None else ACCELERATED
            self.bypass = self._mode == EAGER
            learn = record is not None and record.layer_calls is None and not self.bypass
            self.learning = [] if learn else None
            self.runs_ukernels = not self.bypass and record is not None and record.runs_ukernels
            if self.runs_ukernels:
                self._narrow_locked()  # before the forward's first PyTorch op can wake a libgomp worker
            self._started = _now()

    def narrow(self) -> None:
        """A uKernel is about to run: PyTorch goes to one thread for the rest of the forward."""
        with self._lock:
            if self._depth:
                self.runs_ukernels = True
                if self._current is not None:
                    self._current.runs_ukernels = True
            self._narrow_locked()

    def _narrow_locked(self) -> None:
        if self.narrow_threads and self._depth and not self.narrowed and self._saved > 1:
            torch.set_num_threads(1)
            self.narrowed = True

    def exit(self, module: nn.Module, args: Any, output: Any) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth:
                return
            seconds = _now() - self._started
            if self.narrowed:
                torch.set_num_threads(self._saved)
                self.narrowed = False
            record = self._current
            learned, self.learning = self.learning, None
            if record is not None:
                if learned is not None and not self.call_fallback and output is not None:
                    record.layer_calls = tuple(learned)
                if self._mode == EAGER:
                    record.own_forwards += 1
                    own = record.own_calls()
                    # a layer's latest PyTorch time may be its first, cold call: the forward's layers cannot have
                    # taken longer than the forward itself
                    scale = min(1.0, seconds / max(1e-12, sum(layer_s for _, _, _, layer_s in own)))
                    for d, S, calls, layer_s in own:
                        d.record_elsewhere(S, calls, layer_s * scale)  # the fleet sees the calls the host ran
                elif (
                    not self.runs_ukernels
                    and not record.runs_ukernels
                    and not self.call_fallback
                    and not self.trial_call  # a layer's S is still to be checked on uKernels
                    and output is not None  # (None: the forward raised; always_call hooks still run)
                ):
                    record.no_ukernels = True
                decided = record.decision
                record.record(self._mode, seconds, self.check, self.trial_call, self.ran_table)
                if record.decision != decided:
                    self._leans_eager = None
            self._current, self.bypass, self.runs_ukernels = None, False, False

    def leans_eager(self) -> bool:
        """LEAN_SIGNATURES or more signatures decided by their own checks, and every one chose the model's own
        forward (see the module's docstring)."""
        if self._leans_eager is None:
            choices = [record.decision for record in self._records.values() if record.checked]
            self._leans_eager = len(choices) >= LEAN_SIGNATURES and all(c == EAGER for c in choices)
        return self._leans_eager

    def install(self, root: nn.Module) -> list[Any]:
        return [
            root.register_forward_pre_hook(self.enter, with_kwargs=True),
            root.register_forward_hook(self.exit, always_call=True),
        ]

    def decision(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """What the check chose for forwards called with these arguments' shapes (None: not decided yet)."""
        record = self._records.get(input_signature(args, kwargs))
        return record.decision if record is not None else None

    def decisions(self) -> dict[str, dict[str, Any]]:
        """Per input signature seen (its repr): forwards, whether they run uKernels, the check's medians, the choice."""
        return {repr(sig): record.as_dict() for sig, record in self._records.items()}
