"""Edges of the lifecycle on the real stack: a void after fulfilment, a cancel before and
after payment, a late provider event, a refund during a run, a person's word graded.

Each test counts effects at localstripe and in the database.
"""

import threading
import time

import pytest
import requests
from django.conf import settings
from django.contrib.auth.models import Group
from django.db import connection, transaction

from payments import services
from payments.enums import Outcome, PurchaseStatus
from payments.models import PaymentOperation, Product, ProviderCall, Purchase
from payments.providers.stripe import DrillMode
from recovery import orchestrator
from recovery.models import CrmUpdate, EmailMessage, Order, StepRun
from support.access import Role
from tests.localstripe import provider_object
from tests.webhooks.events import event_for, post

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_lifecycle_edges"


@pytest.fixture
def deliver_event(settings, client):
    from webhooks.models import ProviderEvent
    from webhooks.services import event_process

    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_WEBHOOK_TOLERANCE = 300
    settings.STRIPE_ACCOUNT = ""

    def run(event: dict):
        assert post(client, event, secret=SECRET).status_code == 200
        stored = ProviderEvent.objects.get(event_id=event["id"])
        event_process(event_id=stored.pk)
        return ProviderEvent.objects.get(pk=stored.pk)

    return run


@pytest.fixture
def post_api(client, client_and_key):
    """POST to the storefront API as the purchase's own client."""
    counter = {"n": 0}

    def call(path: str, body: dict | None = None, key: str | None = None):
        counter["n"] += 1
        return client.post(
            f"/api/v1/{path}",
            data=body or {},
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=key or f"k-{counter['n']}-{time.time()}",
            HTTP_AUTHORIZATION=f"Api-Key {client_and_key[1]}",
        )

    return call


def _person(django_user_model, name: str, role: Role):
    user = django_user_model.objects.create(username=name)
    user.groups.add(Group.objects.get_or_create(name=role.value)[0])
    return user


def _paid(new_purchase, api_client, capture="automatic"):
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method="pm_card_visa",
        capture_method=capture,
    )
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.SUCCEEDED
    return purchase, op


def _status(purchase) -> str:
    return Purchase.objects.get(pk=purchase.pk).status


# -- defect 5: a void after fulfilment ---------------------------------------------------


def test_api_void_after_fulfilment_is_refused_with_next_action(
    new_purchase, api_client, post_api, localstripe
):
    purchase, auth = _paid(new_purchase, api_client, capture="manual")
    assert orchestrator.purchase_fulfil(purchase_id=purchase.id) == orchestrator.COMPLETED

    r = post_api(f"purchases/{purchase.id}/void")

    assert r.status_code == 409, r.content
    body = r.json()
    assert body["code"] == "fulfilment_started"
    assert "Capture" in body["next_action"]["message"]
    assert not PaymentOperation.objects.filter(purchase=purchase, kind="void").exists()
    assert (
        provider_object("payment_intents", auth.provider_reference)["status"] == "requires_capture"
    )
    assert _status(purchase) == PurchaseStatus.COMPLETED


def test_console_void_after_fulfilment_voids_and_cancels_the_order(
    new_purchase, api_client, django_user_model, localstripe
):
    from support.services import void_by_user

    purchase, auth = _paid(new_purchase, api_client, capture="manual")
    assert orchestrator.purchase_fulfil(purchase_id=purchase.id) == orchestrator.COMPLETED
    operator = _person(django_user_model, "op-void", Role.OPERATOR)

    void = void_by_user(
        purchase_id=purchase.id,
        user=operator,
        reason="goods returned to the warehouse before capture",
    )

    assert void.outcome == Outcome.SUCCEEDED
    assert provider_object("payment_intents", auth.provider_reference)["status"] == "canceled"
    assert _status(purchase) == PurchaseStatus.VOIDED
    # the compensating steps follow the provider's confirmation (outbox follow-up)
    orchestrator.operation_settled(operation_id=void.id)
    assert Order.objects.get(purchase_id=purchase.id).cancelled_at is not None
    from support.models import AuditEntry

    assert AuditEntry.objects.filter(action="console.void", purchase_id=purchase.id).count() == 1


# -- defect 10: payment_intent.canceled after a void ---------------------------------------


def test_canceled_event_after_a_void_is_agreeing_evidence(
    new_purchase, api_client, post_api, deliver_event
):
    purchase, auth = _paid(new_purchase, api_client, capture="manual")
    r = post_api(f"purchases/{purchase.id}/void")
    assert r.status_code == 201, r.content
    void = PaymentOperation.objects.get(purchase=purchase, kind="void")
    pi = provider_object("payment_intents", auth.provider_reference)
    assert pi["status"] == "canceled"

    event = deliver_event(event_for(pi, "payment_intent.canceled"))

    assert (event.result, event.result_reason) == ("applied", "agrees_with_void")
    assert event.operation_id == void.id
    assert PaymentOperation.objects.get(pk=auth.pk).outcome == Outcome.SUCCEEDED
    assert _status(purchase) == PurchaseStatus.VOIDED


# -- defect 4: words follow the grade --------------------------------------------------------


def test_a_refund_resolved_by_a_person_is_never_called_provider_confirmed(
    new_purchase, api_client, drill, read_drill, django_user_model
):
    from agents.tools import operation_result
    from payments.api.presenters import operation_next_action
    from support.customer_copy import customer_state

    purchase, _charge = _paid(new_purchase, api_client)
    asker = _person(django_user_model, "asker", Role.SUPPORT)
    approver = _person(django_user_model, "approver", Role.FINANCE)
    refund = services.refund_request(purchase_id=purchase.id, acting_user=asker)
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="ok")
    drill(refund, DrillMode.DROP_RESPONSE_AFTER_SEND, step="refund")
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.UNKNOWN
    read_drill("*", times=1)  # the refund cannot be read back
    refund = services.operation_resolve_manual(
        operation_id=refund.id,
        outcome="succeeded",
        reason="provider dashboard shows it",
        actor="approver",
        acting_user=approver,
    )
    assert (refund.grade, refund.verification) == ("acknowledged", "manual")

    customer = customer_state(Purchase.objects.get(pk=purchase.pk))
    api_words = operation_next_action(PaymentOperation.objects.get(pk=refund.pk))["message"]
    mcp_words = operation_result(refund).instruction

    for words in (customer.message, api_words, mcp_words):
        assert "provider has confirmed" not in words and "provider confirmed" not in words
    assert "Our team has confirmed" in customer.message
    assert "confirmed by our team" in api_words
    assert "our team confirmed" in mcp_words


def test_a_payment_resolved_failed_by_a_person_says_so(
    new_purchase, api_client, drill, read_drill, django_user_model
):
    from payments.api.presenters import operation_next_action
    from support.customer_copy import customer_state

    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.HTTP_500)
    op = services.operation_dispatch(operation_id=op.id)
    read_drill(op.provider_reference)
    resolver = _person(django_user_model, "resolver", Role.OPERATOR)
    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome="failed",
        reason="no charge in the dashboard",
        actor="resolver",
        acting_user=resolver,
    )

    assert "Our team resolved this payment as failed" in operation_next_action(op)["message"]
    # the provider has not confirmed it: the buyer is told to wait, not to pay again
    state = customer_state(Purchase.objects.get(pk=purchase.pk))
    assert "confirming it with the payment provider" in state.message
    assert not state.can_pay_again


# -- also check: the buyer cancels before payment ------------------------------------------


def test_buyer_cancels_before_payment_idempotently(new_purchase, post_api, localstripe):
    purchase = new_purchase()

    first = post_api(f"purchases/{purchase.id}/cancel", key="cancel-1")
    again = post_api(f"purchases/{purchase.id}/cancel", key="cancel-1")

    assert first.status_code == 200 and first.json()["status"] == "cancelled", first.content
    assert again.status_code == 200 and again.headers.get("Idempotent-Replayed") == "true"
    assert _status(purchase) == PurchaseStatus.CANCELLED
    assert purchase.transitions.filter(target="cancelled").count() == 1
    # a cancelled purchase cannot be paid
    r = post_api(f"purchases/{purchase.id}/payments", {"payment_method": "pm_card_visa"})
    assert r.status_code == 409
    assert localstripe.payment_intents_for(purchase.id) == []


def test_cancel_after_a_payment_was_claimed_is_refused(new_purchase, api_client, post_api):
    purchase, _op = _paid(new_purchase, api_client)

    r = post_api(f"purchases/{purchase.id}/cancel")

    assert r.status_code == 409 and r.json()["code"] == "cancel_not_allowed"
    assert _status(purchase) == PurchaseStatus.PAID


def test_console_cancel(new_purchase, django_user_model):
    from support.services import purchase_cancel_by_user

    purchase = new_purchase()
    agent = _person(django_user_model, "agent", Role.SUPPORT)

    purchase_cancel_by_user(purchase_id=purchase.id, user=agent, reason="buyer asked by phone")

    assert _status(purchase) == PurchaseStatus.CANCELLED


# -- also check: the orchestrator re-checks the purchase between steps --------------------


def test_a_refund_during_a_run_stops_the_order_and_the_confirmation(
    new_purchase, api_client, django_user_model
):
    purchase, _charge = _paid(new_purchase, api_client)
    sku = purchase.quote.items[0]["sku"]
    locked, release = threading.Event(), threading.Event()
    result = {}

    def hold_stock_row():
        # Holds the product row so the run's inventory step waits on it.
        with transaction.atomic():
            Product.objects.select_for_update().get(sku=sku)
            locked.set()
            release.wait(30)
        connection.close()

    def run():
        try:
            result["state"] = orchestrator.purchase_fulfil(purchase_id=purchase.id)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_stock_row)
    holder.start()
    assert locked.wait(10)
    runner = threading.Thread(target=run)
    runner.start()
    # the run has written the order and waits in the inventory step
    deadline = time.monotonic() + 15
    while not Order.objects.filter(purchase_id=purchase.id).exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    asker = _person(django_user_model, "asker2", Role.SUPPORT)
    approver = _person(django_user_model, "approver2", Role.FINANCE)
    refund = services.refund_request(purchase_id=purchase.id, acting_user=asker)
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="ok")
    assert services.operation_dispatch(operation_id=refund.id).outcome == Outcome.SUCCEEDED
    assert _status(purchase) == PurchaseStatus.REFUNDED
    release.set()
    holder.join(30)
    runner.join(30)

    assert result["state"] == orchestrator.NOT_READY
    assert not EmailMessage.objects.filter(purchase_id=purchase.id).exists()
    assert not CrmUpdate.objects.filter(purchase_id=purchase.id).exists()
    assert not StepRun.objects.filter(
        purchase_id=purchase.id, step="confirmation", state="done"
    ).exists()


# -- also check: a late non-terminal event does not flip awaiting_buyer -------------------


def _three_d_secure_method() -> str:
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/v1/payment_methods",
        data={
            "type": "card",
            "card[number]": "4000002760003184",
            "card[exp_month]": "12",
            "card[exp_year]": "2030",
            "card[cvc]": "123",
        },
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    r.raise_for_status()
    return r.json()["id"]


def test_a_late_processing_event_does_not_flip_awaiting_buyer(
    new_purchase, api_client, deliver_event
):
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method=_three_d_secure_method()
    )
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.AWAITING_BUYER
    pi = {**provider_object("payment_intents", op.provider_reference), "status": "processing"}
    event = event_for(pi, "payment_intent.processing")
    event["created"] = int(time.time()) - 30  # created before requires_action was seen

    stored = deliver_event(event)

    assert (stored.result, stored.result_reason) == ("ignored", "stale_event")
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.AWAITING_BUYER
    assert _status(purchase) == PurchaseStatus.ACTION_REQUIRED


# -- also check: a 429 is resent after a bounded backoff ----------------------------------


def test_a_rate_limited_confirm_is_resent_with_the_same_key_after_a_backoff(
    new_purchase, api_client, drill, localstripe
):
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.HTTP_429, step="confirm")

    op = services.operation_dispatch(operation_id=op.id)

    assert op.outcome == Outcome.SUCCEEDED
    calls = list(ProviderCall.objects.filter(operation=op, step="confirm").order_by("attempt"))
    assert [(c.attempt, c.classification) for c in calls] == [(1, "retryable"), (2, "ok")]
    assert calls[0].key == calls[1].key
    gap = (calls[1].started_at - calls[0].finished_at).total_seconds()
    assert 0.45 <= gap <= services.RETRYABLE_BACKOFF_CAP_SECONDS + 1.0
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
