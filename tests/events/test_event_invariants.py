"""The soak's event rules (bench/invariants.py) hold on a real flow and catch a broken
record: a missing event, a gap in a purchase's numbering, an event owed to an enabled
endpoint and never sent."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from events.delivery import deliveries_send_due
from events.models import Event, WebhookDelivery, WebhookEndpoint
from events.services import endpoint_create
from recovery.relay import relay_drain_once
from tests.outbox import settle_outbox

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.invariants import INVARIANTS, Report  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

RULES = (
    "events-numbered-without-gaps",
    "every-committed-change-has-its-event",
    "every-event-reaches-its-endpoint-or-the-endpoint-is-disabled",
)


def _judge() -> Report:
    rep = Report()
    for inv in INVARIANTS:
        if inv.rule in RULES:
            rep.invariant = inv.rule
            inv.fn(None, rep)
    return rep


def test_the_rules_hold_after_a_paid_purchase_and_catch_a_broken_record(
    shop, product, receiver, loopback_allowed
):
    made = endpoint_create(api_client_id=shop.client.pk, url=receiver.url, actor="test")
    receiver.secrets = [made.secret]
    purchase = shop.new_purchase(product.sku)
    assert shop.pay(purchase["id"]).status_code == 201
    settle_outbox()
    for _ in range(50):
        relay_drain_once()
        if (
            not deliveries_send_due()
            and not WebhookDelivery.objects.filter(state="pending").exists()
        ):
            break
    assert _judge().violations == []

    # A status event lost (as if written outside the change's transaction):
    lost = (
        Event.objects.filter(purchase_id=purchase["id"], type="purchase.status_changed")
        .order_by("sequence")
        .first()
    )
    lost.delete()
    violations = _judge().violations
    assert any(v.startswith("[every-committed-change-has-its-event]") for v in violations)
    assert any(v.startswith("[events-numbered-without-gaps]") for v in violations)

    # Events with no delivery row: written seconds ago, their fan-out is still owed (the
    # checks run while the workers do); a minute later, a fan-out that never came.
    WebhookDelivery.objects.filter(state="delivered").delete()
    rule = "[every-event-reaches-its-endpoint-or-the-endpoint-is-disabled]"
    assert not any(v.startswith(rule) for v in _judge().violations)
    WebhookEndpoint.objects.update(created_at=timezone.now() - timedelta(minutes=3))
    Event.objects.update(created_at=timezone.now() - timedelta(minutes=2))
    assert any(v.startswith(rule) for v in _judge().violations)
