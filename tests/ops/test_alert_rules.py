"""deploy/prometheus/alerts.yml: promtool validates the rules and runs the unit tests in
alerts_test.yml (a firing and a non-firing case per alert); every alert names an existing
runbook, and every metric it reads is exported by /metrics."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
PROMTOOL = shutil.which("promtool") or (
    "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None
)

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian package `prometheus`; .ci/run installs it)",
)


def _alerts() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PROMTOOL, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60
    )


@needs_promtool
def test_promtool_check_rules():
    result = _promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_pass():
    result = _promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_and_a_quiet_case():
    doc = yaml.safe_load(RULE_TESTS.read_text())
    firing, quiet = set(), set()
    for case in doc["tests"]:
        for t in case.get("alert_rule_test", []):
            (firing if t.get("exp_alerts") else quiet).add(t["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names == firing == quiet


def test_every_alert_names_an_existing_runbook():
    for alert in _alerts():
        path = alert["annotations"]["runbook_path"]
        m = re.fullmatch(r"/console/runbooks/([a-z0-9-]+)/", path)
        assert m, (alert["alert"], path)
        assert (ROOT / "docs" / "runbooks" / f"{m.group(1)}.md").is_file(), path
        assert path in alert["annotations"]["summary"], alert["alert"]


@pytest.mark.django_db
def test_alert_metrics_are_exported(client):
    exported = set(re.findall(r"^# TYPE (\S+) ", client.get("/metrics").content.decode(), re.M))
    used = set()
    for alert in _alerts():
        used |= set(re.findall(r"\b(verity_[a-z0-9_]+)", alert["expr"]))
    # A prometheus_client Counter `x` is exposed as `x_total` (TYPE line names `x`).
    missing = {m for m in used if m not in exported and m.removesuffix("_total") not in exported}
    assert not missing, missing
