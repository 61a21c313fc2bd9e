"""Dispatch tables as typed records: one variant per operator family, tagged on the wire by `kind`.

A dispatch document's `table` is one of these variants, written by the service with the variant's `to_json` and
read everywhere (the SDK loader, `kernelfleet dispatch`, the service's dashboard) with `table_from_json`, which
reads the `kind` tag and hands back the variant: nothing downstream re-derives which table it holds from its keys.
A new operator family is one module that defines a variant and registers it (`register_table`), and, to be loaded
into a dispatcher, its loader (kernelfleet.dispatch_cache.register_loader).

Tables published before the tag existed (documents in hosts' caches and the service's database) carry no `kind`:
`legacy_kind` infers it from their keys, for those documents only, here and nowhere else. The tag is one more key
beside the table's own, so an older SDK reads a tagged table as it always did.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from kernelfleet.conv_dispatcher import ConvGeometry
from kernelfleet.dispatch import DispatchTable
from kernelfleet.tuple_dispatch import FORMAT as TUPLE_FORMAT
from kernelfleet.tuple_dispatch import TupleDispatchTable

KIND_KEY = "kind"
CONV_KEY = "conv2d"  # where a conv table carries its geometry beside the dense table's keys
STATIC_KEY = "static"  # where a batch_matmul table carries its static dims


class TableVariant(ABC):
    """One operator family's dispatch table. `kind` is its tag on the wire and its key in the registry."""

    kind: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        """The table as stored, served and signed: its own keys and the `kind` tag."""
        return {**self._body(), KIND_KEY: self.kind}

    @abstractmethod
    def _body(self) -> dict[str, Any]:
        """The table's own keys, without the tag."""

    @classmethod
    @abstractmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableVariant:
        """The table from its wire form (tagged or not: the tag has been read already)."""


_VARIANTS: dict[str, type[TableVariant]] = {}
Variant = TypeVar("Variant", bound=type[TableVariant])


def register_table(variant: Variant) -> Variant:
    """Make `variant` readable by `table_from_json` under its `kind` (a class decorator)."""
    known = _VARIANTS.get(variant.kind)
    if known is not None and known is not variant:
        raise ValueError(f"table kind {variant.kind!r} is already {known.__qualname__}")
    _VARIANTS[variant.kind] = variant
    return variant


def table_kinds() -> list[str]:
    return sorted(_VARIANTS)


def legacy_kind(data: Mapping[str, Any]) -> str:
    """The kind of a table published before tables were tagged, read off the keys each family had then."""
    if data.get("format") == TUPLE_FORMAT:
        return BatchMatmulTable.kind
    return ConvTable.kind if CONV_KEY in data else DenseTable.kind


def table_from_json(data: Mapping[str, Any]) -> TableVariant:
    """The variant a document's table is: its `kind` tag, or for an untagged (older) table its `legacy_kind`."""
    kind = data.get(KIND_KEY) or legacy_kind(data)
    variant = _VARIANTS.get(str(kind))
    if variant is None:
        raise ValueError(f"unknown dispatch table kind {kind!r}; this SDK reads {', '.join(table_kinds())}")
    return variant.from_json(data)


@register_table
@dataclass(frozen=True)
class DenseTable(TableVariant):
    """A dense layer's table: intervals over one dim (M), on CPU or CUDA uKernels (their specs say which)."""

    kind: ClassVar[str] = "dense"
    table: DispatchTable

    def _body(self) -> dict[str, Any]:
        return self.table.to_dict()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DenseTable:
        return cls(DispatchTable.from_dict(data))


@register_table
@dataclass(frozen=True)
class ConvTable(TableVariant):
    """A conv2d layer's table: the dense table over M = N·OH·OW and the layer's geometry
    (kernelfleet.conv_dispatcher)."""

    kind: ClassVar[str] = "conv2d"
    table: DispatchTable
    geometry: ConvGeometry

    def _body(self) -> dict[str, Any]:
        return {**self.table.to_dict(), CONV_KEY: self.geometry.to_dict()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ConvTable:
        return cls(DispatchTable.from_dict(data), ConvGeometry.from_dict(data[CONV_KEY]))


@register_table
@dataclass(frozen=True)
class BatchMatmulTable(TableVariant):
    """A batch_matmul table: a class grid over several dims (kernelfleet.tuple_dispatch) and the static dims."""

    kind: ClassVar[str] = "batch_matmul"
    table: TupleDispatchTable
    static: Mapping[str, int] = field(default_factory=dict, hash=False)

    def _body(self) -> dict[str, Any]:
        return {**self.table.to_dict(), STATIC_KEY: dict(self.static)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchMatmulTable:
        static = {str(d): int(v) for d, v in (data.get(STATIC_KEY) or {}).items()}
        return cls(TupleDispatchTable.from_dict(data), static)
