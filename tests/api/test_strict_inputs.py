"""Every leaf of every POST body replaced by what lax parsing used to take or no JSON number can be (issue 34 items 4
and 5): NaN, ±Infinity, 1e308, 64.0, true, "64", a 100,000-character string, and 1e308 for every number of a
list or object at once (their sum is infinite). Where the OpenAPI schema refuses the value (or it is not finite),
the answer is a 422 whose loc names the field; where the schema admits it, a 2xx or a 4xx naming the field or one
above it (a check the schema cannot say, e.g. a dim the workload does not have); never a 5xx.

The routes come from the OpenAPI schema: a POST route with a JSON body and no example body here fails, so a new
route cannot slip by. The leaves are taken once per place in the schema, so each route's examples add only
the places the others did not reach.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.api.test_api import DENSE, TARGET, TOOLCHAIN, job_body
from tests.api.test_models import model_body
from tests.api.test_validation import CONV, _imported, _strict_json
from tests.helpers import replaced_at

Path = tuple[str | int, ...]
Body = dict[str, Any]
_SENTINEL = "__kf_strict_inputs__"
NON_FINITE = ("NaN", "Infinity", "-Infinity")  # raw literals: Python's json reads them, no JSON writer sends them
SUBSTITUTES: tuple[object, ...] = (1e308, 64.0, True, "64", "x" * 100_000)
HUGE = 1e308  # two of them add up to infinity


@pytest.fixture
def api(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    from service.api.state import reset_limits
    from service.models.auth import Scope
    from service.store import keys
    from service.store.db import session_scope
    from tests.conftest import _use_store

    # every per-key limit out of the way: the test sends hundreds of bodies a minute
    for limit in ("SUBMIT", "TARGET", "TELEMETRY", "LOOKUP"):
        monkeypatch.setenv(f"KERNELFLEET_{limit}_RATE_PER_MINUTE", "1000000")
    reset_limits()
    for _ in _use_store(sqlite_url, monkeypatch):
        with session_scope() as s:
            admin = keys.create(s, "strict-inputs", [Scope.admin]).key
        headers = {"Authorization": f"Bearer {admin}"}
        # a server error is an answer to report with the case that caused it, not an exception ending the test
        with TestClient(create_app(run_migrations=False), headers=headers, raise_server_exceptions=False) as client:
            yield client
    reset_limits()


# -- one or more valid bodies per route: each leaf of each is fuzzed ------------------------------------------------


def _registered(api: TestClient) -> str:
    resp = api.post("/v1/workloads", json=DENSE)
    assert resp.status_code == 201, resp.text
    workload_hash: str = resp.json()["workload_hash"]
    return workload_hash


def _today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


def _workloads(_: TestClient) -> list[Body]:
    return [
        {**DENSE, "dtype": "float32", "attrs": {"bias": True, "activation": "gelu"}},
        {**CONV, "attrs": {"stride": 1, "padding": 1}},
    ]


def _targets(_: TestClient) -> list[Body]:
    target = {**TARGET, "features": ["avx2"], "details": {"board": "x1", "l2_bytes": 1 << 20}, "toolchain": TOOLCHAIN}
    return [{**target, "metadata": {"rack": "r7", "slot": 3}}]


def _jobs(_: TestClient) -> list[Body]:
    budget = {"trials": 8, "max_shapes": 2, "seed": 3}
    explicit = {"kind": "explicit", "points": [{"shape": {"M": 4}, "weight": 0.7}, {"shape": {"M": 9}, "weight": 0.3}]}
    return [
        job_body(budget=budget, tags={"team": "nlp", "run": "7"}),
        job_body(distribution=explicit),
        job_body(distribution={"kind": "histogram", "dim": "M", "counts": {"3": 2.0, "9": 1.0}}),
        job_body(distribution={"kind": "normal", "dim": "M", "low": 1, "high": 16, "mean": 8.5, "std": 4.0}),
        job_body(distribution={"kind": "zipf", "dim": "M", "low": 1, "high": 16, "s": 1.1}),
        job_body(
            distribution={"kind": "independent", "factors": [{"kind": "uniform", "dim": "M", "low": 1, "high": 4}]}
        ),
    ]


def _models(_: TestClient) -> list[Body]:
    body = model_body(budget={"trials": 40, "min_trials": 4, "max_shapes": 2, "seed": 1}, tags={"team": "nlp"})
    body["ops"][0]["sources"] = ["layer.0.fc1"]
    return [body]


def _telemetry(_: TestClient) -> list[Body]:
    record = {"workload_hash": "ab" * 16, "target_fingerprint": "cd" * 16, "shape": {"M": 3}, "calls": 10,
              "kernel_seconds": 0.5, "fallbacks": 1, "day": _today(), "table_job_id": "job-1",
              "holdout": {"baseline": "torch", "served_calls": 6, "served_s": 0.3, "served_s2": 0.02,
                          "baseline_calls": 2, "baseline_s": 0.1, "baseline_s2": 0.006}}  # fmt: skip
    return [{"batch_id": str(uuid.uuid4()), "host": "inference-1", "records": [record, {**record, "calls": 9}]}]


def _lookups(api: TestClient) -> list[Body]:
    return [{"keys": [{"workload": _registered(api), "target": "f" * 32, "shape": {"M": 4}}]}]


def _imports(api: TestClient) -> list[Body]:
    """A config of each format imported without TVM (a trace's module is loaded by TVM, in a child, to check it)."""
    from service.tuning.gemmini.space import DEFAULT_HW

    workload_hash = _registered(api)
    pipeline = {
        "format": "pipeline-gemm",
        "arch": "sm_90",
        "gemm": {"batch": 1, "m": 4, "n": 64, "k": 32, "dtype": "float16"},
        "config": {"bm": 64, "bn": 64, "bk": 32, "tm": 4, "tn": 4, "smem_stages": 2, "async_copy": True},
    }
    gemmini = {
        "format": "gemmini-cotune",
        "layer": "gemm M=4 N=64 K=32",
        "backend": "zigzag",
        "hw": DEFAULT_HW.to_dict(),
        "mapping": {"N": 64, "K": 32, "C": 4},
        "measured_cycles": 1000.0,
    }
    return [{"records": [_imported(workload_hash, config=config)]} for config in (pipeline, gemmini)]


def _fleet_runs(_: TestClient) -> list[Body]:
    return [{"day": (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()}]


def _keys(_: TestClient) -> list[Body]:
    return [{"name": "strict inputs", "scopes": ["read", "submit"]}]


EXAMPLES: dict[str, Callable[[TestClient], list[Body]]] = {
    "/v1/workloads": _workloads,
    "/v1/targets": _targets,
    "/v1/jobs": _jobs,
    "/v1/models": _models,
    "/v1/telemetry": _telemetry,
    "/v1/configs/best/batch": _lookups,
    "/v1/configs/import": _imports,
    "/v1/fleet/runs": _fleet_runs,
    "/v1/keys": _keys,
}


def _openapi() -> dict[str, Any]:
    return create_app(run_migrations=False).openapi()


def _posts_with_a_json_body(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """POST path → the JSON schema of its body, for every POST operation of the app that takes a body."""
    out = {}
    for path, operations in schema["paths"].items():
        body = operations.get("post", {}).get("requestBody")
        if body is not None:
            content = body["content"]
            assert "application/json" in content, f"POST {path} takes {list(content)}: teach this test that body"
            out[path] = content["application/json"]["schema"]
    return out


# -- where a leaf is in the schema, and whether the schema admits a value there ------------------------------------


@dataclass(frozen=True)
class Leaf:
    schema: Any  # the JSON schema at the leaf (True: anything)
    pointer: str  # where that schema is, e.g. #/components/schemas/Zipf/properties/s: a leaf is fuzzed once per place
    union_tag: bool  # the leaf is the tag of a discriminated union (its error is the union's)


class Schema:
    """Walks the app's OpenAPI schema along a body's paths."""

    def __init__(self, openapi: dict[str, Any]) -> None:
        self.openapi = openapi

    def deref(self, node: Any, pointer: str) -> tuple[Any, str]:
        while isinstance(node, dict) and "$ref" in node:
            pointer = node["$ref"]
            node = self.openapi
            for part in pointer.removeprefix("#/").split("/"):
                node = node[part]
        return node, pointer

    def branch(self, node: Any, pointer: str, value: Any) -> tuple[Any, str]:
        """The member of a union that `value` (a container of the valid body) is validated as."""
        node, pointer = self.deref(node, pointer)
        key = next((k for k in ("oneOf", "anyOf") if isinstance(node, dict) and k in node), None)
        if key is None:
            return node, pointer
        if "discriminator" in node:
            ref = node["discriminator"]["mapping"][value[node["discriminator"]["propertyName"]]]
            return self.deref({"$ref": ref}, ref)
        wanted = "object" if isinstance(value, dict) else "array"
        members = [self.deref(m, f"{pointer}/{key}/{i}") for i, m in enumerate(node[key])]
        fitting = [(m, p) for m, p in members if isinstance(m, dict) and m.get("type") == wanted]
        assert len(fitting) == 1, f"cannot tell which member of {pointer} a {wanted} is: teach Schema.branch"
        return fitting[0]

    def leaf(self, root: Any, body: Any, path: Path) -> Leaf:
        node, pointer, value, union_tag = root, "#body", body, False
        for step in path:
            node, pointer = self.branch(node, pointer, value)
            union_tag = False
            if node is True or node == {}:  # a free-form object (a config): each of its places is its own
                node, pointer = True, f"{pointer}/{'items' if isinstance(step, int) else step}"
            elif isinstance(step, int):
                node, pointer = node["items"], f"{pointer}/items"
            elif step in node.get("properties", {}):
                union_tag = node.get("properties", {}).get(step, {}).get("const") is not None
                node, pointer = node["properties"][step], f"{pointer}/properties/{step}"
            else:
                patterns = [p for p in node.get("patternProperties", {}) if re.search(p, str(step))]
                if patterns:
                    node, pointer = node["patternProperties"][patterns[0]], f"{pointer}/patternProperties/{patterns[0]}"
                else:
                    node, pointer = node.get("additionalProperties", True), f"{pointer}/additionalProperties"
            value = value[step]
        node, pointer = self.deref(node, pointer)
        return Leaf(node, pointer, union_tag)

    def admits(self, schema: Any, value: Any) -> bool:
        """Whether `schema` (a leaf's) admits `value`; a keyword this does not know fails the test."""
        schema, _ = self.deref(schema, "")
        if schema is True or schema == {}:
            return True
        checks = {k: v for k, v in schema.items() if k not in _ANNOTATIONS}
        for union in ("anyOf", "oneOf"):
            if union in checks:
                shared = {k: v for k, v in checks.items() if k != union}  # e.g. maxLength beside int | str
                members = [self.deref(m, "")[0] for m in checks[union]]
                return any(self.admits({**m, **shared}, value) for m in members)
        unknown = set(checks) - set(_CHECKS)
        assert not unknown, f"teach Schema.admits the keywords {unknown}"
        return all(_CHECKS[k](v, value) for k, v in checks.items())


def _typed(kind: str, value: Any) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    types = {"integer": int, "number": int | float, "string": str, "null": type(None), "object": dict, "array": list}
    return isinstance(value, types[kind]) if kind in types else False


def _number(check: Callable[[float], bool]) -> Callable[[Any], bool]:
    return lambda value: not _typed("number", value) or check(value)


def _text(check: Callable[[str], bool]) -> Callable[[Any], bool]:
    return lambda value: not isinstance(value, str) or check(value)


def _formatted(fmt: str, value: Any) -> bool:
    parsers: dict[str, Callable[[str], object]] = {"date": dt.date.fromisoformat, "uuid": uuid.UUID}
    parse = parsers.get(fmt)
    assert parse is not None, f"teach this test the format {fmt}"
    try:
        parse(value)
    except ValueError:
        return False
    return True


_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "discriminator"})
_CHECKS: dict[str, Callable[[Any, Any], bool]] = {
    "type": lambda kind, value: _typed(kind, value),
    "enum": lambda choices, value: value in choices and not isinstance(value, bool | float),
    "const": lambda const, value: value == const and type(value) is type(const),
    "minimum": lambda low, value: _number(lambda v: v >= low)(value),
    "maximum": lambda high, value: _number(lambda v: v <= high)(value),
    "exclusiveMinimum": lambda low, value: _number(lambda v: v > low)(value),
    "exclusiveMaximum": lambda high, value: _number(lambda v: v < high)(value),
    "minLength": lambda n, value: _text(lambda s: len(s) >= n)(value),
    "maxLength": lambda n, value: _text(lambda s: len(s) <= n)(value),
    "pattern": lambda pattern, value: _text(lambda s: re.search(pattern, s) is not None)(value),
    "format": lambda fmt, value: _text(lambda s: _formatted(fmt, s))(value),
}
# a leaf's values are scalars, which the keywords of objects and arrays say nothing about (their "type" does)
_CHECKS.update(
    dict.fromkeys(
        ("properties", "required", "additionalProperties", "patternProperties", "minProperties", "maxProperties",
         "items", "minItems", "maxItems"),
        lambda _, value: not isinstance(value, dict | list),
    )
)  # fmt: skip


# -- the bodies sent -------------------------------------------------------------------------------------------------


def _leaves(value: Any, path: Path = ()) -> list[Path]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))]
    return [path]


def _numbers_together(body: Body) -> list[list[Path]]:
    """Groups of numbers whose sum a body may take: the numbers of one list or object, and one field's numbers
    across the objects of a list (every point's weight)."""
    numbers = [p for p in _leaves(body) if _typed("number", _at(body, p))]
    groups: dict[tuple[Any, ...], list[Path]] = {}
    for p in numbers:
        groups.setdefault(("siblings", p[:-1]), []).append(p)
        if len(p) >= 2 and isinstance(p[-2], int):
            groups.setdefault(("across", p[:-2], p[-1]), []).append(p)
    return [g for g in groups.values() if len(g) >= 2]


def _at(value: Any, path: Path) -> Any:
    for step in path:
        value = value[step]
    return value


@dataclass(frozen=True)
class Case:
    path: str
    body: Body
    paths: tuple[Path, ...]  # the leaves changed
    literal: str | None  # a raw token put in place of the leaf, not a JSON value
    value: object
    strict: bool  # the answer must be a 422 naming a changed leaf (else a 2xx also does, or one above)
    union_tag: bool

    def raw(self) -> bytes:
        body = self.body
        for p in self.paths:
            body = replaced_at(body, p, _SENTINEL if self.literal else self.value)
        text = json.dumps(body)
        return (text.replace(f'"{_SENTINEL}"', self.literal) if self.literal else text).encode()

    def describe(self) -> str:
        shown = self.literal or (repr(self.value)[:20] + "…" if len(repr(self.value)) > 20 else repr(self.value))
        return f"POST {self.path} with {'/'.join(map(str, self.paths[0]))}{'…' if len(self.paths) > 1 else ''}={shown}"


def _cases(path: str, bodies: list[Body], schema: Schema, root: Any) -> list[Case]:
    cases: list[Case] = []
    seen: set[str] = set()
    for body in bodies:
        for where in _leaves(body):
            leaf = schema.leaf(root, body, where)
            if leaf.pointer in seen:
                continue
            seen.add(leaf.pointer)
            for literal in NON_FINITE:
                cases.append(Case(path, body, (where,), literal, None, True, leaf.union_tag))
            for value in SUBSTITUTES:
                strict = not schema.admits(leaf.schema, value)
                cases.append(Case(path, body, (where,), None, value, strict, leaf.union_tag))
        for group in _numbers_together(body):
            cases.append(Case(path, body, tuple(group), None, HUGE, False, False))
    return cases


# -- the answers -----------------------------------------------------------------------------------------------------


def _depth(loc: list[str | int], path: Path, labels: frozenset[str]) -> int:
    """How far down `path` an error's loc reaches: the path's steps in order (a union's label, e.g. a distribution's
    kind, may come between them); 0 where the loc leaves the path, naming another field."""
    if loc[:1] != ["body"]:
        return 0
    matched = 0
    for step in loc[1:]:
        if matched < len(path) and step == path[matched]:
            matched += 1
        elif step not in labels:
            return 0
    return matched


def _names(loc: list[str | int], path: Path, labels: frozenset[str]) -> bool:
    return bool(path) and _depth(loc, path, labels) == len(path)


def _above(loc: list[str | int], path: Path, labels: frozenset[str]) -> bool:
    """Whether an error's loc names a field that holds the one at `path` (not the whole body)."""
    return 0 < _depth(loc, path, labels) < len(path)


def _union_labels(openapi: dict[str, Any]) -> frozenset[str]:
    """The labels pydantic puts in a loc for the member of a discriminated union: the tags' values."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            found.update(node.get("discriminator", {}).get("mapping", {}))
            for child in node.values():
                visit(child)
        elif isinstance(node, list):
            for child in node:
                visit(child)

    visit(openapi)
    return frozenset(found)


def _problem(case: Case, status: int, text: str, labels: frozenset[str]) -> str | None:
    """What is wrong with the answer, or None."""
    if status >= 500:
        return f"{status}: {text[:300]}"
    if 200 <= status < 300:
        return "accepted, but the schema refuses the value" if case.strict else None
    if status != 422:
        return f"{status} instead of 422: {text[:300]}"
    locs = [e["loc"] for e in _strict_json(text)["detail"]]
    changed = case.paths
    if any(_names(loc, p, labels) for loc in locs for p in changed):
        return None
    if case.union_tag and any(_names(loc, p[:-1], labels) for loc in locs for p in changed):
        return None  # the tag of a union is the union's: its error is at the union
    if not case.strict and any(_above(loc, p, labels) for loc in locs for p in changed):
        return None
    return f"422 naming {locs}, not the field"


def test_every_post_route_with_a_body_has_an_example() -> None:
    routes = set(_posts_with_a_json_body(_openapi()))
    assert len(routes) >= 9  # the POST routes with a body of 2026-11 (workloads, targets, jobs, models, …)
    missing = sorted(routes - set(EXAMPLES))
    assert not missing, f"give these POST routes an example body in EXAMPLES: {missing}"
    gone = sorted(set(EXAMPLES) - routes)
    assert not gone, f"these examples name no POST route with a body: {gone}"


@pytest.mark.parametrize("route", sorted(_posts_with_a_json_body(_openapi())))
def test_each_leaf_of_a_post_body_is_refused_at_its_field_or_accepted_never_a_5xx(api: TestClient, route: str) -> None:
    openapi = api.get("/openapi.json").json()
    assert route in EXAMPLES, f"POST {route} has no example body in EXAMPLES: a route without one cannot be fuzzed"
    bodies = EXAMPLES[route](api)
    for body in bodies:  # the examples themselves are valid
        resp = api.post(route, json=body)
        assert 200 <= resp.status_code < 300, (body, resp.text)
    schema = Schema(openapi)
    root = _posts_with_a_json_body(openapi)[route]
    labels = _union_labels(openapi)
    failures = []
    cases = _cases(route, bodies, schema, root)
    for case in cases:
        resp = api.post(route, content=case.raw(), headers={"Content-Type": "application/json"})
        problem = _problem(case, resp.status_code, resp.text, labels)
        if problem:
            failures.append(f"{case.describe()}: {problem}")
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures)


def test_the_schema_walker_reads_leaves_unions_and_keywords() -> None:
    """The oracle of the test above: where a leaf's schema is, and what it admits."""
    openapi = _openapi()
    schema = Schema(openapi)
    root = _posts_with_a_json_body(openapi)["/v1/jobs"]
    zipf = job_body(distribution={"kind": "zipf", "dim": "M", "low": 1, "high": 16, "s": 1.1})
    s = schema.leaf(root, zipf, ("distribution", "s"))
    assert s.pointer == "#/components/schemas/Zipf/properties/s" and not s.union_tag
    assert schema.admits(s.schema, 2) and schema.admits(s.schema, 10.0)
    assert not any(schema.admits(s.schema, v) for v in (True, "2", 10.5, 0))
    assert schema.leaf(root, zipf, ("distribution", "kind")).union_tag
    dims = schema.leaf(root, zipf, ("workload", "dims", "N"))
    assert schema.admits(dims.schema, 64) and not any(schema.admits(dims.schema, v) for v in (64.0, True, "64"))
    tags = schema.leaf(root, job_body(tags={"team": "nlp"}), ("tags", "team"))
    assert schema.admits(tags.schema, "x" * 256) and not schema.admits(tags.schema, "x" * 257)
    hashed = schema.leaf(root, job_body(workload="ab" * 16), ("workload",))
    assert schema.admits(hashed.schema, "64") and not schema.admits(hashed.schema, "x")
    labels = _union_labels(openapi)
    assert {"zipf", "explicit"} <= labels
    s_path = ("distribution", "s")
    assert _names(["body", "distribution", "zipf", "s"], s_path, labels)
    assert not _names(["body", "distribution"], s_path, labels)
    assert not _names(["body", "distribution", "zipf", "low"], s_path, labels)
    assert _above(["body", "distribution"], s_path, labels) and _above(["body", "distribution", "zipf"], s_path, labels)
    assert not _above(["body"], s_path, labels) and not _above(["body", "target"], s_path, labels)


def test_a_number_the_schema_admits_is_not_taken_for_a_problem() -> None:
    """1e308 is a finite JSON number: a field without an upper bound takes it, so the case is not strict."""
    openapi = _openapi()
    schema = Schema(openapi)
    root = _posts_with_a_json_body(openapi)["/v1/jobs"]
    normal = job_body(distribution={"kind": "normal", "dim": "M", "low": 1, "high": 16, "mean": 8.5, "std": 4.0})
    assert schema.admits(schema.leaf(root, normal, ("distribution", "mean")).schema, 1e308)
    assert math.isinf(sum([HUGE, HUGE]))
