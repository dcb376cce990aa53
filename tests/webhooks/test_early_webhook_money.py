"""A real payment at localstripe
whose confirm answer is lost (a fault drill: `unknown` at Verity), settled by its webhook
deliveries — the real PaymentIntent as localstripe holds it, signed with the endpoint's
secret — redelivered, raced and reordered (a stale `payment_failed` after and before the
success), through the early path and through the whole chain. The relay then runs every
downstream step. Both must end with one charge at localstripe, one order, one sale in the
ledger; and the same rows and counters on both paths."""

import json
import threading

import pytest
from django.db import connection
from django.db.models import Sum
from django.test import Client
from prometheus_client import REGISTRY

from payments import services
from payments.enums import Outcome
from payments.models import PaymentOperation, Purchase
from recovery.models import LedgerEntry, Order, OutboxCategory, OutboxMessage
from recovery.relay import relay_drain
from tests.localstripe import provider_object
from tests.webhooks.events import event_for, sign
from webhooks.models import ProviderEvent

pytestmark = pytest.mark.django_db(transaction=True)

EARLY = "config.early_webhook.EarlyWebhookMiddleware"


def _client(settings, early: bool) -> Client:
    shipped = list(settings.MIDDLEWARE)
    if not early:
        settings.MIDDLEWARE = [m for m in shipped if m != EARLY]
    client = Client(raise_request_exception=False)
    client.get("/healthz")  # the chain is loaded now, with or without the early middleware
    settings.MIDDLEWARE = shipped
    return client


def _deliver(client, event: dict):
    body = json.dumps(event).encode()
    return client.post(
        "/webhooks/stripe/",
        data=body,
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE=sign(body),
    )


def _sample(name, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _counts() -> dict:
    return {
        r: _sample("verity_webhook_results_total", result=r)
        for r in ("received", "duplicate", "applied", "ignored", "quarantined", "held")
    } | {"server_error": _sample("verity_webhook_failures_total", reason="server_error")}


def _drain() -> None:
    for _ in range(20):
        if not relay_drain():
            return


def _run(
    settings,
    new_purchase,
    api_client,
    drill,
    localstripe,
    early: bool,
    tag: str,
    stale_type: str = "payment_intent.processing",
):
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, "drop_response_after_send")
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    pi = provider_object("payment_intents", op.provider_reference)
    assert pi["status"] == "succeeded"
    succeeded = event_for(pi, "payment_intent.succeeded", event_id=f"evt_r7m_{tag}_ok")
    stale_pi = (
        {
            **pi,
            "status": "requires_payment_method",
            "last_payment_error": {"code": "card_declined", "message": "declined"},
        }
        if stale_type == "payment_intent.payment_failed"
        else {**pi, "status": "processing"}
    )
    stale = event_for(stale_pi, stale_type, event_id=f"evt_r7m_{tag}_stale")
    stale["created"] = succeeded["created"] - 60
    client = _client(settings, early)
    before = _counts()

    answers = [_deliver(client, stale)]  # the stale failure first (reordered)
    racers = [_client(settings, early) for _ in range(4)]
    raced = [None] * 4
    barrier = threading.Barrier(4)

    def race(i):
        try:
            barrier.wait(10)
            raced[i] = _deliver(racers[i], succeeded)
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    answers += raced
    _drain()
    answers += [_deliver(client, succeeded), _deliver(client, stale)]  # redelivered late
    _drain()

    op = PaymentOperation.objects.get(pk=op.pk)
    events = ProviderEvent.objects.filter(event_id__startswith=f"evt_r7m_{tag}_")
    return {
        "answers": [a.status_code for a in answers],
        "outcome": op.outcome,
        "status": Purchase.objects.get(pk=purchase.pk).status,
        "charges": len(localstripe.succeeded_charges_for(purchase.id)),
        "payment_intents": len(localstripe.payment_intents_for(purchase.id)),
        "orders": Order.objects.filter(purchase_id=purchase.id).count(),
        "sales": LedgerEntry.objects.filter(purchase_id=purchase.id, entry_type="sale").count(),
        "balance": (
            LedgerEntry.objects.filter(
                purchase_id=purchase.id, account="provider_balance"
            ).aggregate(s=Sum("amount"))["s"]
            or 0
        )
        == op.amount,
        "events": sorted(events.values_list("result", flat=True)),
        "outbox": OutboxMessage.objects.filter(
            category=OutboxCategory.PROCESS_EVENT, dedupe_key__startswith=f"event:evt_r7m_{tag}_"
        ).count(),
        "counters": {k: v - before[k] for k, v in _counts().items()},
    }


def test_a_payment_settled_by_raced_and_reordered_deliveries_charges_once_on_both_paths(
    settings, new_purchase, api_client, drill, localstripe
):
    early = _run(settings, new_purchase, api_client, drill, localstripe, True, "early")
    chain = _run(settings, new_purchase, api_client, drill, localstripe, False, "chain")
    print("early", early)
    print("chain", chain)

    assert early == chain
    assert early["answers"] == [200] * 7
    assert (early["charges"], early["payment_intents"], early["orders"]) == (1, 1, 1)
    assert early["outcome"] == Outcome.SUCCEEDED and early["balance"]
    assert early["outbox"] == 2 and len(early["events"]) == 2
    assert early["sales"] == 2  # one sale, double entry: one row per side
    assert early["counters"]["received"] == 2 and early["counters"]["duplicate"] == 5
    assert early["counters"]["server_error"] == 0


def test_a_stale_signed_decline_before_the_success_ends_the_same_on_both_paths(
    settings, new_purchase, api_client, drill, localstripe
):
    """A signed `payment_failed` (older than the success) delivered first while the payment
    is `unknown`. It used to be applied (failed), and the success then quarantined
    `conflict` for a person: money taken, no order. A failed attempt is not the provider's
    last word now: the event prompts a read-back, which finds the success
    (webhooks.services._verify_failure_outside_transaction) — on both paths alike."""
    early = _run(
        settings,
        new_purchase,
        api_client,
        drill,
        localstripe,
        True,
        "early_f",
        "payment_intent.payment_failed",
    )
    chain = _run(
        settings,
        new_purchase,
        api_client,
        drill,
        localstripe,
        False,
        "chain_f",
        "payment_intent.payment_failed",
    )
    print("early", early)
    print("chain", chain)
    assert early == chain
    assert (early["charges"], early["payment_intents"], early["orders"]) == (1, 1, 1)
    assert early["outcome"] == Outcome.SUCCEEDED and early["balance"]
    assert early["sales"] == 2  # one sale, double entry
    assert early["events"] == ["ignored", "ignored"]  # superseded by the read-back; no news
