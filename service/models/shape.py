"""Concrete shapes: the one canonical key used wherever a shape names a record."""

from __future__ import annotations

import re
from collections.abc import Mapping

MAX_DIM = 1 << 20
MAX_SHAPE_DIMS = 8  # dims a concrete shape names: every operator has fewer
DIM_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,31}"  # an ASCII identifier: M, N, KH, seq_len
# One NAME=SIZE item: ASCII only (str.isdigit() also takes full-width and superscript digits), spaces around it.
_ITEM = re.compile(rf"[ \t]*({DIM_NAME_PATTERN})[ \t]*=[ \t]*([0-9]{{1,10}})[ \t]*")


def shape_key(shape: Mapping[str, int]) -> str:
    """`{"M": 61, "B": 2}` -> `"B=2,M=61"`; stable across processes and languages."""
    return ",".join(f"{name}={int(shape[name])}" for name in sorted(shape))


def parse_shape_key(key: str) -> dict[str, int]:
    """Inverse of `shape_key`; raises ValueError naming the bad part. What it returns is a valid shape of a request
    (fields.Shape): at most MAX_SHAPE_DIMS distinct names, each size in 1..MAX_DIM."""
    parts = key.split(",")
    if len(parts) > MAX_SHAPE_DIMS:
        raise ValueError(f"a shape names at most {MAX_SHAPE_DIMS} dimensions, not {len(parts)}")
    shape: dict[str, int] = {}
    for part in parts:
        item = _ITEM.fullmatch(part)
        if item is None:
            raise ValueError(f"bad shape item {part!r}: expected NAME=INT in ASCII, e.g. M=61")
        name, value = item[1], int(item[2])
        if name in shape:
            raise ValueError(f"dimension {name} is given twice in {key!r}")
        if not 1 <= value <= MAX_DIM:
            raise ValueError(f"shape {name}={value} out of range 1..{MAX_DIM}")
        shape[name] = value
    return shape
