"""The outbox relay: SKIP LOCKED claims, backoff in available_at, lease re-claim."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from payments.models import Purchase
from recovery.models import OutboxCategory, OutboxMessage
from recovery.outbox import outbox_put
from recovery.relay import relay_drain_once
from tests.factories import PurchaseFactory
from tests.recovery.threads import run_concurrently
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _rows(n, category=OutboxCategory.NOOP, **fields):
    # Written directly (no on-commit kick): these tests drive the relay themselves.
    return OutboxMessage.objects.bulk_create(
        [
            OutboxMessage(category=category, payload={"n": i}, dedupe_key=f"t:{i}", **fields)
            for i in range(n)
        ]
    )


def test_two_concurrent_drainers_process_each_message_once():
    _rows(300)

    def drain_all():
        total = 0
        while n := relay_drain_once(batch=25):
            total += n
        return total

    claimed = run_concurrently(drain_all, 2)

    assert sum(claimed) == 300  # no message claimed by both drainers
    assert OutboxMessage.objects.filter(processed_at__isnull=True).count() == 0
    assert set(OutboxMessage.objects.values_list("attempts", flat=True)) == {1}


def test_handler_failure_backs_off_then_succeeds_later():
    # A RUN_STEPS message for a purchase that does not exist (yet) fails in its handler.
    before = timezone.now()
    OutboxMessage.objects.create(
        category=OutboxCategory.RUN_STEPS,
        payload={"purchase": "pur_later"},
        dedupe_key="steps:pur_later",
    )

    assert relay_drain_once() == 1

    msg = OutboxMessage.objects.get()
    assert msg.processed_at is None and msg.attempts == 1
    assert "DoesNotExist" in msg.last_error
    assert msg.available_at > before + timedelta(seconds=0.9)  # backoff lives here
    assert msg.claimed_until is None
    assert relay_drain_once() == 0  # not due yet: nothing claimed

    # Later the purchase exists and the backoff has passed: the retry succeeds.
    PurchaseFactory(id="pur_later")
    OutboxMessage.objects.filter(id=msg.id).update(available_at=timezone.now())
    assert relay_drain_once() == 1
    msg.refresh_from_db()
    assert msg.processed_at is not None and msg.attempts == 2 and msg.last_error == ""


def test_backoff_grows_with_attempts_and_is_capped(settings):
    from recovery.relay import backoff_seconds

    delays = [backoff_seconds(a) for a in range(1, 20)]
    assert delays[1] > delays[0] * 1.7
    assert max(delays) <= settings.OUTBOX_BACKOFF_CAP_SECONDS * 1.1


@pytest.mark.claims_left_by_the_test
def test_claimed_then_crashed_message_is_reclaimed_after_its_lease():
    now = timezone.now()
    [crashed] = _rows(1, claimed_until=now - timedelta(seconds=1), attempts=1)
    OutboxMessage.objects.create(
        category=OutboxCategory.NOOP,
        payload={},
        dedupe_key="live",
        claimed_until=now + timedelta(seconds=60),
        attempts=1,
    )

    assert relay_drain_once() == 1  # only the expired lease is taken

    crashed.refresh_from_db()
    assert crashed.processed_at is not None and crashed.attempts == 2
    live = OutboxMessage.objects.get(dedupe_key="live")
    assert live.processed_at is None and live.attempts == 1


def test_dedupe_key_absorbs_a_second_pending_message():
    with transaction.atomic():
        outbox_put(category=OutboxCategory.NOOP, payload={}, dedupe_key="same", delay_seconds=60)
        outbox_put(category=OutboxCategory.NOOP, payload={}, dedupe_key="same", delay_seconds=60)
    assert OutboxMessage.objects.filter(dedupe_key="same").count() == 1


def test_relay_refuses_to_run_inside_a_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        relay_drain_once()


def test_real_worker_drains_on_commit(celery_worker):
    purchase = PurchaseFactory()
    with transaction.atomic():
        outbox_put(
            category=OutboxCategory.RUN_STEPS,
            payload={"purchase": purchase.id},
            dedupe_key=f"steps:{purchase.id}",
        )
        outbox_put(category=OutboxCategory.NOOP, payload={}, dedupe_key="noop:1")

    wait_for(
        lambda: not OutboxMessage.objects.filter(processed_at__isnull=True).exists(), timeout=20
    )
    assert set(OutboxMessage.objects.values_list("attempts", flat=True)) == {1}
    assert Purchase.objects.get(id=purchase.id).status == "awaiting_payment"  # not paid: no-op
