"""The layers of DESIGN.md §1 are a contract, not a hope (STYLE.md rule 14).

`lint-imports` checks the contracts in pyproject.toml ([tool.importlinter]): the layers
(interfaces -> workflow -> ingestion -> core -> leaves), "payments, recovery and webhooks
never import support or agents" and "only payments/providers imports stripe". It runs here
so `make test` and CI fail when an import breaks one. A second check walks the import graph
itself: no two modules of Verity's apps import each other, directly or around a circle
(a function-local import counts: it is still an import)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
APPS = ("config", "payments", "webhooks", "recovery", "support", "audit", "agents")


def test_the_import_linter_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "BROKEN" not in run.stdout and "KEPT" in run.stdout


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    # Tarjan's strongly connected components: every component larger than one module is
    # a circle of imports.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.find_modules_directly_imported_by(node):
            if nxt not in graph.modules:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_circle_of_imports_remains():
    sys.path.insert(0, str(ROOT))
    apps = [a for a in APPS if (ROOT / a / "__init__.py").exists()]
    graph = grimp.build_graph(*apps, cache_dir=None)
    # A package's __init__ importing its own submodules (re-exports) is not a circle
    # between modules; the packages themselves are left out of the walk.
    for module in list(graph.modules):
        if graph.find_children(module):
            for child in graph.find_children(module):
                if graph.direct_import_exists(importer=module, imported=child):
                    graph.remove_import(importer=module, imported=child)
    assert _cycles(graph) == []
