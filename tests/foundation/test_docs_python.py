"""A command the docs give for the reader's shell names the checkout's own Python.

A clean shell (Debian, `env -i PATH=/usr/bin:/bin`) has no `python`, only `python3`, and
outside `.venv` none of Verity's dependencies import: `python manage.py …` pasted from a
doc answers "python: command not found". The docs say `.venv/bin/python` (what `make run`
installs). Not checked: commands run inside the image (`docker compose run … python`) and
the design notes, which tell history rather than what to type."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# `python manage.py` / `python3 -m tools.x` not preceded by a path (`.venv/bin/python` is fine).
BARE = re.compile(r"(?<![\w./-])python3? (?:manage\.py|-m )")
NOT_THE_READERS_SHELL = ("docker compose", "docker run")
HISTORY = {"design-notes.md"}


def bare_python_lines(text: str) -> list[str]:
    return [
        line.strip()
        for line in text.splitlines()
        if BARE.search(line) and not any(s in line for s in NOT_THE_READERS_SHELL)
    ]


def test_the_check_sees_a_bare_python_and_lets_the_venv_pass():
    assert bare_python_lines("run `python manage.py halt list`")
    assert bare_python_lines("(`python3 -m tools.drill`)")
    assert not bare_python_lines("run `.venv/bin/python manage.py halt list`")
    assert not bare_python_lines("`docker compose run --rm web python manage.py seed_demo`")


def test_docs_give_commands_with_the_checkouts_python():
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if doc.name in HISTORY:
            continue
        found += [f"{doc.relative_to(ROOT)}: {line}" for line in bare_python_lines(doc.read_text())]
    assert not found, "use .venv/bin/python:\n" + "\n".join(found)
