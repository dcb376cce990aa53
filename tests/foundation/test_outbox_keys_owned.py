"""An outbox message's dedupe key is built in one place: the outbox's named helper.

Two writers of "read this operation back" must agree on its key, or the pending message
no longer absorbs the second one (two read-backs) and "make it due now" misses the row
it means. `recovery.outbox.reconcile_put` owns `reconcile:<operation id>` (and an event's
own `reconcile:<operation id>:<event id>`); this scan fails when any other runtime module
spells the key's prefix in a string or an f-string.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = (
    "config",
    "payments",
    "recovery",
    "webhooks",
    "support",
    "agents",
    "acp",
    "audit",
    "events",
)
# Key prefix -> the one module that may build it.
OWNED = {"reconcile:": "recovery/outbox.py"}


def _string_starts(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string literal and every f-string's leading literal part."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((node.lineno, first.value))
    return found


def _builders(prefix: str) -> list[str]:
    where: list[str] = []
    for package in RUNTIME:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            for line, text in _string_starts(tree):
                site = f"{path.relative_to(ROOT)}:{line}"
                if text.startswith(prefix) and site not in where:
                    where.append(site)
    return where


def test_only_the_outbox_builds_the_reconcile_key():
    for prefix, owner in OWNED.items():
        builders = _builders(prefix)
        assert builders, f"{owner} no longer builds {prefix!r}: update this test"
        elsewhere = [b for b in builders if not b.startswith(owner + ":")]
        assert elsewhere == [], (
            f"{prefix!r} keys are built by {owner} only (its named helper): {elsewhere}"
        )
