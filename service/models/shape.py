"""Concrete shapes: the one canonical key used wherever a shape names a record."""

from __future__ import annotations

from collections.abc import Mapping

MAX_DIM = 1 << 20


def shape_key(shape: Mapping[str, int]) -> str:
    """`{"M": 61, "B": 2}` -> `"B=2,M=61"`; stable across processes and languages."""
    return ",".join(f"{name}={int(shape[name])}" for name in sorted(shape))


def parse_shape_key(key: str) -> dict[str, int]:
    """Inverse of `shape_key`; raises ValueError naming the bad part."""
    shape: dict[str, int] = {}
    for part in key.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"bad shape item {part!r}: expected NAME=INT, e.g. M=61")
        shape[name.strip()] = int(value)
    return shape
