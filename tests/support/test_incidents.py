"""Incidents: open, attach, pause a workflow from it, close with the final outcome per
purchase and a review. Role checks through the console's HTTP views; every action leaves
its audit row (written in the same transaction: a refused action changes nothing)."""

from __future__ import annotations

import pytest

from recovery.models import WorkflowHalt
from support.models import AuditEntry, Incident, IncidentItem, IncidentOutcome, IncidentStatus

pytestmark = pytest.mark.django_db

OK = {"confirm": "yes"}


def _audit(incident_id, action=None):
    qs = AuditEntry.objects.filter(target_type="incident", target_id=str(incident_id))
    return qs.filter(action=action) if action else qs


def _open(client, title="Provider timeouts"):
    r = client.post(
        "/console/incidents/open", {"title": title, "reason": "confirm calls time out", **OK}
    )
    assert r.status_code == 302
    return Incident.objects.get(title=title)


def test_incident_lifecycle_with_audit_rows(login, new_purchase, settings):
    settings.RECOVERY_OWNER_DEFAULT = "payments-oncall"
    a, b = new_purchase(), new_purchase()
    client = login("operator")
    inc = _open(client)
    assert inc.status == IncidentStatus.OPEN and inc.opened_by.username == "olga"
    assert _audit(inc.pk, "incident.open").count() == 1

    # The dashboard lists it while it is open.
    assert f'data-incident="{inc.pk}"' in client.get("/console/").content.decode()

    base = f"/console/incidents/{inc.pk}"
    client.post(f"{base}/attach", {"ref": a.pk, "reason": "customer wrote in", **OK})
    client.post(f"{base}/attach", {"ref": b.pk, "reason": "same window", **OK})
    client.post(f"{base}/attach", {"ref": a.pk, "reason": "twice", **OK})  # refused
    assert IncidentItem.objects.filter(incident=inc).count() == 2
    assert _audit(inc.pk, "incident.attach").count() == 2
    assert AuditEntry.objects.filter(action="incident.attach", purchase_id=a.pk).count() == 1

    # Pause checkout from the incident: the halt row, one audit row (the incident's).
    client.post(f"{base}/halt", {"name": "checkout", "reason": "stop new payments", **OK})
    assert WorkflowHalt.objects.filter(name="checkout").exists()
    inc.refresh_from_db()
    assert inc.halts == ["checkout"]
    assert _audit(inc.pk, "incident.halt_set").count() == 1
    assert not AuditEntry.objects.filter(target_type="workflow_halt", action="halt_set").exists()

    # Closing is refused while its halt is on, and without an outcome for every purchase.
    outcomes = {
        f"outcome-{a.pk}": IncidentOutcome.COMPLETED_FORWARD,
        f"outcome-{b.pk}": IncidentOutcome.COMPENSATED,
    }
    client.post(f"{base}/close", {"reason": "provider fixed", **outcomes, **OK})
    assert Incident.objects.get(pk=inc.pk).status == IncidentStatus.OPEN
    client.post("/console/halts/clear", {"name": "checkout", "reason": "provider fixed", **OK})
    assert not WorkflowHalt.objects.exists()
    client.post(f"{base}/close", {"reason": "review", f"outcome-{a.pk}": "completed_forward", **OK})
    assert Incident.objects.get(pk=inc.pk).status == IncidentStatus.OPEN
    assert not _audit(inc.pk, "incident.close").exists()

    client.post(
        f"{base}/close",
        {
            "reason": "Provider timeouts after send; read-backs "
            "settled both. Regression test added.",
            **outcomes,
            **OK,
        },
    )
    inc.refresh_from_db()
    assert inc.status == IncidentStatus.CLOSED and inc.closed_by.username == "olga"
    assert inc.review.startswith("Provider timeouts")
    assert dict(inc.items.values_list("purchase_id", "final_outcome")) == {
        a.pk: "completed_forward",
        b.pk: "compensated",
    }
    close = _audit(inc.pk, "incident.close").get()
    assert close.after["outcomes"] == {a.pk: "completed_forward", b.pk: "compensated"}
    assert close.ip == "127.0.0.1"
    assert (
        AuditEntry.objects.filter(
            action="incident.outcome", purchase_id=b.pk, after={"final_outcome": "compensated"}
        ).count()
        == 1
    )
    # Closed: off the dashboard, shown on the purchase page, no further changes.
    assert f'data-incident="{inc.pk}"' not in client.get("/console/").content.decode()
    assert (
        f"/console/incidents/{inc.pk}/"
        in client.get(f"/console/purchases/{a.pk}/").content.decode()
    )
    client.post(f"{base}/attach", {"ref": new_purchase().pk, "reason": "late", **OK})
    assert IncidentItem.objects.filter(incident=inc).count() == 2


@pytest.mark.parametrize("role", ["support", "finance", "nobody"])
def test_only_operators_manage_incidents(login, role, users, new_purchase):
    from support import services

    inc = services.incident_open(user=users["operator"], title="t", reason="r")
    p = new_purchase()
    before = AuditEntry.objects.count()
    client = login(role)
    assert (
        client.post("/console/incidents/open", {"title": "x", "reason": "y", **OK}).status_code
        == 403
    )
    base = f"/console/incidents/{inc.pk}"
    assert client.post(f"{base}/attach", {"ref": p.pk, "reason": "y", **OK}).status_code == 403
    assert client.post(f"{base}/halt", {"name": "checkout", "reason": "y", **OK}).status_code == 403
    assert client.post(f"{base}/close", {"reason": "y", **OK}).status_code == 403
    assert Incident.objects.count() == 1 and not IncidentItem.objects.exists()
    assert not WorkflowHalt.objects.exists()
    assert AuditEntry.objects.count() == before
    if role != "nobody":  # but they can read it
        assert client.get(f"{base}/").status_code == 200
        assert client.get("/console/incidents/").status_code == 200


def test_incident_attach_by_operation_and_unknown_refs(login, new_purchase, api_client):
    from payments import services as pay

    p = new_purchase()
    op = pay.payment_create(purchase_id=p.pk, api_client=api_client, payment_method="pm_card_visa")
    client = login("operator")
    inc = _open(client)
    client.post(f"/console/incidents/{inc.pk}/attach", {"ref": op.pk, "reason": "r", **OK})
    item = IncidentItem.objects.get(incident=inc)
    assert (item.purchase_id, item.operation_id) == (p.pk, op.pk)
    r = client.post(
        f"/console/incidents/{inc.pk}/attach",
        {"ref": "pur_doesnotexist", "reason": "r", **OK},
        follow=True,
    )
    assert "Refused (not_found)" in r.content.decode()
    assert IncidentItem.objects.filter(incident=inc).count() == 1
    assert _audit(inc.pk, "incident.attach").count() == 1


def test_demo_seed_has_an_open_incident(users):
    from io import StringIO

    from django.core.management import call_command

    from tests.factories import make_client

    make_client(name="demo-storefront")
    call_command("seed_console_demo", stdout=StringIO())
    call_command("seed_console_demo", stdout=StringIO())
    inc = Incident.objects.get(status=IncidentStatus.OPEN)
    assert inc.items.count() == 2
    assert _audit(inc.pk, "incident.open").count() == 1
