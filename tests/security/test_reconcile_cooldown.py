"""On-demand reconcile has a per-operation cooldown. 20 POSTs in a burst make
one provider read and one reconcile step; the others answer the current state with
Retry-After. Effects counted: reconcile ProviderCall rows and timeline rows."""

import pytest
import requests
from django.conf import settings

from payments.enums import CallPurpose, Outcome
from payments.models import OperationTransition, PaymentOperation, ProviderCall
from tests.outbox import settle_outbox

pytestmark = pytest.mark.django_db(transaction=True)


def _three_d_secure_method() -> str:
    """A localstripe PaymentMethod whose payments need the buyer (3-D Secure)."""
    answer = requests.post(
        f"{settings.STRIPE_API_BASE}/v1/payment_methods",
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
        data={
            "type": "card",
            "card[number]": "4000002760003184",
            "card[exp_month]": "12",
            "card[exp_year]": "2034",
            "card[cvc]": "123",
        },
    )
    answer.raise_for_status()
    return answer.json()["id"]


def _open_payment(storefront, product) -> PaymentOperation:
    """A payment waiting for the buyer: every read-back finds it still open."""
    purchase = storefront.new_purchase(product.sku)
    paid = storefront.pay(purchase["id"], method=_three_d_secure_method())
    op = PaymentOperation.objects.get(id=paid.json()["id"])
    assert op.outcome == Outcome.AWAITING_BUYER, paid.content
    return op


@pytest.fixture
def open_payment(storefront, product):
    return _open_payment(storefront, product)


def _reads(op) -> int:
    return ProviderCall.objects.filter(operation=op, purpose=CallPurpose.RECONCILE).count()


def test_a_burst_of_reconcile_requests_reads_the_provider_once(storefront, open_payment, settings):
    # given a payment waiting for the buyer and a 60 s cooldown
    settings.RECONCILE_ON_DEMAND_COOLDOWN_SECONDS = 60
    op = open_payment
    timeline = OperationTransition.objects.filter(operation=op).count()

    # when the storefront asks for a read-back twenty times
    answers = [storefront.post(f"operations/{op.id}/reconcile", key=None) for _ in range(20)]
    settle_outbox()

    # then one read at the provider, 19 answers of the current state with Retry-After
    assert {a.status_code for a in answers} == {200}, [a.content for a in answers[:3]]
    assert _reads(op) == 1
    waits = [int(a["Retry-After"]) for a in answers if a.has_header("Retry-After")]
    assert len(waits) == 19 and all(0 < w <= 60 for w in waits)
    assert all(a.json()["outcome"] == "awaiting_buyer" for a in answers)
    assert OperationTransition.objects.filter(operation=op).count() <= timeline + 1


def test_the_cooldown_is_per_operation(storefront, product, open_payment, settings):
    # given a read-back just made on one open payment
    settings.RECONCILE_ON_DEMAND_COOLDOWN_SECONDS = 5
    first = open_payment
    storefront.post(f"operations/{first.id}/reconcile", key=None)
    other = _open_payment(storefront, product)

    # when another operation is reconciled; then it is read at once
    answer = storefront.post(f"operations/{other.id}/reconcile", key=None)
    assert answer.status_code == 200 and "Retry-After" not in answer
    assert _reads(PaymentOperation.objects.get(id=other.id)) == 1
