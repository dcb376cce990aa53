"""End to end: localstripe itself signs and sends `payment_intent.succeeded` to a live
Verity server (~1 s after the confirm answer, without `account`)."""

import secrets

import pytest
import requests
from django.conf import settings

from payments.enums import Outcome, PurchaseStatus, Verification
from payments.models import PaymentOperation, Purchase
from recovery.models import OutboxCategory, OutboxMessage
from tests.waiting import wait_for
from webhooks.models import EventResult, ProviderEvent
from webhooks.services import event_process

from .events import SECRET

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def localstripe_webhook(live_server):
    """Register this live server at localstripe; unregister after (localstripe keeps
    registrations process-wide, and later tests must not receive deliveries)."""
    hook_id = f"verity_{secrets.token_hex(4)}"
    base = settings.STRIPE_API_BASE.rstrip("/")
    r = requests.post(
        f"{base}/_config/webhooks/{hook_id}",
        timeout=10,
        json={
            "url": f"{live_server.url}/webhooks/stripe/",
            "secret": SECRET,
            "events": ["payment_intent.succeeded", "payment_intent.payment_failed"],
        },
    )
    r.raise_for_status()
    yield hook_id
    requests.post(
        f"{base}/_config/webhooks/{hook_id}",
        timeout=10,
        json={
            "url": "http://127.0.0.1:9/disabled",
            "secret": "whsec_disabled",
            "events": ["verity.disabled"],
        },
    ).raise_for_status()


def _delivered(pi_id: str):
    return ProviderEvent.objects.filter(object_id=pi_id, type="payment_intent.succeeded").first()


def test_localstripe_webhook_settles_unknown_and_is_a_no_op_after_a_sync_success(
    localstripe_webhook, new_purchase, pay
):
    lost = pay(new_purchase(), drop_response=True)  # answer lost: only evidence settles it
    answered = pay(new_purchase())  # the synchronous answer already settled this one
    assert (lost.outcome, answered.outcome) == (Outcome.UNKNOWN, Outcome.SUCCEEDED)

    lost_event = wait_for(lambda: _delivered(lost.provider_reference), timeout=15)
    answered_event = wait_for(lambda: _delivered(answered.provider_reference), timeout=15)

    assert lost_event.account == ""  # no `account` = the platform
    assert (
        OutboxMessage.objects.filter(
            category=OutboxCategory.PROCESS_EVENT, payload={"event": lost_event.pk}
        ).count()
        == 1
    )
    assert event_process(event_id=lost_event.pk) == EventResult.APPLIED
    assert event_process(event_id=answered_event.pk) == EventResult.IGNORED

    lost = PaymentOperation.objects.get(pk=lost.pk)
    assert (lost.outcome, lost.verification) == (Outcome.SUCCEEDED, Verification.WEBHOOK)
    assert Purchase.objects.get(pk=lost.purchase_id).status in (
        PurchaseStatus.PAID,
        PurchaseStatus.FULFILLING,
        PurchaseStatus.COMPLETED,
    )
    answered = PaymentOperation.objects.get(pk=answered.pk)
    assert (answered.outcome, answered.verification) == (Outcome.SUCCEEDED, Verification.PROVIDER)
    # stored redacted: localstripe embeds the charge with its card details
    assert "last4" not in str(lost_event.payload)
    assert lost_event.payload["data"]["object"]["latest_charge"].startswith("ch_")


def test_localstripe_webhook_is_processed_by_the_relay_in_a_real_worker(
    localstripe_webhook, celery_worker, new_purchase, pay
):
    lost = pay(new_purchase(), drop_response=True)
    assert lost.outcome == Outcome.UNKNOWN

    # delivery -> event row + outbox row -> on-commit kick -> relay in the worker ->
    # event_process -> operation_apply_observation
    settled = wait_for(
        lambda: PaymentOperation.objects.filter(pk=lost.pk, outcome=Outcome.SUCCEEDED).first(),
        timeout=20,
    )

    assert settled.verification == Verification.WEBHOOK
    event = ProviderEvent.objects.get(object_id=lost.provider_reference)
    assert event.result == EventResult.APPLIED
    wait_for(
        lambda: OutboxMessage.objects.filter(
            category=OutboxCategory.PROCESS_EVENT,
            payload={"event": event.pk},
            processed_at__isnull=False,
        ).exists(),
        timeout=10,
    )
