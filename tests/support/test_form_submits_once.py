"""A console form that moves money makes its effect once (docs/console.md#one-submission-per-form).

A double-clicked "Request refund" confirm posted the same form twice: two refunds awaiting
approval, and once finance approved both, both were paid. The page now carries a one-time
token the action consumes in the transaction that makes its effect: a second POST of the
same form (sequential or concurrent) is shown the first one's result and creates nothing.
Counted in the database (refund operations, audit rows) and at localstripe (refunds).
"""

from __future__ import annotations

import html
import re
import threading

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from payments.enums import OperationKind, Outcome
from payments.models import PaymentOperation
from support.models import AuditEntry

pytestmark = pytest.mark.django_db(transaction=True)


def _refunds(purchase):
    return PaymentOperation.objects.filter(purchase=purchase, kind=OperationKind.REFUND)


def _hidden_fields(page: str, action: str) -> dict:
    """The fields the form posting to `action` sends as the page rendered it (its hidden
    inputs, the one-time token included), plus a reason and the confirmation box."""
    start = page.index(f'action="{action}"')
    form = page[start : page.index("</form>", start)]
    fields = {
        name: html.unescape(value)
        for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form)
    }
    return {"reason": "checked", "confirm": "yes", **fields}


def _echoed_confirm(client, purchase, typed: str) -> tuple[str, dict]:
    url = reverse("support:refund-request", args=[purchase.pk])
    echo = client.post(url, {"amount": typed, "reason": "damaged", "confirm": "yes"})
    assert echo.status_code == 200
    fields = _hidden_fields(echo.content.decode(), url)
    assert fields["step"] == "confirm" and fields["form_token"]
    return url, fields


def test_a_double_posted_refund_confirm_requests_and_pays_one_refund(
    login, new_purchase, pay_now, localstripe
):
    # given a paid purchase and the refund's echo page, confirmed with a double click
    purchase = new_purchase(price=1500)
    charge = pay_now(purchase)
    assert charge.outcome == Outcome.SUCCEEDED
    client = login("support")
    url, confirm = _echoed_confirm(client, purchase, "5")  # twice would still fit

    first = client.post(url, confirm, follow=True)
    second = client.post(url, confirm, follow=True)

    # then one refund is requested; the second post is shown the first one's result
    refund = _refunds(purchase).get()
    assert (refund.amount, refund.outcome) == (500, Outcome.AWAITING_APPROVAL)
    assert "Refund of 5.00 USD requested" in first.content.decode()
    assert "already submitted" in second.content.decode()
    assert refund.pk in second.content.decode()
    assert AuditEntry.objects.filter(action="console.refund_request").count() == 1

    # and finance's approval, double-clicked too, pays it once
    finance = login("finance2")
    page = finance.get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    approve_url = reverse("support:refund-approve", args=[refund.pk])
    approve = _hidden_fields(page, approve_url)
    finance.post(approve_url, approve)
    again = finance.post(approve_url, approve, follow=True)
    assert "already submitted" in again.content.decode()
    assert _refunds(purchase).get().outcome == Outcome.SUCCEEDED
    assert [r["amount"] for r in localstripe.refunds_for(charge.provider_reference)] == [500]
    assert AuditEntry.objects.filter(action="console.refund_approve").count() == 1


def test_a_refund_confirm_posted_twice_at_once_requests_one_refund(
    users, login, new_purchase, pay_now
):
    purchase = new_purchase(price=1500)
    pay_now(purchase)
    url, confirm = _echoed_confirm(login("support"), purchase, "5")
    clients = [Client(), Client()]
    for c in clients:
        c.force_login(users["support"])
    barrier = threading.Barrier(2)
    statuses, errors = [], []

    def post(c: Client) -> None:
        try:
            barrier.wait()
            statuses.append(c.post(url, confirm).status_code)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert errors == [] and statuses == [302, 302]
    assert [r.amount for r in _refunds(purchase)] == [500]
    assert AuditEntry.objects.filter(action="console.refund_request").count() == 1


def test_a_refund_confirm_without_its_token_requests_nothing(login, new_purchase, pay_now):
    purchase = new_purchase(price=1500)
    pay_now(purchase)
    client = login("support")
    url, confirm = _echoed_confirm(client, purchase, "10")
    del confirm["form_token"]

    response = client.post(url, confirm, follow=True)

    assert "form_token_missing" in response.content.decode()
    assert not _refunds(purchase).exists()


def test_a_refused_form_can_be_corrected_and_sent_again(login, new_purchase, pay_now):
    """A refusal made nothing: the token is not spent by it (its one transaction rolls it back)."""
    purchase = new_purchase(price=1500)
    pay_now(purchase)
    client = login("support")
    url, confirm = _echoed_confirm(client, purchase, "10")

    refused = client.post(url, {**confirm, "reason": " "}, follow=True)
    assert "reason_required" in refused.content.decode()
    client.post(url, confirm)

    assert [r.amount for r in _refunds(purchase)] == [1000]
