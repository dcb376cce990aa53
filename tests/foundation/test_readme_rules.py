"""The README's "Where each rule lives" table names real code: every `file:function` in it
imports and resolves, and every test file it names exists (modules and tests move; a stale
row fails here, not in a reader's hands)."""

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 150


def _cells() -> list[list[str]]:
    """The cells of each row of the table (rule, homes, tests)."""
    text = README.read_text()
    section = text.split("## Where each rule lives", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("rule", "---"):
            continue
        rows.append(cells)
    return rows


def rule_rows() -> list[tuple[str, list[tuple[str, str]]]]:
    """(rule, [(file, dotted name), …]) for each row of the table."""
    return [(c[0], re.findall(r"`([\w/]+\.py):([\w.]+)`", c[1])) for c in _cells()]


def test_every_rule_names_the_test_files_that_hold_it():
    missing = []
    for rule, _homes, tests in _cells():
        files = re.findall(r"`(tests/[\w/]+\.py)`", tests)
        assert files, f"row without a test file: {rule!r}"
        missing += [f"{rule!r}: {f}" for f in files if not (ROOT / f).is_file()]
    assert not missing, "\n".join(missing)


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
