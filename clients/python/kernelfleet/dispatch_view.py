"""What `kernelfleet dispatch` says about a dispatch document, for each kind of table the service publishes.

A document holds one of three tables (kernelfleet.tables; kernelfleet.dispatch_cache loads each into its dispatcher):
- dense: a DispatchTable of intervals over one dim;
- conv2d: the same dense table over M = N·OH·OW, with the layer's geometry under "conv2d". Its intervals run to
  the largest M of the job's support: the routes the job timed there extend them past the range the tuner's cost
  model predicted (the document's `s_max`, at most the tuner's limit), so the range shown is the intervals';
- batch_matmul: a TupleDispatchTable (one class grid over several dims: no intervals, no predictions).

Every range shown is read off the table itself, the object the dispatcher runs, not off a summary field.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kernelfleet import vendor
from kernelfleet.dispatch import DispatchTable
from kernelfleet.models import DispatchDoc
from kernelfleet.tables import BatchMatmulTable, ConvTable, DenseTable, TableVariant, table_from_json
from kernelfleet.tuple_dispatch import TupleDispatchTable

ROUTED = "measured faster than the uKernels and the other vendor libraries as the SDK calls them"
MAX_BOXES = 8  # routed cells listed per library; a grid has up to hundreds


def describe(doc: DispatchDoc) -> list[str]:
    """The document as lines: the table's true ranges and routes, its uKernels, then what the job measured."""
    return [*_table_lines(doc, table_from_json(doc.table)), *_ukernel_lines(doc), *_measurement_lines(doc)]


def _table_lines(doc: DispatchDoc, variant: TableVariant) -> list[str]:
    if isinstance(variant, BatchMatmulTable):
        return _tuple_lines(doc, variant)
    if isinstance(variant, ConvTable | DenseTable):
        return _interval_lines(doc, variant)
    return [f"a {variant.kind} table from job {doc.job_id}"]  # a family this view has no summary for


def _interval_lines(doc: DispatchDoc, variant: DenseTable | ConvTable) -> list[str]:
    table: DispatchTable = variant.table
    lo, hi = table.intervals[0].lo, table.s_max
    if isinstance(variant, ConvTable):
        g = variant.geometry
        flt = "any" if g.filter is None else "×".join(map(str, g.filter))
        static = ", ".join(f"{k}={v}" for k, v in g.static.items()) or "none"
        where = f"conv2d as an implicit GEMM over {doc.dim} = N·OH·OW"
        lines = [
            f"{where} = {lo}..{hi} (larger extend the last interval), from job {doc.job_id}",
            f"  stride {g.stride}, padding {g.padding}, filter KH×KW×CI×CO {flt}, static dims: {static}",
        ]
    else:
        lines = [f"dense over {doc.dim} = {lo}..{hi} (larger extend the last interval), from job {doc.job_id}"]
    if doc.s_max and doc.s_max != hi:  # the model's predictions stop at the tuner's limit, the routes do not
        lines.append(f"  predicted latencies cover {doc.dim} = 1..{doc.s_max}; intervals past it are measured routes")
    ivs = table.intervals
    lines.append(f"{len(ivs)} intervals; first: {[iv.to_list() for iv in ivs[:3]]}")
    routed: dict[str, list[str]] = {}  # library → its spans
    for iv in ivs:
        if iv.vendor:
            routed.setdefault(iv.library, []).append(f"{iv.lo}..{iv.hi}")
    lines += [f"  routed to {lib} ({ROUTED}): {doc.dim} = {', '.join(spans)}" for lib, spans in routed.items()]
    return lines


def _other_layouts(table: TupleDispatchTable) -> dict[str, tuple[str | None, ...]]:
    names = {"BKN": "Bt a transposed view (BKN)"}
    return {names.get(layout, layout): cells for layout, cells in table.layouts.items()}


def _cell_lines(table: TupleDispatchTable, cells: tuple[str | None, ...], layout: str) -> list[str]:
    """How many cells run uKernels, each library, or are holes, and the boxes routed to each library."""
    on_ukernels, holes = 0, 0
    routed: dict[str, list[tuple[tuple[int, int], ...]]] = {}  # library → its cells' boxes
    for classes, cell in zip(table.grid(), cells, strict=True):
        library = vendor.library_of(cell)
        if library is not None:
            routed.setdefault(library, []).append(table.class_bounds(classes))
        elif cell is None:
            holes += 1
        else:
            on_ukernels += 1
    parts = [f"{on_ukernels} on uKernels"]
    parts += [f"{len(boxes)} routed to {lib}" for lib, boxes in routed.items()]
    parts.append(f"{holes} holes (numpy, counted as misses: the distribution had no tuple there)")
    where = f"{layout}: " if layout else ""
    lines = [f"{where}{len(cells)} cells ({'×'.join(map(str, table.shape))}): {', '.join(parts)}"]
    return lines + [f"  routed to {lib} ({ROUTED}): {_boxes(table.dims, boxes)}" for lib, boxes in routed.items()]


def _tuple_lines(doc: DispatchDoc, variant: BatchMatmulTable) -> list[str]:
    table, static = variant.table, variant.static
    ranges = ", ".join(
        f"{d} = {s[0]}..{hi} ({len(s)} classes)" for d, s, hi in zip(table.dims, table.starts, table.his, strict=True)
    )
    lines = [
        f"batch_matmul over {', '.join(table.dims)}, from job {doc.job_id}; static dims: "
        + (", ".join(f"{k}={v}" for k, v in sorted(static.items())) or "none"),
        f"  {ranges}; a tuple outside this box runs numpy, counted as a miss",
    ]
    # `cells` route Bt as it comes contiguous (and any other strides); a layout of its own only where it differs
    for layout, cells in {"Bt contiguous (BNK)": table.cells, **_other_layouts(table)}.items():
        lines += _cell_lines(table, cells, layout if table.layouts else "")
    return lines


def _boxes(dims: Sequence[str], boxes: Sequence[tuple[tuple[int, int], ...]]) -> str:
    shown = [" × ".join(f"{d}={lo}..{hi}" for d, (lo, hi) in zip(dims, box, strict=True)) for box in boxes]
    more = len(shown) - MAX_BOXES
    return "; ".join(shown[:MAX_BOXES]) + (f"; … and {more} more" if more > 0 else "")


def _ukernel_lines(doc: DispatchDoc) -> list[str]:
    # the service signs the document, which names each artifact by its sha256
    return [
        f"  uKernel {u.id}: {u.size_bytes} B, sha256 {u.sha256[:16]}… (named by the signed document)"
        for u in doc.ukernels
    ]


def _measurement_lines(doc: DispatchDoc) -> Iterable[str]:
    v: dict[str, Any] = doc.validation
    for key in ("tuning_seconds", "padding_ratio", "rho_dietcode_mean", "rho_sia_mean"):
        if v.get(key) is not None:
            yield f"  {key}: {v[key]:.3g}"
    for S, t in sorted(doc.measured_latency_s.items(), key=lambda kv: int(kv[0])):
        i = int(S) - 1  # a conv's measured M may lie past the predicted range
        predicted = (
            f", predicted {doc.predicted_latency_s[i] * 1e6:.1f} µs" if 0 <= i < len(doc.predicted_latency_s) else ""
        )
        yield f"  {doc.dim}={S}: measured {t * 1e6:.1f} µs{predicted}"
    for o in doc.overrides:
        yield f"  exact config wins at {doc.dim}={o.S}: {o.latency_s * 1e6:.1f} µs"
