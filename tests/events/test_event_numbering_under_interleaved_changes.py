"""Many changes to one purchase at once, from the test's threads and a real Celery worker
process: a payment, partial refunds over REST, the provider's webhooks (re-delivered and
new), read-backs, and the worker's downstream steps. Each purchase's events are numbered
from 1 without a gap, in the order its changes committed; every committed status move has
its event; each event's view is a state the purchase really had, walked forward; and every
event reaches the endpoint once. Judged from raw rows and the receiver's record."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from events.models import DeliveryState, Event, WebhookDelivery
from events.services import endpoint_create
from payments import services
from payments.models import PaymentOperation
from tests.factories import ProductFactory
from tests.localstripe import provider_object
from tests.waiting import wait_for
from tests.webhooks.events import event_for, post

from .event_judge import orphan_events, orphan_fanout, violations

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_interleaved_changes"


@pytest.fixture(params=["two_step", "one_call"])
def pay_mode(request, localstripe, settings, monkeypatch):
    from tests.localstripe import one_call_off, one_call_on

    if request.param == "one_call":
        one_call_on(localstripe, settings)
        monkeypatch.setenv("STRIPE_DEDUPES_KEYS", "true")  # the worker process too
        yield request.param
        one_call_off(localstripe)
    else:
        one_call_off(localstripe)
        yield request.param


def _run(fn, errors):
    try:
        fn()
    except services.DomainError:
        pass  # a refusal (another operation in flight, nothing left): nothing changed
    except Exception as exc:  # noqa: BLE001
        errors.append(exc)
    finally:
        connection.close()


def test_interleaved_changes_number_events_in_commit_order(
    pay_mode, shop, receiver, worker_env, client, settings, monkeypatch, localstripe, request
):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_ACCOUNT = ""
    monkeypatch.setenv("STRIPE_WEBHOOK_SECRETS", SECRET)
    request.getfixturevalue("celery_worker")  # its environment set above: a real process

    made = endpoint_create(api_client_id=shop.client.pk, url=receiver.url, actor="test")
    receiver.secrets = [made.secret]
    product = ProductFactory(price=5000, stock=100)
    purchases = [shop.new_purchase(product.sku)["id"] for _ in range(3)]
    errors: list[Exception] = []

    def pay(pid):
        r = shop.pay(pid)
        assert r.status_code in (201, 202), r.content

    def refunds(pid):
        for _ in range(4):
            shop.post(f"purchases/{pid}/refunds", {"amount": 300})
            time.sleep(0.02)

    def webhooks(pid):
        for _ in range(4):
            for pi in localstripe.payment_intents_for(pid):
                obj = provider_object("payment_intents", pi["id"])
                if obj["status"] == "succeeded":
                    post(client, event_for(obj, "payment_intent.succeeded"), secret=SECRET)
                for refund in localstripe.refunds_for(pi["id"]):
                    robj = provider_object("refunds", refund["id"])
                    post(client, event_for(robj, "charge.refund.updated"), secret=SECRET)
            for op in PaymentOperation.objects.filter(purchase_id=pid):
                try:
                    services.operation_reconcile(operation_id=op.id)
                except services.DomainError:
                    pass
            time.sleep(0.03)

    threads = []
    for pid in purchases:
        threads.append(threading.Thread(target=_run, args=(lambda p=pid: pay(p), errors)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    threads = []
    for pid in purchases:
        threads.append(threading.Thread(target=_run, args=(lambda p=pid: refunds(p), errors)))
        threads.append(threading.Thread(target=_run, args=(lambda p=pid: webhooks(p), errors)))
    if True:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [], errors

        def quiet() -> bool:
            stored = set(
                Event.objects.filter(purchase_id__in=purchases).values_list("public_id", flat=True)
            )
            return (
                stored <= set(receiver.accepted)
                and not WebhookDelivery.objects.filter(state=DeliveryState.PENDING).exists()
            )

        wait_for(quiet, timeout=90)
    for pid in purchases:
        print(
            pid,
            [
                (e.sequence, e.type, e.data["purchase"]["status"])
                for e in Event.objects.filter(purchase_id=pid).order_by("sequence")
            ],
        )
    problems = {pid: violations(pid) for pid in purchases}
    assert all(not v for v in problems.values()), problems
    assert orphan_events() == [] and orphan_fanout() == []
    stored = set(
        Event.objects.filter(purchase_id__in=purchases).values_list("public_id", flat=True)
    )
    assert stored <= set(receiver.accepted)
    assert receiver.duplicates == 0 and receiver.rejected == 0
