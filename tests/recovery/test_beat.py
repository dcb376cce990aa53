"""Beat jobs find work and write outbox rows; the schedule names registered tasks."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from config.celery import app
from payments import services as pay
from payments.enums import Outcome, PurchaseStatus
from payments.models import PaymentOperation, Purchase
from recovery.halts import halt_set
from recovery.models import Order, OutboxCategory, OutboxMessage
from recovery.reconciler import expire_stale_purchases, reconcile_due, resume_stalled_fulfilment
from tests.outbox import settle
from tests.recovery.halt_fence import lift_halt_quietly

pytestmark = pytest.mark.django_db(transaction=True)


def test_every_beat_entry_names_a_registered_task():
    app.loader.import_default_modules()
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks


def test_due_unknown_is_reconciled_and_then_fulfilled(new_purchase, api_client, drill, localstripe):
    purchase = new_purchase()
    op = pay.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, "drop_response_after_send")
    op = pay.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN and op.next_reconcile_at > timezone.now()
    settle()
    assert reconcile_due() == 0  # not due yet
    assert PaymentOperation.objects.get(id=op.id).outcome == Outcome.UNKNOWN

    # Time passes: the read-back is due; the core's own delayed message is lost.
    PaymentOperation.objects.filter(id=op.id).update(
        next_reconcile_at=timezone.now() - timedelta(seconds=1)
    )
    OutboxMessage.objects.filter(category=OutboxCategory.RECONCILE).delete()
    assert reconcile_due() == 1
    settle()

    assert PaymentOperation.objects.get(id=op.id).outcome == Outcome.SUCCEEDED
    assert Purchase.objects.get(id=purchase.id).status == PurchaseStatus.COMPLETED
    assert Order.objects.filter(purchase_id=purchase.id).count() == 1
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1


def test_due_reconcile_row_written_with_a_delay_is_made_due():
    from django.db import transaction

    from recovery.outbox import outbox_put
    from tests.factories import PurchaseFactory

    purchase = PurchaseFactory()
    op = PaymentOperation.objects.create(
        purchase=purchase,
        kind="charge",
        amount=1500,
        currency="usd",
        outcome=Outcome.UNKNOWN,
        next_reconcile_at=timezone.now(),
    )
    with transaction.atomic():
        outbox_put(
            category=OutboxCategory.RECONCILE,
            payload={"operation": op.id},
            dedupe_key=f"reconcile:{op.id}",
            delay_seconds=600,
        )

    assert reconcile_due() == 1
    [row] = OutboxMessage.objects.filter(category=OutboxCategory.RECONCILE)
    assert row.available_at <= timezone.now()  # one row, due now


def test_paid_without_order_gets_its_steps_run(new_purchase, pay_now):
    purchase = new_purchase()
    halt_set(name="step:order", reason="order writer down", actor="op1")
    pay_now(purchase)
    settle()  # its RUN_STEPS message is handled (halted) and gone
    lift_halt_quietly("step:order")
    assert not Order.objects.filter(purchase_id=purchase.id).exists()
    assert resume_stalled_fulfilment() == 0  # too recent to call stalled

    Purchase.objects.filter(id=purchase.id).update(
        updated_at=timezone.now() - timedelta(seconds=settings.PAID_WITHOUT_ORDER_SECONDS + 1)
    )
    assert resume_stalled_fulfilment() == 1
    settle()

    assert Order.objects.filter(purchase_id=purchase.id).count() == 1
    assert Purchase.objects.get(id=purchase.id).status == PurchaseStatus.COMPLETED


def test_stale_unpaid_purchase_expires(new_purchase):
    purchase = new_purchase()
    purchase.quote.__class__.objects.filter(id=purchase.quote_id).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    assert expire_stale_purchases() == 1
    assert Purchase.objects.get(id=purchase.id).status == PurchaseStatus.EXPIRED
