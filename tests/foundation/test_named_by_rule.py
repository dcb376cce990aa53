"""Tests, fixtures, doc sections and comments are named by the rule they hold, never by
the round, issue or helper that made them: a reader finds "the fast path" under
tests/api/, not in a folder of attacks by date. Nor does any of them send the reader to a
document the repository does not hold (a design or style guide's section numbers).

Migration files are left out on purpose: a migration's name is recorded in every deployed
database's `django_migrations` table, so one named by its issue (`0004_i24_…`) stays."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HISTORY = re.compile(
    r"\b(?:round ?\d+|round(?:three|four|five)|issue ?#?\d+|h\d{1,2}|h-[a-z]+"
    r"|broken on [0-9a-f]{7})\b",
    re.IGNORECASE,
)
# A pointer into a document outside the repository.
OUTSIDE = re.compile(
    r"\bDESIGN(?:\.md)?\s*§|\bDESIGN\.md\b|\bSTYLE(?:\.md)? (?:rule )?\d|\.\./shared/"
)
# A tracker reference ("(#22)", "#30 defect 6", "#25.12"). Not a colour ("#2e7d32" follows a
# quote), a link's anchor ("walkthrough.md#7-be-told…"), a Babel pattern ("#,##0") or a
# count in sample output (docs' code blocks are skipped).
TRACKER = re.compile(r"(?<![\w&#/\"'=(])#\d+(?:\.\d+)?(?![\w.-])|\(#\d+")
# An id labelled by a letter and a digit ("evt_a5_warm", "pur_r7"): a round's or a list's
# label, where the id should say what the test does with it ("evt_on_the_dropped_connection").
# Only Verity's and the provider's id prefixes: "no_v1" (Stripe's signature scheme) is not one.
ID_LABEL = re.compile(r"\b(?:evt|pur|op|pi|re|ch|ord|cus|py|acct|spt)_[a-z]\d{1,2}(?![a-z0-9])")
# An upstream project's public issue, cited for a bug of theirs we work around.
UPSTREAM = re.compile(r"dj-stripe #\d+")
# Files another change is editing at the moment; each entry names the one line it allows.
PENDING: dict[str, str] = {}
# Text files other than Python and docs/ that carry prose: settings, deployment, templates.
PROSE_FILES = ("pyproject.toml", ".env.example", "Makefile", "README.md")
PROSE_DIRS = ("deploy", "templates")
CODE_DIRS = (
    "tests",
    "payments",
    "recovery",
    "support",
    "webhooks",
    "acp",
    "agents",
    "events",
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
        if re.search(r"round\d|_h\d+_|attack|issue_?\d|found_by", p.name)
    ]
    assert bad == [], "\n".join(bad)


def test_no_test_or_fixture_is_named_by_history():
    name = re.compile(r"^\s*def (\w*(?:round_?\d|issue_?\d|_h\d+_|attack_?\d|found_by)\w*)", re.M)
    bad = [
        f"{p.relative_to(ROOT)}: {m.group(1)}"
        for p in (ROOT / "tests").rglob("*.py")
        for m in name.finditer(p.read_text(encoding="utf-8"))
    ]
    assert bad == [], "\n".join(bad)


def test_no_comment_or_docstring_names_a_round_an_issue_or_a_helper():
    bad = []
    for path in _python_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            text = line.split("#", 1)[1] if "#" in line else line
            if ('"""' in line or "#" in line or line.startswith(" ")) and HISTORY.search(text):
                if "<h1>" in line or "h1," in line or "h2," in line or "h1)" in line:
                    continue  # HTML headings and hash variables, not helpers
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:90]}")
    assert bad == [], "\n".join(bad)


def test_no_doc_section_is_titled_by_history():
    bad = [
        f"{p.name}: {line}"
        for p in (ROOT / "docs").rglob("*.md")
        for line in p.read_text(encoding="utf-8").splitlines()
        if line.startswith("#") and HISTORY.search(line)
    ]
    assert bad == [], "\n".join(bad)


def _outside_or_tracker(rel: str, line: str) -> bool:
    if rel in PENDING and PENDING[rel] in line:
        return False
    return bool(OUTSIDE.search(line) or TRACKER.search(UPSTREAM.sub("", line)))


def _doc_prose(path: Path):
    """(line number, line) of a Markdown file outside fenced code blocks, code spans dropped."""
    fenced = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`[^`]*`", "", line)


def test_no_doc_names_an_issue_a_round_or_a_document_outside_the_repository():
    docs = [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    bad = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()[:90]}"
        for p in docs
        for n, line in _doc_prose(p)
        if HISTORY.search(line) or _outside_or_tracker(str(p.relative_to(ROOT)), line)
    ]
    assert bad == [], "\n".join(bad)


def test_no_code_comment_or_setting_points_outside_or_at_a_tracker():
    paths = [*_python_files(), *(ROOT / f for f in PROSE_FILES)]
    for d in PROSE_DIRS:
        paths += [p for p in (ROOT / d).rglob("*") if p.is_file()]
    bad = []
    for path in paths:
        rel = str(path.relative_to(ROOT))
        if path == Path(__file__):
            continue  # the patterns themselves
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            prose = line if path.suffix == ".py" else re.sub(r"</?h\d[^>]*>", "", line)
            if _outside_or_tracker(rel, prose) or (path.suffix != ".py" and HISTORY.search(prose)):
                bad.append(f"{rel}:{n}: {line.strip()[:90]}")
    assert bad == [], "\n".join(bad)


def test_no_id_is_labelled_by_a_letter_and_a_digit():
    bad = [
        f"{path.relative_to(ROOT)}:{n}: {m.group(0)}"
        for path in _python_files()
        if path != Path(__file__).resolve()  # its examples below
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for m in ID_LABEL.finditer(line)
    ]
    assert bad == [], "\n".join(bad)


def test_an_id_label_is_seen_and_a_plain_id_is_not():
    for labelled in ('"evt_a5_warm"', '"pur_a5"', 'f"event:evt_r7_{n}"', "'op_q1'"):
        assert ID_LABEL.search(labelled), labelled
    for plain in ('"evt_warms_the_connection"', '"no_v1"', '"pi_3abc"', '"pm_card_visa"'):
        assert not ID_LABEL.search(plain), plain
