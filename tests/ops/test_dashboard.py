"""deploy/grafana/verity-webhooks.json: the webhook dashboard is valid JSON, shows the
failure counter by reason, and every metric it plots is exported by /metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "verity-webhooks.json"


def _exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


def test_the_dashboard_plots_webhook_failures_by_reason():
    assert any("verity_webhook_failures_total" in e and "by (reason)" in e for e in _exprs())


@pytest.mark.django_db
def test_dashboard_metrics_are_exported(client):
    exported = set(re.findall(r"^# TYPE (\S+) ", client.get("/metrics").content.decode(), re.M))
    used = {m for e in _exprs() for m in re.findall(r"\b(verity_[a-z_]+)", e)}
    missing = {m for m in used if m not in exported and m.removesuffix("_total") not in exported}
    assert not missing, missing
