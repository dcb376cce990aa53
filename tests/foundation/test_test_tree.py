"""The test tree's own shape. A conftest.py is pytest's, not an importable module: a test
that imports one runs it a second time under another name (its fixtures registered twice,
its module-level code run twice) and ties the test to where a helper happens to live.
Helpers live in a module named for what they hold (tests/api/client.py,
tests/webhooks/events.py, tests/localstripe.py, ...); fixtures every folder uses live in
tests/fixtures.py."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _conftest_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [a.name for a in node.names]
            if module.split(".")[-1] == "conftest" or "conftest" in names:
                found.append(f"line {node.lineno}: from {'.' * node.level}{module} import ...")
        elif isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.split(".")[-1] == "conftest"
            ]
    return found


def test_no_module_imports_a_conftest():
    bad = [
        f"{path.relative_to(TESTS.parent)} {where}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name != "conftest.py"
        for where in _conftest_imports(path)
    ]
    assert bad == [], "\n".join(bad)


def test_the_check_sees_every_form_of_import(tmp_path):
    forms = [
        "from tests.api.conftest import Api",
        "from .conftest import sign",
        "from tests.api import conftest",
        "from . import conftest",
        "import tests.webhooks.conftest",
        "def f():\n    from tests.conftest import wait_for",
    ]
    for n, form in enumerate(forms):
        module = tmp_path / f"m{n}.py"
        module.write_text(form + "\n")
        assert _conftest_imports(module), form
    clean = tmp_path / "clean.py"
    clean.write_text("from tests.api.client import Api\nimport conftest_notes\n")
    assert _conftest_imports(clean) == []
