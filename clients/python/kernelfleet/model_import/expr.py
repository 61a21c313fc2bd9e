"""Dimension expressions over a model's dynamic inputs: an integer times a product of named symbols.

`Mono(12, (("batch", 1),))` is `12*batch`; `Mono.parse("batch*seq")` reads the form `str()` writes. That is all
a GEMM-like operator of a transformer or a CNN needs (M = batch*seq, B = heads*batch); anything else (a strided
convolution's output over a dynamic height, a sum of two inputs) is reported as unsupported by the extractors.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

_SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, order=True)
class Mono:
    """coef × Π symbol^power, symbols sorted by name; a constant has no symbols."""

    coef: int
    powers: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def const(value: int) -> Mono:
        return Mono(int(value))

    @staticmethod
    def symbol(name: str) -> Mono:
        if not _SYMBOL.match(name):
            raise ValueError(f"{name!r} is not a symbol name (letters, digits, _)")
        return Mono(1, ((name, 1),))

    @staticmethod
    def parse(text: str) -> Mono:
        """Read `12*batch*seq`, `seq`, `seq**2` or `64`."""
        coef, powers = 1, dict[str, int]()
        for part in text.replace(" ", "").replace("**", "^").split("*"):
            if part.isdigit():
                coef *= int(part)
                continue
            name, _, power = part.partition("^")
            if not _SYMBOL.match(name) or (power and not power.isdigit()):
                raise ValueError(f"cannot read the dimension expression {text!r}: expected e.g. 12*batch*seq")
            powers[name] = powers.get(name, 0) + int(power or 1)
        return Mono(coef, tuple(sorted(powers.items())))

    @property
    def is_const(self) -> bool:
        return not self.powers

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.powers)

    def __mul__(self, other: Mono) -> Mono:
        powers = dict(self.powers)
        for name, p in other.powers:
            powers[name] = powers.get(name, 0) + p
        return Mono(self.coef * other.coef, tuple(sorted(powers.items())))

    def divide(self, other: Mono) -> Mono | None:
        """self / other when it is again a Mono (exact coefficient, no negative power), else None."""
        if other.coef == 0 or self.coef % other.coef:
            return None
        powers = dict(self.powers)
        for name, p in other.powers:
            left = powers.get(name, 0) - p
            if left < 0:
                return None
            if left:
                powers[name] = left
            else:
                powers.pop(name, None)
        return Mono(self.coef // other.coef, tuple(sorted(powers.items())))

    def evaluate(self, values: Mapping[str, int]) -> int:
        missing = [name for name in self.symbols if name not in values]
        if missing:
            raise KeyError(f"no value for {', '.join(missing)} in {str(self)!r}")
        return self.coef * math.prod(int(int(values[name]) ** p) for name, p in self.powers)

    def __str__(self) -> str:
        parts = [name if p == 1 else f"{name}**{p}" for name, p in self.powers]
        if self.coef != 1 or not parts:
            parts.insert(0, str(self.coef))
        return "*".join(parts)

    def __repr__(self) -> str:
        return f"Mono({str(self)!r})"


def product(factors: list[Mono]) -> Mono:
    out = Mono(1)
    for f in factors:
        out = out * f
    return out


def as_dim(value: Mono) -> int | str:
    """A constant as its int, anything else as its expression text."""
    return value.coef if value.is_const else str(value)
