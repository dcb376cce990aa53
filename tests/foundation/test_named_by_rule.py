"""Tests, fixtures, doc sections and comments are named by the rule they hold, never by
the round, issue or helper that made them: a reader finds "the fast path" under
tests/api/, not in a folder of attacks by date."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HISTORY = re.compile(
    r"\b(?:round ?\d+|round(?:three|four|five)|issue ?#?\d+|h\d{1,2}|h-[a-z]+"
    r"|broken on [0-9a-f]{7})\b",
    re.IGNORECASE,
)
CODE_DIRS = (
    "tests",
    "payments",
    "recovery",
    "support",
    "webhooks",
    "acp",
    "agents",
    "config",
    "audit",
    "bench",
    "tools",
)


def _python_files():
    for d in CODE_DIRS:
        for path in (ROOT / d).rglob("*.py"):
            if "migrations" not in path.parts and "node_modules" not in path.parts:
                yield path


def test_no_test_file_or_folder_is_named_by_history():
    bad = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("*")
        if re.search(r"round\d|_h\d+_|attack", p.name)
    ]
    assert bad == []


def test_no_comment_or_docstring_names_a_round_an_issue_or_a_helper():
    bad = []
    for path in _python_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            text = line.split("#", 1)[1] if "#" in line else line
            if ('"""' in line or "#" in line or line.startswith(" ")) and HISTORY.search(text):
                if "<h1>" in line or "h1," in line or "h2," in line or "h1)" in line:
                    continue  # HTML headings and hash variables, not helpers
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:90]}")
    assert bad == []


def test_no_doc_section_is_titled_by_history():
    bad = [
        f"{p.name}: {line}"
        for p in (ROOT / "docs").rglob("*.md")
        for line in p.read_text(encoding="utf-8").splitlines()
        if line.startswith("#") and HISTORY.search(line)
    ]
    assert bad == []
