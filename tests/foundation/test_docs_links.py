"""Every `docs/<file>.md#<section>` a runtime comment links to exists.

Code comments point at docs/ for the rules they rely on (the design contract is not in the
repository); a renamed section or a typo would send the reader nowhere again."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = (
    "payments",
    "recovery",
    "webhooks",
    "support",
    "agents",
    "acp",
    "events",
    "audit",
    "config",
    "tools",
)
LINK = re.compile(r"docs/([\w/.-]+?\.md)(?:#([\w-]+))?")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces -> '-'."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    return {
        github_slug(line.lstrip("#"))
        for line in doc.read_text().splitlines()
        if line.startswith("#")
    }


def test_slug_matches_github():
    assert github_slug("The provider's record outranks a person") == (
        "the-providers-record-outranks-a-person"
    )
    assert github_slug("Create, then claim, then confirm") == "create-then-claim-then-confirm"


def test_every_docs_link_in_runtime_code_resolves():
    broken = []
    for package in RUNTIME:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or "node_modules" in path.parts:
                continue
            for match in LINK.finditer(path.read_text()):
                doc = ROOT / "docs" / match.group(1)
                where = f"{path.relative_to(ROOT)}: {match.group(0)}"
                if not doc.is_file():
                    broken.append(where + " (no such file)")
                elif match.group(2) and match.group(2) not in anchors(doc):
                    broken.append(where + " (no such section)")
    assert not broken, "\n".join(broken)


# A repository path in a doc, in backticks (`payments/locks.py`, `payments/providers/x402/`),
# optionally with a function or class after a colon (`payments/locks.py:signer_lock`).
# Not a dotted name (`recovery.halts.halt_set/halt_clear`), not one folder alone (`control/`,
# a folder of var/), not a migration by app and number (`payments/0003`).
DOC_PATH = re.compile(r"`((?:[\w-]+/)+(?:[\w-]+\.[a-z]+)?)(?::(\w+))?`")
# A path followed by the name it holds (`payments/locks.py` `signer_lock`).
PATH_THEN_NAME = re.compile(r"`((?:[\w-]+/)+[\w-]+\.py)` `(\w+)`")
# A dotted module name ending in a function or class (`services.dispatch._claim`,
# `payments.money.format_money`), two dots at least (`events.deliver_due` is a task's
# name, `console.void` a permission's); checked when its module is one file of the repository.
DOTTED = re.compile(r"`((?:[a-z_][a-z0-9_]*\.){2,}[A-Za-z_]\w*)(?:\(\))?`")
# Paths that name what a run creates or a place outside the checkout, not a file of it.
NOT_REPO = ("var/", "tmp/", ".venv/")


def _repo_files() -> set[str]:
    skip = {".git", "node_modules", ".venv", "var", "__pycache__"}
    return {
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*")
        if not skip.intersection(p.relative_to(ROOT).parts)
    }


def _exists(path: str, files: set[str]) -> bool:
    """A path from the root, or a shorter path a doc uses inside its own app
    (`services/manual.py` in the payments notes) that ends a real one."""
    path = path.rstrip("/")
    return path in files or any(f.endswith("/" + path) for f in files)


def _defines(path: Path, name: str) -> bool:
    return bool(
        re.search(rf"^\s*(?:async def|def|class) {name}\b|^{name}\s*[:=]", path.read_text(), re.M)
    )


def test_every_repo_path_a_doc_names_exists():
    files = _repo_files()
    broken = []
    for doc in sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]):
        text = doc.read_text()
        for match in DOC_PATH.finditer(text):
            path, name = match.groups()
            parts = path.rstrip("/").split("/")
            if (
                path.startswith(NOT_REPO)
                or "node_modules" in parts
                or (len(parts) == 1 and path.endswith("/"))
                or any(part[0].isdigit() for part in parts)
            ):
                continue
            line = text.count("\n", 0, match.start()) + 1
            where = f"{doc.relative_to(ROOT)}:{line}: {match.group(0)}"
            if not _exists(path, files):
                broken.append(where + " (no such file)")
            elif name and path in files and not _defines(ROOT / path, name):
                broken.append(where + f" (no {name} in it)")
    assert not broken, "\n".join(broken)


def _module_file(dotted: str, files: set[str]) -> str | None:
    path = dotted.replace(".", "/") + ".py"
    found = sorted(f for f in files if f == path or f.endswith("/" + path))
    return found[0] if len(found) == 1 else None


def test_every_function_a_doc_names_in_a_module_exists():
    files = _repo_files()
    broken = []
    for doc in sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]):
        text = doc.read_text()
        named = [(m, *m.groups()) for m in PATH_THEN_NAME.finditer(text)]
        for m in DOTTED.finditer(text):
            module, _, name = m.group(1).rpartition(".")
            path = _module_file(module, files)
            if path and not _module_file(m.group(1), files):
                named.append((m, path, name))
        for match, path, name in named:
            if path in files and not _defines(ROOT / path, name):
                line = text.count("\n", 0, match.start()) + 1
                broken.append(f"{doc.relative_to(ROOT)}:{line}: {match.group(0)} (no {name})")
    assert not broken, "\n".join(broken)
