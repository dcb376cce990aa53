"""Console queue selectors."""

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery import selectors
from recovery.models import OutboxCategory, OutboxMessage

pytestmark = pytest.mark.django_db(transaction=True)


def test_stuck_outbox_lists_retried_or_old_messages():
    OutboxMessage.objects.create(category=OutboxCategory.NOOP, payload={}, dedupe_key="fresh")
    OutboxMessage.objects.create(
        category=OutboxCategory.NOOP,
        payload={},
        dedupe_key="retried",
        attempts=3,
        last_error="boom",
    )
    old = OutboxMessage.objects.create(category=OutboxCategory.NOOP, payload={}, dedupe_key="old")
    OutboxMessage.objects.filter(id=old.id).update(created_at=timezone.now() - timedelta(hours=1))

    keys = {m.dedupe_key for m in selectors.queue_stuck_outbox()}

    assert keys == {"retried", "old"}
    assert selectors.outbox_backlog() == 3


def test_paid_without_order_and_unknown_queue(new_purchase, pay_now, api_client, drill):
    from payments import services as pay
    from payments.models import Purchase
    from recovery.halts import halt_set
    from tests.outbox import settle

    paid = new_purchase()
    halt_set(name="step:order", reason="order writer down", actor="op1")
    pay_now(paid)
    settle()
    Purchase.objects.filter(id=paid.id).update(updated_at=timezone.now() - timedelta(hours=1))
    unknown = new_purchase()
    op = pay.payment_create(
        purchase_id=unknown.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, "http_500")
    pay.operation_dispatch(operation_id=op.id)

    assert [p.id for p in selectors.paid_without_order()] == [paid.id]
    assert [o.id for o in selectors.queue_unknown_operations()] == [op.id]
    count, age = selectors.unknown_operations_stats()
    assert count == 1 and age >= 0
