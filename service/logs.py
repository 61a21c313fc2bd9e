"""Structured logging: one JSON object per line, with the job id when a record concerns a job."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from typing import Any


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        job_id = getattr(record, "job_id", None)
        if job_id:
            doc["job_id"] = job_id
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure(level: str | None = None) -> None:
    """Root logging from KERNELFLEET_LOG_LEVEL and KERNELFLEET_LOG_FORMAT (json | text)."""
    handler = logging.StreamHandler()
    if os.environ.get("KERNELFLEET_LOG_FORMAT", "text") == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level or os.environ.get("KERNELFLEET_LOG_LEVEL", "INFO"))


def for_job(logger: logging.Logger, job_id: str) -> logging.LoggerAdapter[logging.Logger]:
    return logging.LoggerAdapter(logger, {"job_id": job_id})
