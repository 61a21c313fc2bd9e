"""Best configs per (workload, target fingerprint, shape): lookups, batch lookups, export and import."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service import signer
from service.api.auth import AdminKey, ReadKey
from service.api.deps import SessionDep, unprocessable
from service.api.limits import enforce
from service.api.routers.ops import observe_lookup
from service.api.state import lookup_bucket
from service.models import ConfigMiss, ConfigRecord, Workload, parse_shape_key, shape_key
from service.models.config import BatchLookup, BatchLookupResult, ImportRequest, ImportResult, LookupKey
from service.settings import get_settings
from service.store import catalog, configs
from service.store.db import read_connection
from service.tuning.admission import check_imported_config, check_target
from service.workers import config_check

router = APIRouter(prefix="/v1/configs", tags=["configs"])

_MISS: dict[int | str, dict[str, Any]] = {
    404: {"model": ConfigMiss, "description": "no tuned config: the body says which fallback to use"}
}


def _lookup(conn: Connection | Session, key: LookupKey, loc: list[str | int]) -> ConfigRecord | ConfigMiss:
    found = configs.get_best(conn, key.workload, key.target, key.shape)
    if found is not None:  # a stored record implies a registered workload and a valid shape: one query
        return found
    workload = _registered_workload(conn, key.workload)
    if workload is None:
        unprocessable([*loc, "workload"], f"workload {key.workload} is not registered")
    try:
        workload.bind(key.shape)
    except ValueError as exc:
        unprocessable([*loc, "shape"], str(exc))
    return ConfigMiss(
        detail="no tuned config for this workload, target and shape",
        workload_hash=key.workload,
        target_fingerprint=key.target,
        shape=key.shape,
    )


# A workload hash names its spec forever (content-addressed, never changed or deleted), so a miss, which must say
# whether the workload exists and the shape fits it, costs no second query once the workload was seen here.
_WORKLOADS: dict[tuple[str, str], Workload] = {}  # (store URL, workload hash)
_MAX_CACHED_WORKLOADS = 10_000


def _registered_workload(conn: Connection | Session, workload_hash: str) -> Workload | None:
    key = (get_settings().resolved_database_url, workload_hash)
    found = _WORKLOADS.get(key)
    if found is None:
        if isinstance(conn, Session):
            found = catalog.get_workload(conn, workload_hash)
        else:
            with Session(bind=conn) as session:
                found = catalog.get_workload(session, workload_hash)
        if found is not None:  # an unknown hash may be registered a moment later: only hits are kept
            if len(_WORKLOADS) >= _MAX_CACHED_WORKLOADS:
                _WORKLOADS.clear()
            _WORKLOADS[key] = found
    return found


def _lookup_once(key: LookupKey) -> ConfigRecord | ConfigMiss:
    try:
        with read_connection() as conn:
            return _lookup(conn, key, ["query"])
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
    with read_connection() as conn:  # a pooled connection died with the server: once more on a fresh one
        return _lookup(conn, key, ["query"])


@router.get("/best", response_model=ConfigRecord, responses=_MISS, summary="The best config for one concrete shape")
async def best_config(
    who: ReadKey,
    workload: str = Query(min_length=1, max_length=64, description="workload hash"),
    target: str = Query(min_length=1, max_length=64, description="target fingerprint (includes toolchain)"),
    shape: str = Query(
        min_length=3, max_length=200, description="concrete shape, e.g. M=61 or B=2,M=61", examples=["M=61"]
    ),
) -> Response:
    # The hot path of inference hosts: one hop to the thread pool for the store, and the record serialised
    # once (FastAPI would otherwise validate the returned model again).
    enforce(lookup_bucket(), who.id, "lookups")
    started = time.perf_counter()
    try:
        parsed = parse_shape_key(shape)
    except ValueError as exc:
        unprocessable(["query", "shape"], str(exc))
    result = await run_in_threadpool(_lookup_once, LookupKey(workload=workload, target=target, shape=parsed))
    missed = isinstance(result, ConfigMiss)
    observe_lookup("best", started, hits=int(not missed), misses=int(missed))
    body = result.model_dump_json().encode()
    headers = {}
    if not missed:  # the SDK compiles the config's IR: it checks the service signed exactly this answer
        request = f"{target}:{shape_key(parsed)}"
        headers["X-KernelFleet-Signature"] = signer.sign_document(get_settings(), workload, request, body, "config")
    return Response(body, status_code=404 if missed else 200, media_type="application/json", headers=headers)


@router.post("/best/batch", summary="Best configs for many keys at once (misses carry their fallback)")
def best_configs_batch(body: BatchLookup, session: SessionDep, who: ReadKey) -> BatchLookupResult:
    # each key costs the store what a single lookup does (one indexed query, two on a miss), so a batch costs
    # one token per key: batching saves round trips, not the service's work, and cannot buy more lookups
    enforce(lookup_bucket(), who.id, "lookups", cost=len(body.keys))
    started = time.perf_counter()
    results = [_lookup(session, k, ["body", "keys", i]) for i, k in enumerate(body.keys)]
    misses = sum(isinstance(r, ConfigMiss) for r in results)
    observe_lookup("batch", started, hits=len(results) - misses, misses=misses)
    return BatchLookupResult(results=results)


@router.get("", summary="List best configs, e.g. to export them")
def list_configs(
    session: SessionDep,
    who: ReadKey,
    workload: str | None = Query(None, max_length=64),
    target: str | None = Query(None, max_length=64),
    limit: int = Query(1000, ge=1, le=10_000),
) -> list[ConfigRecord]:
    # an export is lookups in bulk: one token per record it returns, from the same bucket as single lookups
    enforce(lookup_bucket(), who.id, "lookups")
    records = configs.list_best(session, workload, target, limit)
    lookup_bucket().charge(who.id, len(records) - 1)
    return records


@router.post("/import", summary="Bring configs measured elsewhere (e.g. a MetaSchedule database) into the store")
def import_configs(body: ImportRequest, session: SessionDep, _: AdminKey) -> ImportResult:
    settings = get_settings()
    accepted: list[ConfigRecord] = []
    to_check: list[tuple[int, config_check.ConfigToCheck]] = []
    for i, rec in enumerate(body.records):
        loc: list[str | int] = ["body", "records", i]
        workload = catalog.get_workload(session, rec.workload_hash)
        if workload is None:
            unprocessable([*loc, "workload_hash"], f"workload {rec.workload_hash} is not registered")
        if problem := check_target(rec.target):
            unprocessable([*loc, "target", *problem.loc], problem.message)
        if rec.target.is_host_alias:
            unprocessable([*loc, "target", "mcpu" if rec.target.mcpu else "arch"], "'host' is resolved on jobs only")
        try:
            fingerprint = rec.target.fingerprint
        except ValueError as exc:
            unprocessable([*loc, "target", "toolchain"], str(exc))
        try:
            workload.bind(rec.shape)
        except ValueError as exc:
            unprocessable([*loc, "shape"], str(exc))
        flops = workload.flops(rec.shape)
        floor = max(settings.min_plausible_latency_s, flops / settings.max_plausible_flops_per_s)
        if rec.latency_s < floor:
            unprocessable(
                [*loc, "latency_s"],
                f"{rec.latency_s:g} s per call is implausible for {flops:g} FLOPs: the floor is {floor:g} s "
                "(KERNELFLEET_MIN_PLAUSIBLE_LATENCY_S, KERNELFLEET_MAX_PLAUSIBLE_FLOPS_PER_S)",
            )
        problem = check_imported_config(rec.config)
        if problem:
            unprocessable([*loc, "config", *problem.loc], problem.message)
        if config_check.needs_check(rec.config):
            item = config_check.ConfigToCheck(workload.model_dump(), rec.shape, rec.target.kind, rec.config)
            to_check.append((i, item))
        accepted.append(
            ConfigRecord(
                workload_hash=rec.workload_hash,
                target_fingerprint=fingerprint,
                shape=rec.shape,
                latency_s=rec.latency_s,
                kind="imported",
                config=rec.config,
                provenance={"source": rec.source},
            )
        )
    _refuse_what_the_sdk_cannot_load(to_check)
    improved = 0
    for rec, record in zip(body.records, accepted, strict=True):
        catalog.put_target(session, rec.target)
        improved += configs.upsert_best(session, record)
    return ImportResult(imported=len(accepted), improved=improved)


def _refuse_what_the_sdk_cannot_load(to_check: list[tuple[int, config_check.ConfigToCheck]]) -> None:
    """A 422 naming each config whose IR the SDK could not load (checked in a child process: this one never
    imports TVM), before anything is stored; a 503 when the check itself could not run."""
    try:
        rejections = config_check.check_configs([item for _, item in to_check])
    except config_check.CheckUnavailable as exc:
        raise HTTPException(
            status_code=503, detail=f"imported configs could not be checked: {exc}", headers={"Retry-After": "30"}
        ) from None
    if rejections:
        detail = []
        for r in rejections:
            record: list[str | int] = ["body", "records", to_check[r.index][0]]
            loc = record if r.about_record else [*record, "config", *r.loc]
            detail.append({"loc": loc, "msg": r.message, "type": "value_error"})
        raise HTTPException(status_code=422, detail=detail)
