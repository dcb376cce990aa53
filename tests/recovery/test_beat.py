"""Beat jobs find work and write outbox rows; the schedule names registered tasks."""
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from config.celery import app
from payments import services as pay
from payments.enums import Outcome, PurchaseStatus
from payments.models import PaymentOperation, Purchase
from recovery.models import Order, OutboxCategory, OutboxMessage
from recovery.reconciler import expire_stale_purchases, reconcile_due, resume_stalled_fulfilment
from recovery.relay import relay_drain_once

pytestmark = pytest.mark.django_db(transaction=True)


def _drain():
    while relay_drain_once():
        pass


def test_every_beat_entry_names_a_registered_task():
    app.loader.import_default_modules()
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks


def test_due_unknown_is_reconciled_and_then_fulfilled(new_purchase, api_client, drill,
                                                      localstripe):
    purchase = new_purchase()
    op = pay.payment_create(purchase_id=purchase.id, api_client=api_client,
                            payment_method="pm_card_visa")
    drill(op, "drop_response_after_send")
    op = pay.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN and op.next_reconcile_at > timezone.now()
    assert reconcile_due() == 0  # not due yet

    # Time passes: the read-back is due (the core's delayed row is made due too).
    PaymentOperation.objects.filter(id=op.id).update(
        next_reconcile_at=timezone.now() - timedelta(seconds=1))
    assert reconcile_due() == 1
    assert OutboxMessage.objects.get(category=OutboxCategory.RECONCILE,
                                     processed_at__isnull=True).available_at <= timezone.now()
    OutboxMessage.objects.filter(category=OutboxCategory.RECONCILE).delete()  # lost
    assert reconcile_due() == 1
    assert reconcile_due() == 1  # the same pending message absorbs a second put
    assert OutboxMessage.objects.filter(category=OutboxCategory.RECONCILE,
                                        processed_at__isnull=True).count() == 1
    _drain()

    assert PaymentOperation.objects.get(id=op.id).outcome == Outcome.SUCCEEDED
    assert Purchase.objects.get(id=purchase.id).status == PurchaseStatus.COMPLETED
    assert Order.objects.filter(purchase_id=purchase.id).count() == 1
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1


def test_paid_without_order_gets_its_steps_run(new_purchase, pay_now):
    purchase = new_purchase()
    pay_now(purchase)
    OutboxMessage.objects.all().delete()  # the RUN_STEPS message was lost
    assert resume_stalled_fulfilment() == 0  # too recent to call stalled

    Purchase.objects.filter(id=purchase.id).update(
        updated_at=timezone.now() - timedelta(seconds=settings.PAID_WITHOUT_ORDER_SECONDS + 1))
    assert resume_stalled_fulfilment() == 1
    _drain()

    assert Order.objects.filter(purchase_id=purchase.id).count() == 1
    assert Purchase.objects.get(id=purchase.id).status == PurchaseStatus.COMPLETED


def test_stale_unpaid_purchase_expires(new_purchase):
    purchase = new_purchase()
    purchase.quote.__class__.objects.filter(id=purchase.quote_id).update(
        expires_at=timezone.now() - timedelta(seconds=1))

    assert expire_stale_purchases() == 1
    assert Purchase.objects.get(id=purchase.id).status == PurchaseStatus.EXPIRED
