"""Schema-driven fuzzing of the whole API (schemathesis), in-process against a real SQLite store.

Bounded example counts keep it inside `make test`; every operation is called with generated valid
and invalid inputs, and no response may be a 5xx or disagree with the OpenAPI schema.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from service.api.app import create_app
from service.models.auth import Scope
from service.store import keys
from service.store.db import session_scope


@pytest.fixture
def api_schema(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[schemathesis.BaseSchema]:
    from service.api.state import submit_bucket
    from tests.conftest import _use_store

    monkeypatch.setenv("KERNELFLEET_SUBMIT_RATE_PER_MINUTE", "100000")
    submit_bucket.cache_clear()
    for _ in _use_store(sqlite_url, monkeypatch):
        with session_scope() as s:
            admin = keys.create(s, "fuzz", [Scope.admin]).key
        schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(run_migrations=False))
        schema.config.headers = {"Authorization": f"Bearer {admin}"}
        yield schema
    submit_bucket.cache_clear()


def test_no_server_errors_and_responses_match_the_schema(api_schema: schemathesis.BaseSchema) -> None:
    failures: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 15
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def exercise(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])

        try:
            exercise()
        except Exception as exc:  # collect every operation's failure, not just the first
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:600]}")
    assert not failures, "\n\n".join(failures)
