"""The package layout stays as README's Layout draws it: the import contracts in pyproject.toml hold, and no
module of the service or the SDK takes part in an import cycle (imports inside functions and under
TYPE_CHECKING count: each is an edge someone must understand)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def import_cycles(modules: Iterable[str], imported_by: Callable[[str], Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(modules):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(imported_by(root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(imported_by(nxt))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_cycles_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": {"g"}, "g": {"f", "a"}}
    found = import_cycles(graph, lambda m: graph[m])
    assert sorted(found) == [["a", "b", "c"], ["f", "g"]]
    assert import_cycles({"a": {"b"}, "b": set()}, lambda m: {"a": {"b"}, "b": set()}[m]) == []


def test_no_module_of_the_service_or_the_sdk_is_in_an_import_cycle() -> None:
    graph = grimp.build_graph("service", "kernelfleet", include_external_packages=False, cache_dir=None)
    cycles = import_cycles(graph.modules, graph.find_modules_directly_imported_by)
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_import_contracts_hold() -> None:
    """pyproject.toml's [tool.importlinter] contracts: layers, the SDK standing alone, acyclic siblings."""
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
