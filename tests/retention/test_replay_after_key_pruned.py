"""A replay after retention pruned the idempotency record.

Retention deletes a finished idempotency record 30 days after it was written unless "the
purchase or operation it created is open" (recovery/retention.py `_idempotency_needed`).
A refund's record names the refund operation; once that refund succeeded, it is terminal,
so the record goes, while the payment still has refundable room (a partial refund leaves
the purchase `completed`/`paid`). The storefront's retry of that same refund request (same
Idempotency-Key, same body) is then a new request: a second refund at the provider.

Seen before the fix: 2 refunds at localstripe, 2 refund operations, the replay 201. Now a
refund's record is kept until its purchase is fully refunded. Counted at localstripe
(refunds of the PaymentIntent), on the real stack.
"""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from payments.enums import OperationKind, Outcome
from payments.models import IdempotencyRecord, PaymentOperation
from recovery.retention import policy_for, retention_prune_table
from tests.api.client import new_key
from tests.outbox import settle_outbox

pytestmark = pytest.mark.django_db(transaction=True)

IDEMPOTENCY = policy_for(IdempotencyRecord._meta.db_table)


def _age_every_record(days: int) -> None:
    IdempotencyRecord.objects.update(created_at=timezone.now() - timedelta(days=days))


def test_a_replayed_partial_refund_after_the_key_was_pruned_refunds_once(
    storefront, product, localstripe
):  # noqa: F811
    purchase = storefront.new_purchase(product.sku)
    paid = storefront.pay(purchase["id"])
    assert paid.status_code == 201, paid.content
    payment = PaymentOperation.objects.get(purchase_id=purchase["id"], kind=OperationKind.CHARGE)
    settle_outbox()

    key, body = new_key(), {"amount": 500}
    first = storefront.post(f"purchases/{purchase['id']}/refunds", body, key=key)
    assert first.status_code in (201, 202), first.content
    refund = PaymentOperation.objects.get(pk=first.json()["id"])
    assert refund.outcome == Outcome.SUCCEEDED, refund.outcome
    assert len(localstripe.refunds_for(payment.provider_reference)) == 1
    # The storefront's retry inside the window is a replay (the contract holds).
    again = storefront.post(f"purchases/{purchase['id']}/refunds", body, key=key)
    assert again.status_code == 200 and again.json()["id"] == refund.id
    settle_outbox()

    # Time passes; the beat's retention run.
    _age_every_record(settings.RETENTION_IDEMPOTENCY_DAYS + 1)
    retention_prune_table(policy=IDEMPOTENCY)
    pruned = not IdempotencyRecord.objects.filter(resource_id=refund.id).exists()

    late = storefront.post(f"purchases/{purchase['id']}/refunds", body, key=key)
    settle_outbox()
    refunds_at_provider = len(localstripe.refunds_for(payment.provider_reference))
    refund_ops = PaymentOperation.objects.filter(
        purchase_id=purchase["id"], kind=OperationKind.REFUND
    ).count()
    print(
        f"record pruned={pruned} late replay={late.status_code} "
        f"refunds at localstripe={refunds_at_provider} refund ops={refund_ops}"
    )
    assert refunds_at_provider == 1, (
        f"one refund request, {refunds_at_provider} refunds at the provider "
        f"(replay answered {late.status_code})"
    )
    assert refund_ops == 1


def test_a_full_refund_key_still_goes_and_its_late_replay_refunds_nothing(
    storefront, product, localstripe
):  # noqa: F811
    purchase = storefront.new_purchase(product.sku)
    assert storefront.pay(purchase["id"]).status_code == 201
    payment = PaymentOperation.objects.get(purchase_id=purchase["id"], kind=OperationKind.CHARGE)
    settle_outbox()
    key, body = new_key(), {"amount": payment.amount}
    first = storefront.post(f"purchases/{purchase['id']}/refunds", body, key=key)
    assert first.status_code in (201, 202), first.content
    settle_outbox()

    _age_every_record(settings.RETENTION_IDEMPOTENCY_DAYS + 1)
    retention_prune_table(policy=IDEMPOTENCY)
    # Fully refunded: nothing is left to refund twice, so the record is not kept.
    assert not IdempotencyRecord.objects.filter(resource_id=first.json()["id"]).exists()

    late = storefront.post(f"purchases/{purchase['id']}/refunds", body, key=key)
    settle_outbox()
    assert late.status_code >= 400, late.content
    assert len(localstripe.refunds_for(payment.provider_reference)) == 1
