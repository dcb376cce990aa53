"""A refusal's code is a member of payments.errors.ErrorCode, never a string typed at the
raise: the codes clients branch on are listed in one place (docs/architecture.md)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("payments", "recovery", "webhooks", "support", "agents", "acp", "audit")
TYPED = re.compile(r'DomainError\(\s*"[a-z0-9_]+"')


def test_every_domain_error_names_its_code_from_the_enum():
    found = []
    for root in RUNTIME:
        for path in sorted((ROOT / root).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for match in TYPED.finditer(path.read_text()):
                found.append(f"{path.relative_to(ROOT)}: {match.group(0)!r}")
    assert found == []


def test_the_scan_sees_a_typed_code():
    assert TYPED.search('raise DomainError(\n    "not_found", "No such operation.")')
