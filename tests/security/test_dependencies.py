"""The production image installs no test or development tool, and every pin is hashed:
two hashed locks generated from pyproject.toml
(`make lock`), the production one free of development tools, the Dockerfile installing
only that one, and development installs using the same pins."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# aiohttp was listed as localstripe's server; since the x402 rail it is a production dependency
# of web3 (the x402 chain reader), so localstripe itself is what must stay out.
DEV_TOOLS = {
    "pytest",
    "pytest-django",
    "pytest-xdist",
    "factory-boy",
    "hypothesis",
    "schemathesis",
    "pip-audit",
    "pyinstrument",
    "localstripe",
    "honcho",
}
UNUSED = {"pytest-postgresql", "pytest-redis"}


def pins(lock: str) -> dict[str, str]:
    text = (ROOT / lock).read_text()
    return {
        m.group(1).lower(): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)
    }


def unhashed(lock: str) -> list[str]:
    # each requirement is "name==version \" followed by its "--hash=sha256:…" lines
    entries = re.split(r"^(?=[A-Za-z0-9_.-]+==)", (ROOT / lock).read_text(), flags=re.M)
    return [
        e.split()[0]
        for e in entries
        if re.match(r"[A-Za-z0-9_.-]+==", e) and "--hash=sha256:" not in e
    ]


def test_the_production_lock_has_no_development_tools():
    prod = pins("requirements.lock")
    assert prod, "requirements.lock is empty"
    assert not (DEV_TOOLS | UNUSED) & set(prod), sorted((DEV_TOOLS | UNUSED) & set(prod))


def test_every_locked_requirement_carries_a_hash():
    for lock in ("requirements.lock", "requirements-dev.lock"):
        assert unhashed(lock) == [], lock


def test_the_development_lock_is_the_production_lock_plus_the_dev_extra():
    prod, dev = pins("requirements.lock"), pins("requirements-dev.lock")
    assert {name: dev.get(name) for name in prod} == prod  # same pins, nothing dropped
    assert DEV_TOOLS - {"aiohttp"} <= set(dev)
    assert not UNUSED & set(dev)


def test_pyproject_keeps_development_tools_out_of_the_production_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {re.split(r"[<>=!\[; ]", r, maxsplit=1)[0].lower() for r in reqs}

    assert not (DEV_TOOLS | UNUSED) & names(project["dependencies"])
    assert DEV_TOOLS - {"aiohttp"} <= names(project["optional-dependencies"]["dev"])


def test_the_image_installs_the_production_lock_only():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG REQUIREMENTS=requirements.lock" in dockerfile
    installs = re.findall(r"pip install[^\n]*", dockerfile)
    assert installs == ["pip install --no-cache-dir --require-hashes -r ${REQUIREMENTS}"]


def test_nothing_imports_the_removed_packages():
    for path in ROOT.rglob("*.py"):
        if ".venv" in path.parts or "node_modules" in path.parts:
            continue
        text = path.read_text(errors="replace")
        assert not re.search(r"^\s*(import|from)\s+pytest_(postgresql|redis)\b", text, re.M), path
