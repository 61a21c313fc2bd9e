"""Synchronous client for the KernelFleet API."""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from kernelfleet.errors import (
    Forbidden,
    InvalidRequest,
    JobFailed,
    KernelFleetError,
    NotFound,
    RateLimited,
    ServiceUnavailable,
    Unauthorized,
)
from kernelfleet.models import BestConfig, DispatchDoc, Job, Model, Target, Workload, non_finite
from kernelfleet.vendor import HOST_LIBRARY_TAG

log = logging.getLogger("kernelfleet")

if TYPE_CHECKING:
    from kernelfleet.bmm_dispatcher import BmmDispatcher
    from kernelfleet.conv_dispatcher import ConvDispatcher
    from kernelfleet.cuda_ukernel import CudaDispatcher
    from kernelfleet.dispatcher import Dispatcher
    from kernelfleet.epilogue import Epilogue
    from kernelfleet.model_import import ModelGraph
    from kernelfleet.telemetry import TelemetryReporter

DEFAULT_URL = "http://127.0.0.1:8000"


def shape_key(shape: Mapping[str, int]) -> str:
    return ",".join(f"{k}={int(shape[k])}" for k in sorted(shape))


def local_toolchain() -> dict[str, str]:
    """The toolchain this process would build kernels with (fills `target.toolchain` when omitted)."""
    try:
        import tvm
    except ImportError as exc:
        raise KernelFleetError("target.toolchain is required when TVM is not installed here") from exc
    return {"tvm": tvm.__version__, "tuner_abi": "1"}


def model_ops(
    graph: ModelGraph,
    *,
    histogram: Mapping[str, Mapping[int | str, float]] | None = None,
    ranges: Mapping[str, tuple[int, int]] | None = None,
) -> list[dict[str, Any]]:
    """The op bodies of POST /v1/models for a `ModelGraph`: each op's workload, occurrences, distribution (from the
    inputs' histogram or ranges; a single empty shape for an op with no dynamic dim), dims and sources."""
    ops = []
    for op in graph.ops:
        if op.inputs:
            distribution = graph.distribution_for(op, histogram=histogram, ranges=ranges)
        else:
            distribution = {"kind": "explicit", "points": [{"shape": {}, "weight": 1.0}]}
        ops.append(
            {
                "name": op.describe()[:200],
                "workload": op.to_workload(),
                "occurrences": op.occurrences,
                "distribution": distribution,
                "dims": dict(op.dims),
                "sources": [s[:200] for s in op.sources[:64]],
            }
        )
    return ops


def _model_name(source: str) -> str:
    stem = Path(source).stem if source else "model"
    return re.sub(r"[^\w.:+/ -]", "_", stem)[:100] or "model"


class Client:
    """`Client("http://host:8000")`; retries connection failures and 502/503/504 with jittered backoff."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        deadline_s: float | None = None,
        on_slow: Callable[[str], None] | None = None,
        slow_after_s: float = 2.0,
        transport: httpx.BaseTransport | None = None,
        api_key: str | None = None,
        trusted_key: str | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        """`trusted_key` (default $KERNELFLEET_TRUSTED_KEY) pins the service's signing key; without it the key
        the service presents first is pinned in `cache_dir` (default $KERNELFLEET_CACHE_DIR or
        ~/.cache/kernelfleet), where dispatch tables and artifacts are cached too.

        The retry policy: each attempt waits up to `timeout` s for the service, and a call makes up to `retries`
        more after a connection failure or a 502/503/504 (an idempotent one after a timeout too), with jittered
        backoff from `backoff_s`; `deadline_s` bounds a call's attempts and pauses together (None: unbounded).
        `on_slow(url)` is called once per client, the first time an attempt has waited `slow_after_s` for an
        answer (the CLI says what it is waiting for)."""
        self.base_url = (base_url or os.environ.get("KERNELFLEET_URL") or DEFAULT_URL).rstrip("/")
        self.trusted_key = trusted_key or os.environ.get("KERNELFLEET_TRUSTED_KEY")
        self.cache_dir = cache_dir
        self.timeout, self.retries, self.backoff_s, self.deadline_s = timeout, retries, backoff_s, deadline_s
        self.on_slow, self.slow_after_s = on_slow, slow_after_s
        self._said_slow, self._said_slow_lock = False, threading.Lock()
        key = api_key or os.environ.get("KERNELFLEET_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport, headers=headers)
        self._kernels: dict[tuple[str, str, str], Any] = {}

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport -------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        bad = non_finite(kwargs.get("json"))
        if bad:  # JSON has no NaN or Infinity (httpx would refuse with a bare ValueError): name the field instead
            detail = [
                {"loc": ["body", *loc], "msg": f"{number} is not a finite number", "type": "finite_number"}
                for loc, number in bad
            ]
            where = ".".join(str(p) for p in detail[0]["loc"])
            # a 422 as the service would answer, so callers treat it alike (e.g. the telemetry reporter drops the
            # batch rather than resending it forever)
            message = f"{method} {path}: {where} is {bad[0][1]}; JSON numbers must be finite (refused before sending)"
            raise InvalidRequest(message, 422, detail)
        idempotent = method in ("GET", "HEAD")
        started = time.monotonic()
        cause: httpx.TransportError
        for attempt in range(self.retries + 1):
            try:
                resp = self._attempt(method, path, started, **kwargs)
            except httpx.ConnectError as exc:  # nothing was sent: safe to retry any method
                failure, cause = ServiceUnavailable(f"cannot reach {self.base_url}: {exc}"), exc
            except httpx.TimeoutException as exc:
                waited = time.monotonic() - started
                tries = f"{attempt + 1} attempt{'s' if attempt else ''}"
                message = f"{method} {path}: no answer from {self.base_url} in {waited:.0f} s ({tries})"
                failure, cause = ServiceUnavailable(message), exc
                if not idempotent:
                    raise failure from exc
            except httpx.TransportError as exc:
                failure, cause = ServiceUnavailable(f"{method} {path} failed: {exc}"), exc
                if not idempotent:
                    raise failure from exc
            else:
                retryable = resp.status_code in (429, 503) or (resp.status_code in (502, 504) and idempotent)
                after = resp.headers.get("Retry-After", "")
                pause = min(float(after), 30.0) if after.isdigit() else self._backoff(attempt)
                if not retryable or attempt == self.retries or not self._time_left_for(started, pause):
                    return self._check(resp)
                time.sleep(pause)
                continue
            pause = self._backoff(attempt)
            if attempt == self.retries or not self._time_left_for(started, pause):
                raise failure from cause
            time.sleep(pause)
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int) -> float:
        return float(self.backoff_s * 2**attempt * (0.5 + random.random()))

    def _time_left_for(self, started: float, pause: float) -> bool:
        """Whether the call's deadline leaves room for a pause and another attempt."""
        min_attempt_s = 0.1  # an attempt with less time than this could not get an answer anyway
        return self.deadline_s is None or time.monotonic() - started + pause + min_attempt_s < self.deadline_s

    def _attempt(self, method: str, path: str, started: float, **kwargs: Any) -> httpx.Response:
        """One request: within what the deadline leaves, telling `on_slow` once if it waits long for its answer."""
        if self.deadline_s is not None:
            kwargs["timeout"] = max(0.001, min(self.timeout, self.deadline_s - (time.monotonic() - started)))
        notice = None
        if self.on_slow is not None and not self._said_slow:
            notice = threading.Timer(self.slow_after_s, self._say_slow, [f"{self.base_url}{path}"])
            notice.daemon = True  # never keeps a finished program alive
            notice.start()
        try:
            return self._http.request(method, path, **kwargs)
        finally:
            if notice is not None:
                notice.cancel()

    def _say_slow(self, url: str) -> None:
        with self._said_slow_lock:  # once per client, even when several threads' requests wait at the same time
            if self._said_slow:
                return
            self._said_slow = True
        if self.on_slow is not None:
            self.on_slow(url)

    @staticmethod
    def _check(resp: httpx.Response) -> httpx.Response:
        if resp.status_code < 400:
            return resp
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        message = f"{resp.request.method} {resp.request.url.path} -> {resp.status_code}: {detail}"
        if resp.status_code == 422:
            raise InvalidRequest(message, resp.status_code, detail)
        if resp.status_code == 404:
            raise NotFound(message, resp.status_code, detail)
        if resp.status_code == 401:
            raise Unauthorized(message, resp.status_code, detail)
        if resp.status_code == 403:
            raise Forbidden(message, resp.status_code, detail)
        if resp.status_code == 429:
            raise RateLimited(message, resp.status_code, detail)
        if resp.status_code in (502, 503, 504):
            raise ServiceUnavailable(message, resp.status_code, detail)
        raise KernelFleetError(message, resp.status_code, detail)

    # -- catalog -----------------------------------------------------------------------------------
    def health(self) -> bool:
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def register_workload(self, spec: Mapping[str, Any]) -> Workload:
        return Workload.model_validate(self._request("POST", "/v1/workloads", json=dict(spec)).json())

    def workloads(self, limit: int = 1000) -> list[Workload]:
        return [
            Workload.model_validate(w) for w in self._request("GET", "/v1/workloads", params={"limit": limit}).json()
        ]

    def register_target(self, spec: Mapping[str, Any]) -> Target:
        body = dict(spec)
        body.setdefault("toolchain", local_toolchain())
        return Target.model_validate(self._request("POST", "/v1/targets", json=body).json())

    def status(self) -> dict[str, Any]:
        """Jobs by state, queue depths, trials per second and workers."""
        result: dict[str, Any] = self._request("GET", "/v1/status").json()
        return result

    def workers(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", "/v1/workers").json()
        return result

    def targets(self) -> list[Target]:
        """The targets live workers serve: what a job can name (or submit with mcpu "host")."""
        return [Target.model_validate(t) for t in self._request("GET", "/v1/targets").json()]

    # -- jobs ----------------------------------------------------------------------------------------
    def submit(
        self,
        workload: Mapping[str, Any] | str,
        target: Mapping[str, Any],
        distribution: Mapping[str, Any],
        *,
        kind: str = "sketch",
        budget: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Job:
        body = {
            "kind": kind,
            "workload": workload if isinstance(workload, str) else dict(workload),
            "target": dict(target),
            "distribution": dict(distribution),
            "budget": dict(budget or {}),
            "tags": dict(tags or {}),
        }
        return Job.model_validate(self._request("POST", "/v1/jobs", json=body).json())

    def job(self, job_id: str) -> Job:
        return Job.model_validate(self._request("GET", f"/v1/jobs/{job_id}").json())

    def jobs(self, *, state: str | None = None, kind: str | None = None, limit: int = 50) -> list[Job]:
        params = {k: v for k, v in {"state": state, "kind": kind, "limit": limit}.items() if v is not None}
        return [Job.model_validate(j) for j in self._request("GET", "/v1/jobs", params=params).json()["jobs"]]

    def cancel(self, job_id: str) -> Job:
        return Job.model_validate(self._request("POST", f"/v1/jobs/{job_id}/cancel").json())

    def wait(
        self,
        job_id: str,
        *,
        timeout_s: float | None = None,
        poll_s: float = 1.0,
        progress: bool = False,
        raise_on_failure: bool = True,
        on_update: Callable[[Job], None] | None = None,
    ) -> Job:
        """Poll until the job ends; with `progress=True` draw a progress bar (needs `rich`).

        A job can succeed and publish nothing (e.g. the vendor was faster as the SDK calls both): the
        returned job then has `published` False and `publish_reason` says why, and a warning is logged."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        bar = _ProgressBar(job_id) if progress else None
        warned = False
        try:
            while True:
                job = self.job(job_id)
                if job.waiting_for_worker and not warned:
                    # the service fails the job after its no-worker deadline; until then say why it sits
                    log.warning(
                        "job %s is waiting for a worker: no live worker consumes queue %s",
                        job_id,
                        job.waiting_for_worker,
                    )
                    warned = True
                if bar:
                    bar.update(job)
                if on_update:
                    on_update(job)
                if job.done:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {job_id} still {job.state} after {timeout_s} s")
                time.sleep(poll_s)
        finally:
            if bar:
                bar.close()
        if raise_on_failure and job.state != "succeeded":
            raise JobFailed(f"job {job_id} {job.state}: {job.error}", detail=job.error)
        if job.state == "succeeded" and job.published is False:
            # succeeded, yet lookups will miss: say why instead of leaving a bare "succeeded"
            log.warning("job %s succeeded but published nothing: %s", job_id, job.publish_reason)
        return job

    # -- models ---------------------------------------------------------------------------------------
    def add_model(
        self,
        graph_or_ops: ModelGraph | Sequence[Mapping[str, Any]],
        target: Mapping[str, Any],
        *,
        histogram: Mapping[str, Mapping[int | str, float]] | None = None,
        ranges: Mapping[str, tuple[int, int]] | None = None,
        budget: Mapping[str, Any] | None = None,
        name: str | None = None,
        kind: str = "sketch",
        tags: Mapping[str, str] | None = None,
    ) -> Model:
        """Onboard a model: one job per tunable op, the budget (`{"trials": total, "min_trials": floor}`) split by
        expected FLOPs × occurrences. `graph_or_ops` is a `ModelGraph` (`kernelfleet.model_import`: each op's
        distribution comes from `histogram`/`ranges` over the model's dynamic inputs) or the request's op bodies
        (name, workload, occurrences, distribution). Ops the kind cannot tune on `target` come back `skipped`.

        A graph that names its hosts' library (`extract_torch`: PyTorch) tags the jobs `host_library` with it
        unless `tags` says otherwise: `accelerate` runs every shape a table does not give a uKernel on PyTorch,
        so the jobs time their uKernels against PyTorch alone, and a uKernel that beats PyTorch but not numpy
        still serves its shapes."""
        from kernelfleet.model_import import ModelGraph

        tags = dict(tags or {})
        if isinstance(graph_or_ops, ModelGraph):
            ops = model_ops(graph_or_ops, histogram=histogram, ranges=ranges)
            name = name or _model_name(graph_or_ops.source)
            if graph_or_ops.host_library:
                tags.setdefault(HOST_LIBRARY_TAG, graph_or_ops.host_library)
        else:
            ops = [dict(op) for op in graph_or_ops]
        body = {
            "name": name or "model",
            "kind": kind,
            "target": dict(target),
            "ops": ops,
            "budget": dict(budget or {}),
            "tags": tags,
        }
        return Model.model_validate(self._request("POST", "/v1/models", json=body).json())

    def model(self, model_id: str) -> Model:
        """A model's progress over its jobs: state, jobs done/total, trials, each op's job."""
        return Model.model_validate(self._request("GET", f"/v1/models/{model_id}").json())

    def models(self, *, name: str | None = None, limit: int = 50) -> list[Model]:
        params = {k: v for k, v in {"name": name, "limit": limit}.items() if v is not None}
        return [Model.model_validate(m) for m in self._request("GET", "/v1/models", params=params).json()["models"]]

    def cancel_model(self, model_id: str) -> Model:
        """Cancel every job of the model that has not finished."""
        return Model.model_validate(self._request("POST", f"/v1/models/{model_id}/cancel").json())

    def wait_model(
        self,
        model_id: str,
        *,
        timeout_s: float | None = None,
        poll_s: float = 1.0,
        raise_on_failure: bool = True,
        on_update: Callable[[Model], None] | None = None,
    ) -> Model:
        """Poll until every job of the model ended; returns the model once all succeeded.

        A model that ended `failed` or `cancelled` raises JobFailed naming each op whose job did not succeed, as
        `wait` does for a job (`detail`: op, job_id, state, error per such op), so a script that goes on to serve
        the model cannot take half-tuned tables for finished ones; `raise_on_failure=False` returns it instead."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            model = self.model(model_id)
            if on_update:
                on_update(model)
            if model.done:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"model {model_id} still {model.state} after {timeout_s} s")
            time.sleep(poll_s)
        if raise_on_failure and model.state != "succeeded":
            failed = [op for op in model.ops if op.job_id and op.state != "succeeded"]
            detail = [{"op": op.name, "job_id": op.job_id, "state": op.state, "error": op.error} for op in failed]
            ops = "; ".join(f"{op.name} {op.state}" + (f": {op.error}" if op.error else "") for op in failed)
            raise JobFailed(f"model {model_id} {model.state}" + (f": {ops}" if ops else ""), detail=detail)
        return model

    # -- configs ------------------------------------------------------------------------------------
    def best(self, workload: str, target: str, shape: Mapping[str, int]) -> BestConfig | None:
        """The best config for a concrete shape, or None on a miss (then run the default kernel)."""
        params = {"workload": workload, "target": target, "shape": shape_key(shape)}
        try:
            return BestConfig.model_validate(self._request("GET", "/v1/configs/best", params=params).json())
        except NotFound as exc:
            if isinstance(exc.detail, str) and "no tuned config" in exc.detail:
                return None
            raise

    def verified_best(self, workload: str, target: str, shape: Mapping[str, int]) -> BestConfig | None:
        """`best`, after checking the service signed exactly this answer (its IR is compiled by `kernel`)."""
        from kernelfleet.dispatch_cache import DispatchCache, default_cache_dir, resolve_trusted_key
        from kernelfleet.signing import verify_document

        params = {"workload": workload, "target": target, "shape": shape_key(shape)}
        try:
            resp = self._request("GET", "/v1/configs/best", params=params)
        except NotFound as exc:
            if isinstance(exc.detail, str) and "no tuned config" in exc.detail:
                return None
            raise
        key = resolve_trusted_key(self, DispatchCache(self.cache_dir or default_cache_dir()), self.trusted_key)
        signature = resp.headers.get("X-KernelFleet-Signature")
        verify_document(resp.content, workload, f"{target}:{shape_key(shape)}", signature, key, "config")
        return BestConfig.model_validate_json(resp.content)

    def configs(self, *, workload: str | None = None, target: str | None = None) -> list[BestConfig]:
        params = {k: v for k, v in {"workload": workload, "target": target}.items() if v}
        return [BestConfig.model_validate(r) for r in self._request("GET", "/v1/configs", params=params).json()]

    def create_key(self, name: str, scopes: list[str]) -> dict[str, Any]:
        """Admin: a new API key; the returned `key` secret is shown only this once."""
        result: dict[str, Any] = self._request("POST", "/v1/keys", json={"name": name, "scopes": scopes}).json()
        return result

    def api_keys(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", "/v1/keys").json()
        return result

    def revoke_key(self, key_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("POST", f"/v1/keys/{key_id}/revoke").json()
        return result

    def import_configs(self, records: list[dict[str, Any]]) -> dict[str, int]:
        result: dict[str, int] = self._request("POST", "/v1/configs/import", json={"records": records}).json()
        return result

    # -- dispatch tables ------------------------------------------------------------------------
    def dispatch_doc(
        self, workload: str, target: str, etag: str | None = None
    ) -> tuple[DispatchDoc, str | None] | None:
        """The newest dispatch table and its ETag, unverified (the dispatcher verifies); None on HTTP 304."""
        raw = self.dispatch_raw(workload, target, etag)
        return None if raw is None else (DispatchDoc.model_validate_json(raw[0]), raw[1])

    def dispatch_raw(self, workload: str, target: str, etag: str | None = None) -> tuple[bytes, str | None, str] | None:
        """(body, ETag, signature) of the newest dispatch document; None when `etag` is still current (304)."""
        headers = {"If-None-Match": etag} if etag else {}
        resp = self._request("GET", "/v1/dispatch", params={"workload": workload, "target": target}, headers=headers)
        if resp.status_code == 304:
            return None
        return resp.content, resp.headers.get("ETag"), resp.headers.get("X-KernelFleet-Signature", "")

    def artifact(self, sha256: str) -> bytes:
        """An artifact's bytes, unverified: check them against the sha256 a verified document names."""
        return self._request("GET", f"/v1/artifacts/{sha256}").content

    def signing_key(self) -> str:
        """The service's Ed25519 public key (base64) that signs dispatch documents."""
        return str(self._request("GET", "/v1/signing-key").json()["public_key"])

    def dispatcher(
        self,
        workload: str,
        target: str,
        *,
        cache_dir: Path | None = None,
        trusted_key: str | None = None,
        epilogue: Epilogue | None = None,
    ) -> Dispatcher | CudaDispatcher | BmmDispatcher | ConvDispatcher:
        """A local dispatcher for `workload` on `target`: Y = X·Wᵀ for any number of rows, no network per call.

        Fetched once (revalidated by ETag), the document's signature and every artifact's hash verified; falls
        back to the disk cache when the service cannot answer (this service's entries: the cache is keyed by the
        service's URL, kernelfleet.dispatch_cache) and to numpy when nothing verified is cached.
        `trusted_key` pins the signing key (default: $KERNELFLEET_TRUSTED_KEY, else the key this service
        presented first, kept in the cache).

        A CUDA target's table gives a `CudaDispatcher` (kernelfleet.cuda_ukernel): it takes the device tensors
        the host already has (torch CUDA tensors or anything with DLPack) and returns a device tensor, no host
        copies; on a host without a GPU it raises NoCudaDevice saying why.

        A layer tuned with a bias or an activation (workload attrs) is called as `d(x, w, bias=b)`; the table
        carries its epilogue. `epilogue` (kernelfleet.epilogue.Epilogue) tells the numpy fallback what to
        compute when no table is known, and is checked against the table's when one is.

        A batch_matmul table (several dynamic dims) gives a `BmmDispatcher` (kernelfleet.bmm_dispatcher):
        `d(a, bt)` for A[B,M,K], Bt[B,N,K]; `bmm_dispatcher` also gives one when no table is known.
        A conv2d table (an implicit GEMM over M = N·OH·OW) gives a `ConvDispatcher` (kernelfleet.conv_dispatcher):
        `d(i, f)` for NHWC I[N,H,W,CI], F[KH,KW,CI,CO]; `conv2d_dispatcher` also gives one when no table is known.
        """
        from kernelfleet.dispatch_cache import load_dispatcher

        return load_dispatcher(
            self, workload, target, cache_dir or self.cache_dir, trusted_key or self.trusted_key, epilogue
        )

    def bmm_dispatcher(
        self,
        workload: str,
        target: str,
        *,
        static: Mapping[str, int] | None = None,
        cache_dir: Path | None = None,
        trusted_key: str | None = None,
    ) -> BmmDispatcher:
        """`dispatcher` for a batch_matmul workload: C = A·Btᵀ for any tuple of its dynamic dims. With no
        verified table (service unreachable and nothing cached, or no TVM runtime) it runs numpy, every call
        a miss; `static` ({dim: size}, the workload's fixed dims) then checks the calls' shapes."""
        from kernelfleet.bmm_dispatcher import BmmDispatcher
        from kernelfleet.dispatcher import Dispatcher

        d = self.dispatcher(workload, target, cache_dir=cache_dir, trusted_key=trusted_key)
        if isinstance(d, BmmDispatcher):
            return d
        if type(d) is Dispatcher and d.table is None:  # the numpy fallback: no table was loaded
            return BmmDispatcher(None, static=static)
        raise ValueError(f"the table of {workload} on {target} is no batch_matmul table (a {type(d).__name__})")

    def conv2d_dispatcher(
        self,
        workload: str,
        target: str,
        *,
        stride: int | None = None,
        padding: int | None = None,
        cache_dir: Path | None = None,
        trusted_key: str | None = None,
    ) -> ConvDispatcher:
        """`dispatcher` for an NHWC conv2d workload: O = I ⊛ F for any (N, H, W), through the dense uKernels of
        its table over M = N·OH·OW. With no verified table (service unreachable and nothing cached, or no TVM
        runtime) it runs im2col and numpy, every call a miss: `stride` and `padding` (the workload's attrs;
        default 1 and 0) then say what to compute; with a table they must match the table's when given."""
        from kernelfleet.conv_dispatcher import ConvDispatcher, ConvGeometry
        from kernelfleet.dispatcher import Dispatcher

        d = self.dispatcher(workload, target, cache_dir=cache_dir, trusted_key=trusted_key)
        if isinstance(d, ConvDispatcher):
            g = d.geometry
            for name, given, tuned in (("stride", stride, g.stride), ("padding", padding, g.padding)):
                if given is not None and given != tuned:
                    raise ValueError(f"the table of {workload} on {target} has {name}={tuned}, not {given}")
            return d
        if type(d) is not Dispatcher or d.table is not None:  # a dense, CUDA or batch_matmul table
            raise ValueError(f"the table of {workload} on {target} is no conv2d table (a {type(d).__name__})")
        return ConvDispatcher(d, ConvGeometry(stride=1 if stride is None else stride, padding=padding or 0))

    # -- fleet -----------------------------------------------------------------------------------
    def send_telemetry(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """POST one telemetry batch; resending the same `batch_id` changes nothing (the answer says duplicate)."""
        result: dict[str, Any] = self._request("POST", "/v1/telemetry", json=dict(batch)).json()
        return result

    def telemetry_reporter(self, **kwargs: Any) -> TelemetryReporter:
        """A background reporter for dispatchers' usage: `reporter.watch(dispatcher)`, then `start()`."""
        from kernelfleet.telemetry import TelemetryReporter

        return TelemetryReporter(self, **kwargs)

    def fleet_usage(self, days: int = 7, *, workload: str | None = None, limit: int = 100) -> dict[str, Any]:
        params: dict[str, Any] = {"days": days, "limit": limit}
        if workload:
            params["workload"] = workload
        result: dict[str, Any] = self._request("GET", "/v1/fleet/usage", params=params).json()
        return result

    def fleet_reports(self, limit: int = 30) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", "/v1/fleet/reports", params={"limit": limit}).json()
        return result

    def fleet_savings(self, since: str | None = None, until: str | None = None, days: int = 7) -> dict[str, Any]:
        """The fleet's saving per day over [since, until] (ISO dates; default the last `days` days), measured by the
        hosts' A/B holdout, with its 95 % interval, per task and in total."""
        params: dict[str, Any] = {"days": days}
        params.update({k: v for k, v in (("since", since), ("until", until)) if v is not None})
        result: dict[str, Any] = self._request("GET", "/v1/fleet/savings", params=params).json()
        return result

    def run_fleet(self, day: str | None = None) -> dict[str, Any]:
        """Admin: queue the daily fleet run now (for `day`, ISO date; default today)."""
        result: dict[str, Any] = self._request("POST", "/v1/fleet/runs", json={"day": day}).json()
        return result

    def kernel(self, workload: str, target: str, shape: Mapping[str, int]) -> Any:
        """A callable kernel built from the stored best config (needs TVM); NotFound on a miss."""
        key = (workload, target, shape_key(shape))
        if key not in self._kernels:
            from kernelfleet.tvm_kernel import build_kernel

            best = self.verified_best(workload, target, shape)
            if best is None:
                raise NotFound(f"no tuned config for {key}; run the default kernel and submit a tuning job")
            self._kernels[key] = build_kernel(best.config)
        return self._kernels[key]


class _ProgressBar:
    def __init__(self, job_id: str) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}", markup=False, style="bold"),  # it may hold "[" (a job id, a name)
            BarColumn(),
            TextColumn("{task.completed}/{task.total} trials"),
            TextColumn("{task.fields[state]}"),
            TimeElapsedColumn(),
        )
        self._progress.start()
        self._task = self._progress.add_task(f"job {job_id[:8]}", total=None, state="queued")

    def update(self, job: Job) -> None:
        state = f"waiting for a worker on {job.waiting_for_worker}" if job.waiting_for_worker else job.state
        self._progress.update(self._task, total=job.trials_total or None, completed=job.trials_done, state=state)

    def close(self) -> None:
        self._progress.stop()
