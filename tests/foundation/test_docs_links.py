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
