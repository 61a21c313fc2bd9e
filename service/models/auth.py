"""API keys and the scopes they grant."""

from __future__ import annotations

import datetime as dt
import enum

from pydantic import BaseModel, ConfigDict, Field


class Scope(enum.StrEnum):
    read = "read"  # lookups, dispatch tables, artifacts, job status
    telemetry = "telemetry"  # inference hosts reporting what they ran
    submit = "submit"  # jobs, workloads and targets
    admin = "admin"  # keys, imports, cancelling others' jobs; implies every other scope


class ApiKeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9 _.@:-]+$")
    scopes: list[Scope] = Field(min_length=1, max_length=4)


class ApiKeyView(BaseModel):
    id: str
    name: str
    prefix: str = Field(description="the first characters of the key, to recognise it")
    scopes: list[Scope]
    created_at: dt.datetime
    revoked_at: dt.datetime | None


class ApiKeyCreated(ApiKeyView):
    key: str = Field(description="the secret; shown once, stored only as a hash")
