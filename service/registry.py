"""Named implementations of one interface, looked up by name (job kinds, hardware platforms).

Built-ins are listed as "module:attribute" and imported on first use, so looking one up never imports
more than it needs (the API process validates jobs without loading TVM). Deployments and tests add their
own implementations as plugins: modules named in `KERNELFLEET_PLUGINS` (comma-separated) are imported
once, before the first lookup, and call `register` at import time. Plugins are configured by whoever
runs the service, never by job submitters: no user-supplied code reaches a worker.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Mapping
from typing import Generic, TypeVar

T = TypeVar("T")

_plugins_lock = threading.Lock()
_plugins_loaded: set[str] = set()


def load_plugins() -> None:
    """Import the modules named in KERNELFLEET_PLUGINS (each at most once per process)."""
    names = [n.strip() for n in os.environ.get("KERNELFLEET_PLUGINS", "").split(",") if n.strip()]
    with _plugins_lock:
        for name in names:
            if name not in _plugins_loaded:
                _plugins_loaded.add(name)
                importlib.import_module(name)


class Registry(Generic[T]):
    """`what` names the interface in error messages ("job kind", "platform")."""

    def __init__(self, what: str, builtins: Mapping[str, str]) -> None:
        self.what = what
        self._builtins = dict(builtins)
        self._loaded: dict[str, T] = {}
        self._lock = threading.Lock()

    def register(self, name: str, implementation: T) -> T:
        with self._lock:
            self._loaded[name] = implementation
        return implementation

    def names(self) -> list[str]:
        load_plugins()
        return sorted(set(self._builtins) | set(self._loaded))

    def get(self, name: str) -> T:
        load_plugins()
        found = self._loaded.get(name)
        if found is not None:
            return found
        path = self._builtins.get(name)
        if path is None:
            raise KeyError(f"unknown {self.what} {name!r}; known: {', '.join(self.names())}")
        module, _, attribute = path.partition(":")
        implementation: T = getattr(importlib.import_module(module), attribute)()
        with self._lock:
            return self._loaded.setdefault(name, implementation)

    def all(self) -> list[T]:
        return [self.get(name) for name in self.names()]
