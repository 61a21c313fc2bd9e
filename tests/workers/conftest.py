"""Fixtures shared by the worker tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Fleet


@pytest.fixture
def exhaustive_fleet(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Fleet]:
    """A fleet on PostgreSQL and Redis whose API and workers load the test suite's `exhaustive` kind."""
    env = {
        "KERNELFLEET_DATABASE_URL": pg_url,
        "KERNELFLEET_BROKER_URL": redis_url,
        "KERNELFLEET_PLUGINS": "tests.workers.exhaustive_kind",  # the API and the workers load the kind
        "KERNELFLEET_PUBLISH_ONLY_FASTER_THAN_VENDOR": "false",  # tiny layers: publish whatever verified
    }
    fleet = Fleet(tmp_path / "fleet", env)
    yield fleet
    fleet.stop()
