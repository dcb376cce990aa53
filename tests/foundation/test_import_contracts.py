"""The layers of docs/architecture.md are a contract, not a hope: a check, not a review.

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
APPS = ("config", "payments", "webhooks", "recovery", "support", "audit", "agents", "events")


def test_the_import_linter_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
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


# -- every module has a layer ---------------------------------------------------------------

# The composition root: settings, URL conf, WSGI/ASGI and the Celery app.
# It wires every layer together, so it sits in none; tools/ (development servers,
# never imported by the runtime: a contract of its own) neither. The other roots are layered.
UNLAYERED_ROOTS = {"config", "tools"}


def _importlinter() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _layer_entries() -> list[str]:
    contract = next(c for c in _importlinter()["contracts"] if c["id"] == "layers")
    return [
        name.strip() for layer in contract["layers"] for name in layer.replace("|", ":").split(":")
    ]


def _project_modules(root: str) -> list[str]:
    """Every module and package under `root`, from the files (not from imports, so a module
    nothing imports yet is still found)."""
    found = []
    for path in sorted((ROOT / root).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append(".".join(parts))
    return found


def _unplaced(modules: list[str], entries: list[str]) -> list[str]:
    def placed(module: str) -> bool:
        return any(module == e or module.startswith(e + ".") for e in entries)

    def container(module: str) -> bool:
        # A package split across layers (payments, recovery): its children are placed.
        return any(e.startswith(module + ".") for e in entries)

    return [m for m in modules if not placed(m) and not container(m)]


def test_every_module_of_the_project_belongs_to_a_layer():
    """A module no layer names is checked by no layer rule: it could import anything. Each
    new module is placed in pyproject.toml's layers on purpose."""
    roots = set(_importlinter()["root_packages"]) - UNLAYERED_ROOTS
    entries = _layer_entries()
    modules = [m for root in sorted(roots) for m in _project_modules(root)]
    assert len(modules) > 150  # the walk found the project, not an empty directory
    assert _unplaced(modules, entries) == []
    for entry in entries:  # and no entry names a module that is gone (a stale layer)
        assert entry in modules, entry


def test_a_module_in_no_layer_is_reported():
    entries = ["payments.api", "payments.models", "recovery.outbox"]
    modules = [
        "payments",
        "payments.api",
        "payments.api.views",
        "payments.models",
        "payments.newcomer",
        "recovery",
        "recovery.outbox",
        "recovery.stray",
    ]
    assert _unplaced(modules, entries) == ["payments.newcomer", "recovery.stray"]
