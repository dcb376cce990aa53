"""Replays of a payment and of a purchase
creation with an Idempotency-Key retention pruned. Counted at localstripe and in the DB."""

import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from payments.enums import OperationKind
from payments.models import IdempotencyRecord, PaymentOperation, Purchase
from recovery.retention import policy_for, retention_prune_table
from tests.api.client import new_key
from tests.outbox import settle_outbox

pytestmark = pytest.mark.django_db(transaction=True)

IDEMPOTENCY = policy_for(IdempotencyRecord._meta.db_table)


def _prune_everything_old():
    IdempotencyRecord.objects.update(
        created_at=timezone.now() - timedelta(days=settings.RETENTION_IDEMPOTENCY_DAYS + 1)
    )
    retention_prune_table(policy=IDEMPOTENCY)


@pytest.mark.parametrize("method", ["pm_card_visa", "pm_card_chargeDeclined"])
def test_a_payment_replayed_after_its_key_was_pruned_charges_nothing_more(
    storefront, product, localstripe, method
):  # noqa: F811
    purchase = storefront.new_purchase(product.sku)
    key = new_key()
    first = storefront.pay(purchase["id"], method=method, key=key)
    settle_outbox()
    before = Purchase.objects.get(pk=purchase["id"]).status
    _prune_everything_old()
    pruned = not IdempotencyRecord.objects.filter(key=key).exists()
    late = storefront.pay(purchase["id"], method=method, key=key)
    settle_outbox()
    charges = len(localstripe.succeeded_charges_for(purchase["id"]))
    intents = len(localstripe.payment_intents_for(purchase["id"]))
    ops = PaymentOperation.objects.filter(
        purchase_id=purchase["id"], kind__in=[OperationKind.CHARGE]
    ).count()
    print(
        f"{method}: first={first.status_code} status={before} pruned={pruned} "
        f"late={late.status_code} {late.content[:200]!r} charges={charges} "
        f"intents={intents} ops={ops}"
    )
    assert charges <= 1
    if pruned:
        assert late.status_code >= 400 or late.json()["id"] == first.json()["id"], (
            f"a pruned key's replay made a new operation: {late.status_code}"
        )


def test_a_purchase_creation_replayed_after_its_key_was_pruned_makes_no_second_purchase(
    storefront, product, localstripe
):  # noqa: F811
    quote = storefront.quote(product.sku)
    assert quote.status_code == 201, quote.content
    key = new_key()
    customer = f"cust-{uuid.uuid4().hex[:10]}"
    first = storefront.purchase(quote.json(), customer, key=key)
    assert first.status_code == 201, first.content
    assert storefront.pay(first.json()["id"]).status_code == 201
    settle_outbox()
    status = Purchase.objects.get(pk=first.json()["id"]).status
    _prune_everything_old()
    pruned = not IdempotencyRecord.objects.filter(key=key).exists()
    late = storefront.purchase(quote.json(), customer, key=key)
    purchases = (
        Purchase.objects.filter(api_client=storefront.client).count()
        if storefront.client is not None
        else Purchase.objects.count()
    )
    print(
        f"purchase create: status={status} pruned={pruned} late={late.status_code} "
        f"{late.content[:200]!r} purchases={purchases}"
    )
    if late.status_code == 201 and late.json()["id"] != first.json()["id"]:
        paid = storefront.pay(late.json()["id"])
        settle_outbox()
        print(
            f"second purchase paid: {paid.status_code} charges="
            f"{len(localstripe.succeeded_charges_for(late.json()['id']))}"
        )
    assert late.status_code >= 400 or late.json()["id"] == first.json()["id"]


def test_a_retry_replayed_after_its_key_was_pruned_makes_no_new_attempt(
    storefront, product, localstripe
):  # noqa: F811
    # A payment_failed purchase can still be charged (a retry naming the failed payment):
    # the retry's key must keep answering the same operation.
    purchase = storefront.new_purchase(product.sku)
    declined = storefront.pay(purchase["id"], method="pm_card_chargeDeclined")
    assert declined.status_code == 402, declined.content
    key = new_key()
    body = {
        "payment_method": "pm_card_chargeCustomerFail",
        "capture": "automatic",
        "retry_of": declined.json()["operation"],
    }
    retry = storefront.post(f"purchases/{purchase['id']}/payments", body, key=key)
    assert retry.status_code == 402, retry.content  # a second failed attempt
    settle_outbox()
    before = PaymentOperation.objects.filter(purchase_id=purchase["id"]).count()
    status = Purchase.objects.get(pk=purchase["id"]).status
    _prune_everything_old()
    pruned = not IdempotencyRecord.objects.filter(key=key).exists()
    late = storefront.post(f"purchases/{purchase['id']}/payments", body, key=key)
    settle_outbox()
    after = PaymentOperation.objects.filter(purchase_id=purchase["id"]).count()
    print(
        f"retry={retry.status_code} status={status} pruned={pruned} late={late.status_code} "
        f"{late.content[:160]!r} ops before={before} after={after} intents="
        f"{len(localstripe.payment_intents_for(purchase['id']))}"
    )
    assert after == before, "a pruned retry key's replay made a new payment attempt"
