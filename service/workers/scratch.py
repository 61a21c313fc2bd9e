"""Where workers keep temporary files, so that what a killed worker leaves behind is found and removed.

SIGKILL runs no `finally`: a job attempt's build and measurement files stay wherever it put them. So every
temporary file of a worker lives under one root per fleet (its store) and worker node name, e.g.
`/tmp/kernelfleet-work/3f2a…/worker0@host/`: each job attempt works in `<job id>.<lease>` there, and the
worker's own temporary files (TVM's build processes inherit TMPDIR) go to `tmp/` beside them. Celery node
names are unique among a fleet's live workers, so

- a worker starting under a node name removes that name's whole root: what is there was left by an earlier
  process of that name, which is gone (`take_over_node`);
- a worker that claims a job removes the directories of that job's earlier attempts, whichever node on this
  host ran them (`sweep_job`): their lease is gone, so nothing will read them again.

Free of Celery: the job runner and the worker's start-up call it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from service.settings import Settings

log = logging.getLogger(__name__)

# The system temp dir as the process found it: `take_over_node` points TMPDIR into a node's root afterwards.
_SYSTEM_TEMP = Path(tempfile.gettempdir())
ROOT_NAME = "kernelfleet-work"


def node_of(worker: str) -> str:
    """The Celery node name in a worker id (`worker0@host:1234` → `worker0@host`)."""
    return worker.rsplit(":", 1)[0] if ":" in worker else worker


def fleet_root(settings: Settings) -> Path:
    """This fleet's root: fleets (and test runs) sharing a host never touch each other's files."""
    store = hashlib.sha256(settings.resolved_database_url.encode()).hexdigest()[:12]
    return _SYSTEM_TEMP / ROOT_NAME / store


def node_root(settings: Settings, worker: str) -> Path:
    # a node name is whatever `-n` said: keep it one safe path component
    safe = re.sub(r"[^A-Za-z0-9@._-]", "_", node_of(worker)).lstrip(".") or "_"
    return fleet_root(settings) / safe


def attempt_dir(settings: Settings, worker: str, job_id: str, lease: str) -> Path:
    """The directory one attempt of a job works in (the job runner creates it)."""
    return node_root(settings, worker) / f"{job_id}.{lease}"


def sweep_job(settings: Settings, job_id: str, keep: Path | None = None) -> list[Path]:
    """Remove the directories earlier attempts of `job_id` left on this host (any node); returns them."""
    removed = [d for d in fleet_root(settings).glob(f"*/{job_id}.*") if d != keep]
    for d in removed:
        shutil.rmtree(d, ignore_errors=True)
    if removed:
        log.info("job %s: removed %d directories of earlier attempts", job_id, len(removed))
    return removed


def take_over_node(settings: Settings, worker: str) -> Path:
    """At a worker's start: remove what earlier processes of its node name left, and send this process's
    temporary files (and its children's, through TMPDIR) under the node's root. Returns that temp dir."""
    root = node_root(settings, worker)
    left = sorted(root.iterdir()) if root.is_dir() else []
    for path in left:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if left:
        log.warning("removed %d leftovers of an earlier worker named %s: %s", len(left), node_of(worker), left)
    tmp = root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = str(tmp)
    return tmp
