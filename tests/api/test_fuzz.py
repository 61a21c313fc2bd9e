"""Schema-driven fuzzing of the whole API (schemathesis), in-process against a real SQLite store.

Bounded example counts keep it inside `make test`; every operation is called with generated valid
and invalid inputs, and no response may be a 5xx or disagree with the OpenAPI schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.schemas import APIOperation
from schemathesis.specs.openapi.checks import response_schema_conformance

from service.api.app import create_app
from service.models.auth import Scope
from service.store import keys
from service.store.db import session_scope

Operation = APIOperation[Any, Any, Any, Any]


@pytest.fixture
def api_schema(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[schemathesis.BaseSchema]:
    from service.api.state import reset_limits
    from tests.conftest import _use_store

    # 25 cases an operation with one key (batch lookups of up to 1,000 keys): no limit may answer for the schema
    for limit in ("SUBMIT", "TARGET", "LOOKUP"):
        monkeypatch.setenv(f"KERNELFLEET_{limit}_RATE_PER_MINUTE", "1e9")
    monkeypatch.setenv("KERNELFLEET_AUTH_FAILURES_PER_MINUTE", "1e9")
    reset_limits()
    for _ in _use_store(sqlite_url, monkeypatch):
        with session_scope() as s:
            admin = keys.create(s, "fuzz", [Scope.admin]).key
        schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(run_migrations=False))
        schema.config.headers = {"Authorization": f"Bearer {admin}"}
        yield schema
    reset_limits()


def _operations(schema: schemathesis.BaseSchema) -> list[Operation]:
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # an operation schemathesis cannot read is a failure of its own
        operations.append(result.ok())
    return operations


def test_no_server_errors_and_responses_match_the_schema(api_schema: schemathesis.BaseSchema) -> None:
    failures: list[str] = []
    operations = _operations(api_schema)
    assert len(operations) >= 15
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def exercise(case: schemathesis.Case[Operation]) -> None:
            case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])

        try:
            exercise()
        except Exception as exc:  # collect every operation's failure, not just the first
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:600]}")
    assert not failures, "\n\n".join(failures)


NON_FINITE_LITERALS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"]
_SENTINEL = "__kf_non_finite__"


def _positions(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        out += [p for k, v in value.items() for p in _positions(v, (*path, k))]
    elif isinstance(value, list):
        out += [p for i, v in enumerate(value) for p in _positions(v, (*path, i))]
    return out


def _replace(value: Any, path: tuple[Any, ...]) -> Any:
    if not path:
        return _SENTINEL
    if isinstance(value, dict):
        return {k: _replace(v, path[1:]) if k == path[0] else v for k, v in value.items()}
    return [_replace(v, path[1:]) if i == path[0] else v for i, v in enumerate(value)]


def _strict(text: str) -> Any:
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"response holds {c}, which is not JSON"))


def test_non_finite_numbers_anywhere_in_a_body_never_give_5xx(api_schema: schemathesis.BaseSchema) -> None:
    """Schemathesis' bodies with NaN, ±Infinity or 1e400 (which Python's json reads as inf) put at any position:
    JSON has no such numbers, so schemathesis never sends them by itself."""
    failures: list[str] = []
    operations = _operations(api_schema)
    with_body = [op for op in operations if op.body]
    assert len(with_body) >= 6
    client = TestClient(api_schema.app, headers=api_schema.config.headers or {})
    for operation in with_body:

        @given(case=operation.as_strategy(), data=st.data())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def exercise(case: schemathesis.Case[Operation], data: st.DataObject) -> None:
            body = case.body if isinstance(case.body, dict | list) else {}
            where = data.draw(st.sampled_from(_positions(body)), label="where")
            literal = data.draw(st.sampled_from(NON_FINITE_LITERALS), label="literal")
            raw = json.dumps(_replace(body, where)).replace(f'"{_SENTINEL}"', literal)
            resp = client.request(
                case.method,
                case.formatted_path,
                params=case.query,
                content=raw.encode(),
                headers={"Content-Type": "application/json"},
            )
            assert resp.status_code < 500, (raw, resp.text)
            if resp.content:
                answer = _strict(resp.text)
                if resp.status_code == 422:
                    for error in answer["detail"]:
                        assert all(isinstance(p, str | int) for p in error["loc"]), error
                        assert not any(str(p).startswith("function-") for p in error["loc"]), error

        try:
            exercise()
        except Exception as exc:
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:600]}")
    client.close()
    assert not failures, "\n\n".join(failures)
