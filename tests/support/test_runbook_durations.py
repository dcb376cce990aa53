"""Runbooks quote timings as a person reads them ("3 days"), never "259200 seconds"."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_a_runbook_says_3_days_not_259200_seconds(login, settings):
    settings.RECONCILE_DEADLINE_SECONDS = 259200
    html = login("support").get("/console/runbooks/unknown-operation/").content.decode()
    assert "259200" not in html
    assert "3 days" in html
