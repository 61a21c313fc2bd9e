"""Exchange with MetaSchedule JSON databases (`database_workload.json`, `database_tuning_record.json`).

Import matches each MetaSchedule workload to a registered workload by rebuilding that workload's
PrimFunc at the record's shape and comparing structural hashes, so only records whose trace really
applies to our module come in. Export writes the store's best configs back as a JSON database.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.arg_info import ArgInfo

from kernelfleet.tvm_kernel import CONFIG_FORMAT_TRACE
from service.models import TargetSpec, Toolchain, Workload
from service.tuning.compute import prim_func
from service.tuning.platforms import tvm_target
from service.tuning.tuners.trace_json import FAILED_RUN_SECS, to_py


def _shapes(mod: tvm.IRModule) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in a.shape) for a in ArgInfo.from_prim_func(mod["main"])]


def _infer_shape(workload: Workload, shapes: Sequence[tuple[int, ...]]) -> dict[str, int] | None:
    """Values of the workload's symbolic dims that make its tensors have `shapes`, if any."""
    op = workload.operator
    tensors = [*op.input_tensors(workload.attrs), op.output]
    if len(tensors) != len(shapes):
        return None
    sizes: dict[str, int] = {}
    for tensor, shape in zip(tensors[:-1], shapes[:-1], strict=True):
        if len(tensor.dims) != len(shape):
            return None
        for dim, size in zip(tensor.dims, shape, strict=True):
            if sizes.setdefault(dim, size) != size:
                return None
    if any(sizes.get(d) != v for d, v in workload.dims.items()):
        return None
    if any(d not in sizes for d in workload.symbolic):
        return None
    return {d: sizes[d] for d in workload.symbolic}


def _target_spec(target: tvm.target.Target, toolchain: Toolchain) -> TargetSpec:
    exported = dict(target.export())
    kind = str(exported["kind"])
    if kind == "llvm":
        return TargetSpec(
            kind="llvm",
            mcpu=str(exported.get("mcpu") or ""),
            num_cores=int(exported.get("num-cores", 1)),
            features=[f.removeprefix("+") for f in exported.get("mattr", ())],
            toolchain=toolchain,
        )
    return TargetSpec(kind="cuda", arch=str(exported.get("arch")), toolchain=toolchain)


def read_database(
    work_dir: Path, workloads: Iterable[Workload], toolchain: Toolchain
) -> tuple[list[dict[str, Any]], list[str]]:
    """ImportedRecord payloads for every valid record that matches a registered workload, plus skip reasons."""
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    candidates = list(workloads)
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    for rec in db.get_all_tuning_records():
        mod = rec.workload.mod
        secs = [float(s) for s in (rec.run_secs or [])]
        if not secs or sum(secs) / len(secs) >= FAILED_RUN_SECS:
            skipped.append("a failed measurement")
            continue
        shash = str(tvm_ffi.structural_hash(mod))
        match = None
        for workload in candidates:
            shape = _infer_shape(workload, _shapes(mod))
            if shape is not None and str(tvm_ffi.structural_hash(prim_func(workload, shape))) == shash:
                match = (workload, shape)
                break
        if match is None:
            skipped.append(f"workload {shash} matches no registered workload")
            continue
        workload, shape = match
        try:
            target = _target_spec(rec.target, toolchain)
        except ValueError as exc:
            skipped.append(f"record target {rec.target}: {exc}")
            continue
        records.append(
            {
                "workload_hash": workload.workload_hash,
                "target": target.model_dump(),
                "shape": shape,
                "latency_s": sum(secs) / len(secs),
                "config": {
                    "format": CONFIG_FORMAT_TRACE,
                    "trace": to_py(rec.trace.as_json()),
                    "module": tvm.ir.save_json(mod),
                    "module_hash": shash,
                    "target": tvm_target(target),
                },
                "source": f"metaschedule:{work_dir}",
            }
        )
    return records, skipped


def write_database(out_dir: Path, configs: Iterable[Any]) -> int:
    """Write trace configs (objects with `.config` and `.latency_s`) as a MetaSchedule JSON database."""
    out_dir.mkdir(parents=True, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=str(out_dir))
    n = 0
    for rec in configs:
        config = rec.config
        if config.get("format") != CONFIG_FORMAT_TRACE:
            continue
        mod = tvm.ir.load_json(config["module"])
        sch = s_tir.Schedule(mod)
        s_tir.Trace.apply_json_to_schedule(config["trace"], sch)
        db.commit_tuning_record(
            ms.database.TuningRecord(
                trace=sch.trace,
                workload=db.commit_workload(mod),
                run_secs=[rec.latency_s],
                target=tvm.target.Target(config["target"]),
                args_info=ArgInfo.from_prim_func(mod["main"]),
            )
        )
        n += 1
    return n
