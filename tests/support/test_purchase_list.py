"""Support finds a caller in the purchases list by what the caller says: the ACP buyer's
name, their e-mail, the provider's id of their payment; newest first, each row once across
pages; behind the console's permission gate."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from payments.enums import PurchaseStatus
from payments.models import Purchase
from support.access import Role, ensure_groups
from tests.acp.tokens import issue_spt
from tests.support.builders import purchase_in

pytestmark = pytest.mark.django_db(transaction=True)


def _console(role: str | None) -> Client:
    ensure_groups()
    user = User.objects.create_user(f"u-{uuid.uuid4().hex[:8]}", password="x" * 20)
    if role:
        user.groups.add(Group.objects.get(name=role))
    client = Client()
    client.force_login(user)
    return client


def _rows(response) -> list[str]:
    html = response.content.decode()
    return [part.split('"', 1)[0] for part in html.split('data-purchase-row="')[1:]]


def test_support_finds_an_acp_purchase_by_buyer_name_email_and_provider_id(acp_agent, tea):
    email = f"grace-{uuid.uuid4().hex[:6]}@example.com"
    session = acp_agent.create(tea.sku).json()
    r = acp_agent.post(
        f"checkout_sessions/{session['id']}/complete",
        {
            "buyer": {"first_name": "Grace", "last_name": "Hopperton", "email": email},
            "payment_data": {"provider": "stripe", "token": issue_spt(1250)},
        },
    )
    assert r.status_code == 200, r.text
    purchase = Purchase.objects.get(pk=r.json()["order"]["id"])
    payment = purchase.operations.get()
    assert payment.provider_reference.startswith("pi_")
    other = purchase_in(PurchaseStatus.COMPLETED, customer_email="someone@example.com")
    support = _console(Role.SUPPORT)

    for q in ("hopperton", "Grace Hop", email.upper(), payment.provider_reference):
        response = support.get("/console/purchases/", {"q": q})
        assert response.status_code == 200
        assert _rows(response) == [purchase.pk], q
    page = support.get("/console/purchases/", {"q": "Hopperton"}).content.decode()
    assert email in page and "12.50 USD" in page and "Grace Hopperton" in page
    assert _rows(support.get("/console/purchases/", {"q": "12.50"})) == [purchase.pk]
    assert other.pk not in _rows(support.get("/console/purchases/", {"q": "grace"}))
    # The row opens on the purchase page, which still names the caller support searched for.
    opened = support.get(f"/console/purchases/{purchase.pk}/").content.decode()
    assert "<span data-buyer-name>Grace Hopperton</span>" in opened and email in opened


def test_a_user_without_console_access_is_refused():
    purchase_in(PurchaseStatus.COMPLETED, customer_email="caller@example.com")
    response = _console(None).get("/console/purchases/", {"q": "caller@example.com"})
    assert response.status_code == 403
    assert b"caller@example.com" not in response.content
    assert Client().get("/console/purchases/").status_code == 302  # to the login page


def test_pagination_returns_each_row_once_newest_first():
    made = [
        purchase_in(PurchaseStatus.COMPLETED, customer_email=f"p{i}@example.com") for i in range(7)
    ]
    # Three share one instant: the cursor must still neither repeat nor skip them.
    same = timezone.now() - timedelta(hours=1)
    Purchase.objects.filter(pk__in=[p.pk for p in made[:3]]).update(created_at=same)
    support = _console(Role.SUPPORT)
    seen, url, params = [], "/console/purchases/", {"per_page": "2"}
    for _ in range(10):
        response = support.get(url, params)
        assert response.status_code == 200
        seen += _rows(response)
        html = response.content.decode()
        if "data-next-page" not in html:
            break
        query = html.split('rel="next"')[0].rsplit('href="', 1)[1].split('"', 1)[0]
        url = "/console/purchases/" + query.replace("&amp;", "&")
        params = {}
    assert sorted(seen) == sorted(p.pk for p in made)
    assert len(seen) == len(set(seen)) == 7
    created = dict(Purchase.objects.values_list("pk", "created_at"))
    assert [created[p] for p in seen] == sorted((created[p] for p in seen), reverse=True)


def test_filters_narrow_the_list_by_status_amount_and_customer():
    paid = purchase_in(PurchaseStatus.COMPLETED, customer_email="a@example.com")
    failed = purchase_in(PurchaseStatus.PAYMENT_FAILED, customer_email="b@example.com")
    support = _console(Role.SUPPORT)
    assert _rows(support.get("/console/purchases/", {"status": "payment_failed"})) == [failed.pk]
    assert _rows(support.get("/console/purchases/", {"customer": "A@example.com"})) == [paid.pk]
    assert _rows(support.get("/console/purchases/", {"amount_min": "15.01"})) == []
    assert set(_rows(support.get("/console/purchases/", {"amount_max": "15.00"}))) == {
        paid.pk,
        failed.pk,
    }


def test_queue_rows_show_the_customers_email():
    from tests.support.builders import UNKNOWN

    stuck = purchase_in(
        PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN], customer_email="caller-unknown@example.com"
    )
    html = _console(Role.SUPPORT).get("/console/queues/unknown/").content.decode()
    assert stuck.pk in html
    assert "caller-unknown@example.com" in html
