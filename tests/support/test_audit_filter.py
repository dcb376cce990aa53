"""The audit log filters by who, what and which purchase: support answers "who touched this
purchase?" without reading 200 rows."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_the_audit_log_shows_only_the_rows_of_one_purchase(login, new_purchase):
    a, b = new_purchase(), new_purchase()
    client = login("support")
    for p, note in ((a, "called about a"), (b, "called about b")):
        client.post(f"/console/purchases/{p.pk}/notes", {"reason": note})
    html = client.get("/console/audit/", {"target": a.pk}).content.decode()
    assert "called about a" in html and "called about b" not in html
    html = client.get("/console/audit/", {"actor": "nobody-else"}).content.decode()
    assert "called about" not in html
