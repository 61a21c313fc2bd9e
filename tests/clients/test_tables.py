"""Dispatch tables as typed records: every variant round-trips through its tagged wire form, and tables published
before the tag (in hosts' caches and the service's database) still read as the variant they always were."""

from __future__ import annotations

from typing import Any

import pytest

from kernelfleet import vendor
from kernelfleet.conv_dispatcher import ConvGeometry
from kernelfleet.dispatch import DispatchTable, Interval, Shape
from kernelfleet.epilogue import Epilogue
from kernelfleet.tables import (
    KIND_KEY,
    BatchMatmulTable,
    ConvTable,
    DenseTable,
    legacy_kind,
    table_from_json,
)
from kernelfleet.tuple_dispatch import TupleDispatchTable

INTERVALS = DispatchTable(
    (Interval(1, 30, Shape((), "u16")), Interval(31, 64, None, vendor.TORCH)), {"u16": 16}, Epilogue(True, "relu")
)
DENSE = DenseTable(INTERVALS)
CONV = ConvTable(INTERVALS, ConvGeometry(stride=2, padding=1, filter=(3, 3, 8, 16), static={"H": 28}))
BMM = BatchMatmulTable(
    TupleDispatchTable(dims=("M", "K"), starts=((1, 2, 3), (4,)), his=(8, 64), cells=("a", vendor.VENDOR, None)),
    {"B": 2, "N": 64},
)
VARIANTS = {"dense": DENSE, "conv2d": CONV, "batch_matmul": BMM}


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_every_variant_round_trips_through_its_tagged_wire_form(kind: str) -> None:
    table = VARIANTS[kind]
    wire = table.to_json()
    assert wire[KIND_KEY] == kind == table.kind
    assert table_from_json(wire) == table


@pytest.mark.parametrize("kind", sorted(VARIANTS))
def test_an_untagged_table_from_before_the_tag_reads_as_the_same_variant(kind: str) -> None:
    legacy = {k: v for k, v in VARIANTS[kind].to_json().items() if k != KIND_KEY}
    assert legacy_kind(legacy) == kind
    assert table_from_json(legacy) == VARIANTS[kind]


def test_the_tag_is_one_more_key_beside_the_form_older_sdks_read() -> None:
    # an older SDK reads a tagged table with the readers it always had
    assert DispatchTable.from_dict(DENSE.to_json()) == INTERVALS
    assert TupleDispatchTable.from_dict(BMM.to_json()) == BMM.table
    assert {k: v for k, v in CONV.to_json().items() if k != KIND_KEY} == {
        **INTERVALS.to_dict(),
        "conv2d": CONV.geometry.to_dict(),
    }


def test_the_tag_decides_not_the_keys() -> None:
    # a dense table tagged as such stays dense even if it carries a key another family once used
    tagged: dict[str, Any] = {**DENSE.to_json(), "static": {"B": 2}}
    assert isinstance(table_from_json(tagged), DenseTable)


def test_an_unknown_kind_is_refused_naming_the_kinds_this_sdk_reads() -> None:
    with pytest.raises(ValueError, match=r"unknown dispatch table kind 'winograd'.*batch_matmul, conv2d, dense"):
        table_from_json({**DENSE.to_json(), KIND_KEY: "winograd"})


def test_a_kind_is_registered_once() -> None:
    from kernelfleet.tables import register_table

    class Impostor(DenseTable):
        kind = "dense"

    with pytest.raises(ValueError, match="already DenseTable"):
        register_table(Impostor)
    assert isinstance(table_from_json(DENSE.to_json()), DenseTable)
