"""Webhook endpoints and delivery, end to end on the real stack: endpoints made through
the REST API, events from real payments at localstripe, delivered over loopback HTTP to a
receiver that verifies each request with the stock `standardwebhooks` verifier and dedupes
on `webhook-id`. The delivery log (WebhookDelivery, WebhookAttempt rows) is counted too."""

from __future__ import annotations

import time

import pytest

from events.delivery import deliveries_send_due
from events.models import DeliveryState, Event, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from recovery.halts import halt_clear, halt_set
from recovery.relay import relay_drain_once
from tests.api.client import ALL_SCOPES, Api, body_of
from tests.factories import make_client

pytestmark = pytest.mark.django_db(transaction=True)


def _endpoint(shop, url: str, **extra) -> tuple[dict, str]:
    answer = shop.post("webhook-endpoints", {"url": url, **extra})
    assert answer.status_code == 201, answer.content
    made = body_of(answer)
    return made["endpoint"], made["secret"]


def _pump(until, timeout: float = 20.0) -> None:
    """Run the relay (fan-out) and the delivery loop until `until()` holds."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "not reached"
        relay_drain_once()
        deliveries_send_due()
        time.sleep(0.05)


def _quiet() -> bool:
    return not WebhookDelivery.objects.filter(state=DeliveryState.PENDING).exists()


def _all_delivered(receiver, purchase_id: str) -> bool:
    """Every event the purchase has so far reached the receiver, nothing is left to do."""
    from django.db.models import Q
    from django.utils import timezone

    from recovery.models import OutboxMessage

    now = timezone.now()
    stored = set(Event.objects.filter(purchase_id=purchase_id).values_list("public_id", flat=True))
    return (
        stored <= set(receiver.accepted)
        and _quiet()
        and not OutboxMessage.objects.filter(processed_at__isnull=True)
        .filter(Q(available_at__lte=now) | Q(claimed_until__gt=now))
        .exists()
    )


def _paid_purchase(shop, product) -> str:
    purchase = shop.new_purchase(product.sku)
    answer = shop.pay(purchase["id"])
    assert answer.status_code == 201, answer.content
    return purchase["id"]


def test_every_event_arrives_signed_in_sequence_order(
    shop, product, receiver, loopback_allowed, localstripe
):
    endpoint, secret = _endpoint(shop, receiver.url)
    assert secret.startswith("whsec_")
    receiver.secrets = [secret]
    # The secret is shown once: no later answer carries it.
    assert secret not in shop.get(f"webhook-endpoints/{endpoint['id']}").content.decode()
    assert secret not in shop.get("webhook-endpoints").content.decode()

    purchase_id = _paid_purchase(shop, product)
    _pump(lambda: _all_delivered(receiver, purchase_id))
    expected = list(Event.objects.filter(purchase_id=purchase_id).order_by("sequence"))

    got = [e for e in receiver.events() if e["purchase"] == purchase_id]
    assert [e["id"] for e in got] == [e.public_id for e in expected]
    assert [e["sequence"] for e in got] == list(range(1, len(expected) + 1))
    assert {e["type"] for e in got} >= {"purchase.created", "payment.succeeded"}
    assert receiver.rejected == 0 and receiver.duplicates == 0
    assert len(localstripe.succeeded_charges_for(purchase_id)) == 1
    assert WebhookDelivery.objects.filter(state=DeliveryState.DELIVERED).count() == len(expected)


def test_a_receiver_that_fails_and_times_out_gets_every_event_once(
    shop, product, receiver, loopback_allowed
):
    _, secret = _endpoint(shop, receiver.url)
    receiver.secrets = [secret]
    receiver.script = [500, "hang", 503, "hang", 502]
    receiver.hang_seconds = 1.0  # past the sender's 0.5 s read timeout

    purchase_id = _paid_purchase(shop, product)
    _pump(lambda: _all_delivered(receiver, purchase_id), timeout=40)
    expected = {e.public_id for e in Event.objects.filter(purchase_id=purchase_id)}

    assert set(receiver.accepted) == expected
    assert len(receiver.accepted) == len(expected)
    # A hung attempt's answer came after the sender gave up: it may arrive twice, and the
    # receiver's dedupe by webhook-id takes it once.
    assert receiver.requests >= len(expected) + 5
    failed_attempts = WebhookAttempt.objects.exclude(status_code__in=[200, 204]).count()
    assert failed_attempts >= 5
    assert not WebhookEndpoint.objects.filter(failing_since__isnull=False).exists()


def test_a_rotated_secret_overlaps_then_the_old_one_stops(
    shop, product, receiver, loopback_allowed
):
    endpoint, old = _endpoint(shop, receiver.url, event_types=["purchase.created"])
    rotated = shop.post(
        f"webhook-endpoints/{endpoint['id']}/rotate-secret", {"overlap_seconds": 3600}
    )
    assert rotated.status_code == 200, rotated.content
    new = body_of(rotated)["secret"]
    assert new != old

    receiver.secrets = [old]  # a receiver not yet updated still verifies
    first = shop.new_purchase(product.sku)
    _pump(lambda: len(receiver.accepted) == 1 and _quiet())
    receiver.secrets = [new]  # an updated one verifies too
    second = shop.new_purchase(product.sku)
    _pump(lambda: len(receiver.accepted) == 2 and _quiet())

    # No overlap: the old secret stops signing at once.
    shop.post(f"webhook-endpoints/{endpoint['id']}/rotate-secret", {"overlap_seconds": 0})
    receiver.secrets = [new]
    shop.new_purchase(product.sku)
    _pump(lambda: receiver.rejected >= 1, timeout=10)
    assert {e["purchase"] for e in receiver.events()} == {first["id"], second["id"]}


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.7/hooks",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8000/hooks",
        "http://localhost/hooks",
        "http://192.168.1.1/",
        "http://[fe80::1]/",
        "ftp://example.com/hooks",
    ],
)
def test_private_and_loopback_destinations_are_refused_at_save(shop, url, settings):
    settings.WEBHOOK_ALLOW_LOOPBACK = False
    answer = shop.post("webhook-endpoints", {"url": url})
    assert answer.status_code == 400, answer.content
    assert WebhookEndpoint.objects.count() == 0


def test_a_destination_that_turns_private_is_refused_at_send(
    shop, product, receiver, loopback_allowed
):
    _, secret = _endpoint(shop, receiver.url, event_types=["purchase.created"])
    receiver.secrets = [secret]
    loopback_allowed.WEBHOOK_ALLOW_LOOPBACK = False  # now the address is not allowed
    shop.new_purchase(product.sku)
    _pump(lambda: WebhookAttempt.objects.exists())
    assert receiver.requests == 0
    attempt = WebhookAttempt.objects.get()
    assert attempt.status_code is None and attempt.error.startswith("refused")


def test_an_endpoint_failing_past_the_window_is_disabled_with_its_reason(
    shop, product, receiver, loopback_allowed
):
    loopback_allowed.WEBHOOK_DISABLE_AFTER_SECONDS = 0
    loopback_allowed.WEBHOOK_RETRY_SECONDS = 0
    endpoint, secret = _endpoint(shop, receiver.url, event_types=["purchase.created"])
    receiver.script = [500] * 10
    shop.new_purchase(product.sku)
    _pump(lambda: not WebhookEndpoint.objects.get(pk=endpoint["id"]).enabled)
    stored = WebhookEndpoint.objects.get(pk=endpoint["id"])
    assert stored.disabled_reason.startswith("every delivery failed")
    assert WebhookDelivery.objects.get().state == DeliveryState.FAILED
    answer = body_of(shop.get(f"webhook-endpoints/{endpoint['id']}"))
    assert answer["enabled"] is False and answer["disabled_reason"]


def test_deliveries_wait_while_webhooks_are_halted(shop, product, receiver, loopback_allowed):
    _, secret = _endpoint(shop, receiver.url, event_types=["purchase.created"])
    receiver.secrets = [secret]
    halt_set(name="webhooks", reason="receiver incident", actor="ops")
    shop.new_purchase(product.sku)
    _pump(lambda: WebhookDelivery.objects.exists())
    for _ in range(5):
        deliveries_send_due()
    assert receiver.requests == 0
    assert WebhookDelivery.objects.get().state == DeliveryState.PENDING
    halt_clear(name="webhooks", reason="over", actor="ops")
    _pump(lambda: len(receiver.accepted) == 1 and _quiet())


def test_endpoints_need_their_scope_and_belong_to_their_client(shop, receiver, loopback_allowed):
    unscoped = Api(make_client(scopes=ALL_SCOPES, name="no-webhooks")[1])
    other = Api(make_client(scopes=(*ALL_SCOPES, "webhooks:manage"), name="other")[1])
    endpoint, _ = _endpoint(shop, receiver.url)
    assert unscoped.get("webhook-endpoints").status_code == 403
    assert other.get(f"webhook-endpoints/{endpoint['id']}").status_code == 404
    assert body_of(other.get("webhook-endpoints"))["endpoints"] == []
    assert other.post(f"webhook-endpoints/{endpoint['id']}/rotate-secret", {}).status_code == 404


def test_a_hanging_receiver_takes_only_its_own_bound(shop, product, loopback_allowed):
    from tests.events.receiver import Receiver

    slow, fast = Receiver(), Receiver()
    try:
        slow.script, slow.hang_seconds = ["hang"] * 20, 1.0
        slow_ep, slow_secret = _endpoint(shop, slow.url, event_types=["purchase.created"])
        fast_ep, fast_secret = _endpoint(shop, fast.url, event_types=["purchase.created"])
        slow.secrets, fast.secrets = [slow_secret], [fast_secret]
        WebhookEndpoint.objects.filter(pk=slow_ep["id"]).update(max_in_flight=1)
        for _ in range(6):
            shop.new_purchase(product.sku)
        for _ in range(100):  # the fan-out only: nothing is sent yet
            relay_drain_once()
            if WebhookDelivery.objects.count() == 12:
                break
        assert slow.requests == fast.requests == 0

        deliveries_send_due(batch=20)  # one claim: the slow endpoint gets one slot
        assert slow.requests == 1
        assert fast.requests == 2  # its own bound (2), not held back by the slow one
        _pump(lambda: len(fast.accepted) == 6)
        assert slow.requests < 6  # the slow one keeps going at its own pace
    finally:
        slow.close()
        fast.close()


def test_a_long_backlog_at_one_endpoint_does_not_starve_another(shop, loopback_allowed):
    """Hundreds of due deliveries of a stalled endpoint, older than another endpoint's
    one: the other's is sent in the very next claim."""
    from datetime import timedelta

    from django.utils import timezone

    from tests.events.receiver import Receiver

    slow, fast = Receiver(), Receiver()
    try:
        slow.script, slow.hang_seconds = ["hang"] * 10, 1.0
        slow_ep = WebhookEndpoint.objects.create(
            api_client_id="backlog", url=slow.url, max_in_flight=1
        )
        fast_ep = WebhookEndpoint.objects.create(api_client_id="backlog", url=fast.url)
        now = timezone.now()
        events = Event.objects.bulk_create(
            [
                Event(
                    api_client_id="backlog",
                    purchase_id=f"pur_backlog_{i}",
                    sequence=1,
                    type="purchase.created",
                    data={"purchase": {"id": f"pur_backlog_{i}"}},
                )
                for i in range(301)
            ]
        )
        WebhookDelivery.objects.bulk_create(
            [
                WebhookDelivery(
                    endpoint=slow_ep,
                    event=e,
                    purchase_id=e.purchase_id,
                    next_attempt_at=now,
                    give_up_at=now + timedelta(days=3),
                )
                for e in events[:300]
            ]
            + [
                WebhookDelivery(
                    endpoint=fast_ep,
                    event=events[300],
                    purchase_id=events[300].purchase_id,
                    next_attempt_at=now,
                    give_up_at=now + timedelta(days=3),
                )
            ]
        )
        deliveries_send_due(batch=20)
        assert fast.requests == 1
        assert slow.requests == 1
    finally:
        slow.close()
        fast.close()
