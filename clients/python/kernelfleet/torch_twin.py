"""The model's own forward inside an accelerated model: a structural twin of the module tree as it was before
`accelerate` replaced anything (issue 33 round 2).

Why. A forward that `ForwardScope` runs as the model's own (the whole-forward check chose, or times, EAGER for its
input signature; or the signature is known to run no uKernel at all) used to go through everything `accelerate`
put in: each `AcceleratedLinear` with its bypass test, the torch.fx-rewritten parents of gated MLPs with their
stacked gate/up GEMM and separate GLU, the `nn.Identity` left where a fused activation was. Every layer ran on
PyTorch, yet the accelerated model measured 3–6 % slower than the user's own (Intel Xeon, 2-layer BERT at seq 1).
Such forwards now run the twin: the original classes and forwards, nothing in between, the original's output bit
for bit. (Measured since, the path it replaces cost ≤ 0.05 ms of a 7 ms forward, inside the noise: docs/results.md,
"Issue 33, round 2".)

What the twin is. Modules whose subtree `accelerate` left alone are the accelerated model's own objects (shared,
not copied). A replaced layer or activation is the original object (the `nn.Linear`, the GELU). A module above a
replacement is a shallow copy of it with its own child table (`_modules`), everything else shared with the
original — its `_parameters` and `_buffers` dicts too; a gated MLP's parent is its original object with its
original child table. So the twin holds no tensor of its own: every parameter and buffer is the accelerated
model's object, and the dicts holding them are the accelerated model's dicts, so `Module._apply` (`.to()`,
`.half()`, which reassign buffers in those dicts), `load_state_dict` (in place, or `assign=True`) and in-place
edits are seen without a resync. A replaced layer's parameters dict is the wrapper's (same keys), and the wrapper
takes the original layer's hook dicts, so hooks registered on either run on both paths (an activation's hooks run
in the twin only: where it is fused, nothing calls it in the accelerated forward). Gate and up projections
stay the accelerated model's modules: their weights are views of the stacked weight in both.

What is not shared: `training`, a plain attribute of each copied module (and of an original layer other than
`nn.Linear` that the accelerated tree no longer holds). Copying those flags at every forward would cost ~50 ns a
module (4 µs for BERT-base's 76 on the Intel VM), so each counterpart in the accelerated tree gets an instance
attribute `train` (`_Train`: `Module.train`, then the twin marked stale) and the twin copies the flags at its next
forward only when marked. `.train()`/`.eval()` on the accelerated model or on any module of it reach the twin:
`Module.train` recurses through the children's `train`, and every module above a followed one is followed. Not seen:
`module.training = False` assigned directly. Not followed either: a module tree edited after `accelerate` (a
submodule replaced in the accelerated model: the twin keeps the old one), and plain attributes set later on a module
above a replacement (e.g. a flag set on the encoder). Accelerate again after such edits.

The twin is not registered anywhere: it is held by `OwnForward`, an instance attribute `forward` of the accelerated
root (so `module(x)` on an accelerated root given with `inplace=True` selects it too), and never appears in
`state_dict()`, `parameters()` or `named_modules()`. Copies of the accelerated model (deepcopy) copy it with the
rest: the copy module's memo keeps every object shared that was shared (kernelfleet.torch's
`GatedLinearUnit.__setstate__` makes a copy's gate and up views of the copy's stacked weight again).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from kernelfleet.torch_forward import ForwardScope

# Whether accelerate builds the twin (read on each call): False only to measure what it gains (bench/own_forward.py);
# forwards run as the model's own then go through the wrappers on PyTorch, as before.
BUILD_TWIN = True

# the hooks a replaced module hands to its replacement (the same dicts: registered on either, they run on both paths)
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_pre_hooks",
    "_backward_hooks",
)


class Snapshot:
    """Every module's child table as it was before `accelerate` changed any (taken first thing)."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self.children: dict[int, tuple[nn.Module, dict[str, nn.Module | None]]] = {
            id(m): (m, dict(m._modules)) for m in root.modules()
        }


@dataclass
class Twin:
    """The twin's root and the modules whose `training` flag it copies: `accelerated[i]`'s into `own[i]`."""

    root: nn.Module
    accelerated: list[nn.Module] = field(default_factory=list)
    own: list[nn.Module] = field(default_factory=list)
    stale: bool = True  # a followed module's `train` ran since the flags were copied

    def follow(self, accelerated: nn.Module, own: nn.Module) -> None:
        self.accelerated.append(accelerated)
        self.own.append(own)

    def watch(self) -> None:
        """Each followed module's `train` marks the twin stale (see the module docstring)."""
        for module in self.accelerated:
            module.__dict__["train"] = _Train(module, self)

    def sync_flags(self) -> None:
        self.stale = False
        for acc, own in zip(self.accelerated, self.own, strict=True):
            own.__dict__["training"] = acc.__dict__["training"]


class _Train:
    """A followed module's `train` (an instance attribute: `Module.train`, `eval` and the recursion from a parent
    find it first): its class's `train`, and the twin marked stale."""

    __slots__ = ("module", "twin")

    def __init__(self, module: nn.Module, twin: Twin) -> None:
        self.module, self.twin = module, twin

    def __call__(self, mode: bool = True) -> nn.Module:
        self.twin.stale = True
        return type(self.module).train(self.module, mode)


def build_twin(snapshot: Snapshot, accelerated: nn.Module) -> Twin:
    """The twin of `snapshot`'s tree as it was, sharing with `accelerated` (the tree after `accelerate`) every
    module it left alone and every parameter and buffer (see the module docstring)."""
    memo: dict[int, nn.Module] = {}
    twin = Twin(snapshot.root)
    reachable = {id(m) for m in accelerated.modules()}

    def twin_of(orig: nn.Module, acc: nn.Module | None) -> nn.Module:
        done = memo.get(id(orig))
        if done is not None:  # a module reachable twice stays one module
            return done
        _, kids = snapshot.children[id(orig)]
        acc_kids = acc._modules if acc is not None else {}
        new: dict[str, nn.Module | None] = {
            name: None if child is None else twin_of(child, acc_kids.get(name)) for name, child in kids.items()
        }
        same_kids = all(new[name] is child for name, child in kids.items())
        if acc is orig and same_kids and acc._modules == kids:
            result = orig  # nothing below changed: the accelerated model's own module
        elif acc is not None and acc is not orig and not kids:
            result = orig  # a replaced layer or activation: the original module
            _share_with_replacement(orig, acc)
            if type(orig) is not nn.Linear and id(orig) not in reachable:  # (nn.Linear's forward never reads it;
                twin.follow(acc, orig)  # a fused activation stays in the wrapper, where .eval() reaches it)
        else:
            if acc is orig:  # above a replacement: a copy with its own child table, the rest shared
                result = copy.copy(orig)
            else:  # a rewritten parent (gated MLP): the original object, its children as they were
                result = orig
                if acc is not None:
                    _share_hooks(orig, acc)
            result.__dict__["_modules"] = new
            if acc is not None:
                twin.follow(acc, result)
        memo[id(orig)] = result
        return result

    twin.root = twin_of(snapshot.root, accelerated)
    return twin


def _share_with_replacement(orig: nn.Module, acc: nn.Module) -> None:
    """The original layer reads its parameters from the wrapper's dict (the same Parameters under the same names),
    and the wrapper takes the original's hooks. Not an `nn.Identity` left where a fused activation was: it is
    called on the activation's output, so the activation's hooks would see other inputs there."""
    if isinstance(acc, nn.Identity):
        return
    params = acc._parameters
    if params.keys() == orig._parameters.keys() and all(params[k] is v for k, v in orig._parameters.items()):
        orig.__dict__["_parameters"] = params
    _share_hooks(orig, acc)


def _share_hooks(orig: nn.Module, acc: nn.Module) -> None:
    for name in _HOOK_DICTS:
        hooks = orig.__dict__.get(name)
        if hooks is not None:
            acc.__dict__[name] = hooks  # the original's dicts: handles the user holds still remove from them
    if "_is_full_backward_hook" in orig.__dict__:
        acc.__dict__["_is_full_backward_hook"] = orig.__dict__["_is_full_backward_hook"]


class OwnForward:
    """The accelerated root's `forward` (an instance attribute, which `nn.Module.__call__` finds first): the twin's
    forward where the scope runs this forward as the model's own (`scope.bypass`, set by its pre-hook), the
    accelerated root's class forward otherwise. The test is one attribute read (selection well under 2 µs); the
    root's hooks (the scope's, the user's) ran once, on the accelerated root, around either."""

    def __init__(self, accelerated: nn.Module, twin: Twin, scope: ForwardScope) -> None:
        # bound: copies rebind it (copy's memo); a forward set on the instance before (another library's wrapper)
        # stays the tables' forward
        self.tables = accelerated.__dict__.get("forward") or type(accelerated).forward.__get__(accelerated)
        self.own = type(twin.root).forward.__get__(twin.root)
        self.__wrapped__ = self.tables  # inspect.signature(root.forward) gives the model's own signature
        self.twin = twin
        self.scope = scope

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.scope.bypass:
            twin = self.twin
            if twin.stale:
                twin.sync_flags()
            return self.own(*args, **kwargs)
        return self.tables(*args, **kwargs)


def install(accelerated: nn.Module, twin: Twin, scope: ForwardScope) -> OwnForward:
    """Make the accelerated root run the twin where `scope` says; returns the selector."""
    own = OwnForward(accelerated, twin, scope)
    accelerated.__dict__["forward"] = own
    twin.watch()
    return own
