"""`seed_console_demo` (for `make run`): every queue has a case, every customer state a
link, running it twice starts the demo anew, no case resolves itself while the sweeps run,
and the refund awaiting approval is paid by the provider when finance approves it."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from payments.enums import Outcome
from payments.models import PaymentOperation, Purchase
from recovery import tasks
from recovery.models import Order
from support import selectors
from support.customer_copy import StateCode, customer_state
from support.demo import DEMO_INCIDENT_TITLE, DEMO_REFUND_CASE, demo_provider_payments_seed
from support.models import Incident
from tests.factories import make_client


def test_seed_fills_every_queue_and_prints_a_link_per_state(users):
    make_client(name="demo-storefront")
    out = StringIO()
    call_command("seed_console_demo", stdout=out)
    tokens = re.findall(r"/status/([A-Za-z0-9_-]+)/", out.getvalue())
    codes = {customer_state(Purchase.objects.get(status_token=t)).code for t in tokens}
    assert codes >= {
        StateCode.BEING_CONFIRMED,
        StateCode.PAYMENT_PENDING,
        StateCode.NOT_YET_CONFIRMABLE,
        StateCode.PAID_CONFIRMATION_DELAYED,
        StateCode.FAILED,
        StateCode.REVERSED,
        StateCode.COMPLETE,
        StateCode.UNDER_REVIEW,
        StateCode.AWAITING_PAYMENT,
    }
    summaries = selectors.queue_summaries(users["finance"])
    assert {s.spec.name for s in summaries} == set(selectors.QUEUES)
    assert all(s.count >= 1 for s in summaries), [(s.spec.name, s.count) for s in summaries]
    # Each queue's "Oldest" column has an age, as it would for rows the services wrote.
    assert all(s.oldest is not None for s in summaries), [
        s.spec.name for s in summaries if s.oldest is None
    ]
    assert selectors.money_at_risk()

    counts = (Purchase.objects.count(), PaymentOperation.objects.count())
    call_command("seed_console_demo", stdout=StringIO())
    assert (Purchase.objects.count(), PaymentOperation.objects.count()) == counts


def _demo_snapshot() -> dict:
    return {
        p.customer_reference: (
            p.status,
            sorted((o.kind, o.outcome, o.stage) for o in p.operations.all()),
        )
        for p in Purchase.objects.filter(customer_reference__startswith="demo-")
    }


@pytest.mark.django_db(transaction=True)
def test_demo_cases_stay_as_seeded_while_the_sweeps_run(users, localstripe):
    call_command("seed_demo", stdout=StringIO())
    call_command("seed_console_demo", stdout=StringIO())
    seeded = _demo_snapshot()
    # Ten minutes later: past the paid-without-order grace period of the sweep.
    later = timezone.now() - timedelta(minutes=10)
    Purchase.objects.filter(customer_reference__startswith="demo-").update(updated_at=later)

    for _ in range(3):
        for sweep in (
            tasks.reconcile_due,
            tasks.sweep_dead_dispatches,
            tasks.resume_stalled_fulfilment,
            tasks.expire_stale_purchases,
            tasks.relay_drain,
            tasks.relay_drain,
        ):
            sweep()

    assert _demo_snapshot() == seeded
    assert (
        Order.objects.filter(
            purchase_id=Purchase.objects.get(customer_reference="demo-paid-confirmation-delayed").pk
        ).count()
        == 0
    )


@pytest.mark.django_db(transaction=True)
def test_finance_approves_the_demo_refund_and_the_provider_pays_it(users, localstripe, client):
    call_command("seed_demo", stdout=StringIO())
    call_command("seed_console_demo", stdout=StringIO())
    intent = demo_provider_payments_seed()
    assert demo_provider_payments_seed() == intent  # a second banner creates nothing
    purchase = Purchase.objects.get(customer_reference=DEMO_REFUND_CASE)
    assert [pi["id"] for pi in localstripe.payment_intents_for(purchase.pk)] == [intent]
    refund = purchase.operations.get(kind="refund")

    client.force_login(users["finance"])
    client.post(
        reverse("support:refund-approve", args=[refund.pk]),
        {"reason": "customer returned the tea", "confirm": "yes"},
    )

    refunds = localstripe.refunds_for(intent)
    assert [(r["amount"], r["status"]) for r in refunds] == [(1250, "succeeded")]
    refund.refresh_from_db()
    assert refund.outcome == Outcome.SUCCEEDED and refund.provider_reference == refunds[0]["id"]
    page = client.get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    assert "refund awaiting approval" not in page.lower()


def test_a_second_seed_starts_the_demo_anew(users, client):
    make_client(name="demo-storefront")
    call_command("seed_console_demo", stdout=StringIO())
    counts = (Purchase.objects.count(), PaymentOperation.objects.count())
    refund = PaymentOperation.objects.get(
        purchase__customer_reference=DEMO_REFUND_CASE, kind="refund"
    )
    client.force_login(users["finance"])
    client.post(
        reverse("support:refund-decline", args=[refund.pk]),
        {"reason": "goods not returned", "confirm": "yes"},
    )
    assert PaymentOperation.objects.get(pk=refund.pk).outcome == Outcome.FAILED

    call_command("seed_console_demo", stdout=StringIO())

    assert (Purchase.objects.count(), PaymentOperation.objects.count()) == counts
    again = PaymentOperation.objects.get(
        purchase__customer_reference=DEMO_REFUND_CASE, kind="refund"
    )
    assert again.pk != refund.pk and again.outcome == Outcome.AWAITING_APPROVAL
    assert Incident.objects.filter(title=DEMO_INCIDENT_TITLE).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_refused_refund_says_why_and_who_acts_next(users, localstripe, client):
    # The seeded charge as it was before the demo paid it at the provider: an id the
    # provider has never seen, so the provider refuses the refund.
    make_client(name="demo-storefront")
    call_command("seed_console_demo", stdout=StringIO())
    purchase = Purchase.objects.get(customer_reference=DEMO_REFUND_CASE)
    refund = purchase.operations.get(kind="refund")
    client.force_login(users["finance"])
    client.post(
        reverse("support:refund-approve", args=[refund.pk]),
        {"reason": "customer returned the tea", "confirm": "yes"},
    )
    refund.refresh_from_db()
    assert (refund.outcome, refund.reason) == (Outcome.FAILED, "provider_refused")
    assert localstripe.refunds_for(purchase.operations.get(kind="charge").provider_reference) == []

    page = html.unescape(
        client.get(reverse("support:purchase", args=[purchase.pk])).content.decode()
    )

    assert "Nothing to do" not in page
    assert (
        f"The provider refused refund {refund.pk} of 12.50 USD: it has no record of the "
        "payment this refund would return. No money moved" in page
    )
    assert "Next: support checks the payment" in page and "Owner: support" in page


def test_demo_order_references_look_like_real_ones(users):
    make_client(name="demo-storefront")
    out = StringIO()
    call_command("seed_console_demo", stdout=out)

    refs = list(Order.objects.values_list("reference", flat=True))
    assert refs and all(r.startswith("ord_") for r in refs)
    assert "We are checking your payment" in out.getvalue() or "checking" in out.getvalue()
