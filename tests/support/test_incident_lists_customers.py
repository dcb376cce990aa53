"""The incident page lists its purchases as support tells customers about them: the
customer's e-mail and the amount, not only an id."""

from __future__ import annotations

import pytest

from support.models import Incident

pytestmark = pytest.mark.django_db

OK = {"confirm": "yes"}


def test_the_incident_page_shows_each_purchases_email_and_amount(login, new_purchase):
    p = new_purchase(price=1250, email="caller-incident@example.com")
    client = login("operator")
    client.post(
        "/console/incidents/open", {"title": "Provider timeouts", "reason": "many unknowns", **OK}
    )
    inc = Incident.objects.get(title="Provider timeouts")
    client.post(f"/console/incidents/{inc.pk}/attach", {"ref": p.pk, "reason": "wrote in", **OK})
    assert inc.items.count() == 1
    html = client.get(f"/console/incidents/{inc.pk}/").content.decode()
    assert "caller-incident@example.com" in html
    assert "12.50 USD" in html
