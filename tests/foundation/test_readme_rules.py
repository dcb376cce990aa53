"""The README's "Where each rule lives" table names real code: every `file:function` in it
imports and resolves (modules move; a stale row fails here, not in a reader's hands)."""

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 150


def rule_rows() -> list[tuple[str, list[tuple[str, str]]]]:
    """(rule, [(file, dotted name), …]) for each row of the table."""
    text = README.read_text()
    section = text.split("## Where each rule lives", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("rule", "---"):
            continue
        homes = re.findall(r"`([\w/]+\.py):([\w.]+)`", cells[1])
        rows.append((cells[0], homes))
    return rows


def resolve(path: str, dotted: str):
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    obj = module
    for name in dotted.split("."):
        obj = getattr(obj, name)  # AttributeError names the stale row
    return obj


def test_every_rule_in_the_readme_points_at_a_function_that_exists():
    rows = rule_rows()
    assert len(rows) >= 20, "the README lost its rule table"
    missing = []
    for rule, homes in rows:
        assert homes, f"row without a file:function: {rule!r}"
        for path, dotted in homes:
            assert (ROOT / path).is_file(), f"{rule!r}: {path} does not exist"
            try:
                assert callable(resolve(path, dotted)), f"{path}:{dotted} is not callable"
            except (ImportError, AttributeError) as exc:
                missing.append(f"{rule!r}: {path}:{dotted} ({exc})")
    assert not missing, "\n".join(missing)


def test_the_readme_stays_short():
    assert len(README.read_text().splitlines()) <= README_MAX_LINES
