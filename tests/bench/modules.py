"""Load a script under bench/ (not a package) as a module, for tests that call its functions directly."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    if str(ROOT / "bench") not in sys.path:  # scripts import bench/common.py as `common`, as `python bench/x.py` does
        sys.path.insert(0, str(ROOT / "bench"))
    key = f"bench_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # dataclasses look their module up here while the class is created
    spec.loader.exec_module(module)
    return module
