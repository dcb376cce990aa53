"""The agent platform's last order word follows the money (docs/reliability.md: every face,
order events included, says the same about a purchase).

An order event that failed is retried on the delivery schedule; meanwhile the money goes
back and the `refunded` event is delivered. The body of an ACP order event carries no
sequence and its `Timestamp` header is the time of the attempt, so a platform can only take
what arrives last as the order's state. The retried `confirmed` must not be the platform's
last word about a purchase whose money went back; nor may an operator's resend make it so.

Real HTTP (live server, a receiver on loopback), money counted at localstripe.
"""

from __future__ import annotations

import json

import pytest
from django.urls import reverse
from django.utils import timezone

from events.delivery import deliveries_send_due
from events.models import DeliveryState, WebhookDelivery
from payments import services
from payments.enums import Outcome, PurchaseStatus
from payments.models import Purchase
from recovery.models import OutboxMessage
from recovery.relay import relay_drain_once
from tests.acp.agent import AcpAgent, new_email
from tests.acp.test_order_webhooks import _pump, _settled, platform_for, receiver  # noqa: F401
from tests.acp.tokens import issue_spt
from tests.factories import make_client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def refunding_agent(live_server, transactional_db):
    client, key = make_client(
        scopes=("acp",), limit=10_000_000, name="agent-platform-w", auto_refund_limit=100_000
    )
    return client, AcpAgent(live_server.url, key)


def _statuses_received(platform_receiver, pid: str) -> list[str]:
    """The order statuses the platform received, in the order they arrived."""
    out = []
    for _headers, body in platform_receiver.received:
        data = json.loads(body)["data"]
        if data["id"] == pid:
            out.append(data["status"])
    return out


def test_a_retried_confirmed_is_never_the_platforms_last_word_after_a_full_refund(
    refunding_agent,
    tea,
    receiver,  # noqa: F811
    settings,
    localstripe,
):
    client, agent = refunding_agent
    platform_for(client, receiver)
    settings.WEBHOOK_RETRY_SCHEDULE_SECONDS = [300]  # a failed event waits 5 minutes
    receiver.status = 500  # the platform is down while the order is confirmed

    sid = agent.create(tea.sku).json()["id"]
    r = agent.complete(sid, issue_spt(1250), new_email())
    assert r.status_code == 200, r.text
    pid = r.json()["order"]["id"]
    deliveries = WebhookDelivery.objects.filter(purchase_id=pid)
    # the first order event was tried and failed: it waits for its retry, the later ones
    # wait for it (a purchase's order events reach the platform in order)
    _pump(
        lambda: (
            deliveries.filter(message_id=f"evt_{pid}_paid", attempts=1).exists()
            and not OutboxMessage.objects.filter(
                processed_at__isnull=True, available_at__lte=timezone.now()
            ).exists()
        )
    )
    before = set(deliveries.values_list("message_id", flat=True))
    assert f"evt_{pid}_paid" in before

    # the money goes back in full; the platform is up again
    refund = services.refund_request(purchase_id=pid, api_client=client)
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.SUCCEEDED
    assert Purchase.objects.get(pk=pid).status == PurchaseStatus.REFUNDED
    [pi] = localstripe.payment_intents_for(pid)
    [provider_refund] = localstripe.refunds_for(pi["id"])
    assert provider_refund["amount"] == pi["amount"] and provider_refund["status"] == "succeeded"
    receiver.status = 200
    n = len(receiver.received)
    refunded = deliveries.filter(message_id__startswith=f"evt_{pid}_refunded")
    # `refunded` is due now, the earlier words only at their retry: it waits for them
    _pump(
        lambda: (
            refunded.exists()
            and not OutboxMessage.objects.filter(
                processed_at__isnull=True, available_at__lte=timezone.now()
            ).exists()
        )
    )
    for _ in range(3):
        relay_drain_once()
        deliveries_send_due()
    assert not refunded.filter(state=DeliveryState.DELIVERED).exists()
    assert len(receiver.received) == n

    # five minutes later the earlier events' retries are due
    deliveries.filter(state=DeliveryState.PENDING).update(next_attempt_at=timezone.now())
    _pump(lambda: _settled() and not deliveries.exclude(state=DeliveryState.DELIVERED).exists())

    accepted = [json.loads(b)["data"]["status"] for _, b in receiver.received[n:]]
    # the purchase's money is back: the platform's last word about the order says so, and
    # every word arrived once, in the order the purchase went through them
    assert Purchase.objects.get(pk=pid).status == PurchaseStatus.REFUNDED
    assert accepted[-1] == "refunded", accepted
    ids = [h["Request-Id"] for h, _ in receiver.received[n:]]
    assert len(ids) == len(set(ids)) == deliveries.count()
    assert ids == list(deliveries.order_by("id").values_list("message_id", flat=True))


def test_an_operators_resend_of_confirmed_is_never_the_last_word_after_a_full_refund(
    refunding_agent,
    tea,
    receiver,  # noqa: F811
    settings,
    localstripe,
    login,  # noqa: F811
):
    client, agent = refunding_agent
    platform_for(client, receiver)
    receiver.status = 200
    sid = agent.create(tea.sku).json()["id"]
    r = agent.complete(sid, issue_spt(1250), new_email())
    assert r.status_code == 200, r.text
    pid = r.json()["order"]["id"]
    paid = WebhookDelivery.objects.filter(purchase_id=pid, message_id=f"evt_{pid}_paid")
    _pump(lambda: paid.filter(state=DeliveryState.DELIVERED).exists())

    refund = services.refund_request(purchase_id=pid, api_client=client)
    assert services.operation_dispatch(operation_id=refund.id).outcome == Outcome.SUCCEEDED
    refunded = WebhookDelivery.objects.filter(
        purchase_id=pid, message_id__startswith=f"evt_{pid}_refunded"
    )
    _pump(lambda: _settled() and refunded.filter(state=DeliveryState.DELIVERED).exists())
    [pi] = localstripe.payment_intents_for(pid)
    assert sum(x["amount"] for x in localstripe.refunds_for(pi["id"])) == pi["amount"]

    # an operator resends the old `confirmed` (the platform says it lost it): refused,
    # with the reason shown; the later word is the one to resend, and it goes out
    sent = len(receiver.received)
    operator = login("operator")
    answer = operator.post(
        reverse("support:webhook-delivery-resend", args=[paid.get().pk]),
        {"reason": "the platform lost it", "confirm": "yes"},
    )
    assert answer.status_code == 302
    assert b"later order event" in operator.get(answer.url).content  # the refusal, shown
    relay_drain_once()
    deliveries_send_due()
    assert len(receiver.received) == sent and paid.get().attempts == 1
    last = refunded.order_by("-id").first()
    answer = operator.post(
        reverse("support:webhook-delivery-resend", args=[last.pk]),
        {"reason": "the platform lost it", "confirm": "yes"},
    )
    assert answer.status_code in (200, 302)
    _pump(lambda: _settled() and refunded.filter(pk=last.pk, attempts=2).exists())

    said = _statuses_received(receiver, pid)
    assert Purchase.objects.get(pk=pid).status == PurchaseStatus.REFUNDED
    assert said[-1] == "refunded", said
