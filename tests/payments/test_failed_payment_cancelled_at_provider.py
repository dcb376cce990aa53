"""A payment Verity settled `failed` cannot be paid later
(docs/reliability.md#the-providers-record-outranks-a-person).

A declined 3-D Secure PaymentIntent is `requires_payment_method` at the provider: Verity
settles it failed (the buyer may try again, no order), but anyone holding the secret key
could still attach a card and confirm it — a charge with no order. When Verity settles a
payment failed and the provider still holds it open, Verity cancels it at the provider
(outside any transaction, through the outbox, under the step key `<key>:cancel`), as a
person's "failed" already does. Counted at localstripe (PaymentIntents, charges) and in the
database (operations, provider calls); faults only through the fault-drill HTTP client.
"""

import pytest
import requests
from django.conf import settings

from payments import services
from payments.enums import CallStep, Outcome, PurchaseStatus
from payments.models import ProviderCall, Purchase
from recovery.models import Order
from recovery.relay import relay_drain
from tests.localstripe import provider_object

pytestmark = pytest.mark.django_db(transaction=True)

AUTH = (settings.STRIPE_API_KEY, "")


def _post(path: str, data: dict) -> requests.Response:
    return requests.post(f"{settings.STRIPE_API_BASE}/v1/{path}", data=data, auth=AUTH, timeout=10)


def _three_d_secure_method() -> str:
    r = _post(
        "payment_methods",
        {
            "type": "card",
            "card[number]": "4000002760003184",
            "card[exp_month]": "12",
            "card[exp_year]": "2030",
            "card[cvc]": "123",
        },
    )
    r.raise_for_status()
    return r.json()["id"]


def _pay_with_the_secret_key(pi_id: str) -> int:
    """What a holder of the secret key does with an open PaymentIntent: attach a card that
    needs no authentication and confirm it. The confirm's HTTP status."""
    _post(f"payment_intents/{pi_id}", {"payment_method": "pm_card_visa"})
    return _post(f"payment_intents/{pi_id}/confirm", {}).status_code


def test_a_declined_three_d_secure_payment_is_cancelled_so_nobody_can_pay_it_later(
    new_purchase, api_client, localstripe
):
    # given a payment waiting for the buyer's 3-D Secure
    purchase = new_purchase(price=1500)
    op = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method=_three_d_secure_method()
    )
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.AWAITING_BUYER
    # and the buyer fails the authentication (declined at the provider)
    pi = provider_object("payment_intents", op.provider_reference)
    r = _post(
        f"payment_intents/{op.provider_reference}/_authenticate",
        {"client_secret": pi["client_secret"], "success": "false"},
    )
    assert r.status_code == 200
    # when Verity reads it back and settles it failed (the outbox then runs)
    op = services.operation_reconcile(operation_id=op.id)
    assert op.outcome == Outcome.FAILED
    relay_drain()

    # then the PaymentIntent is cancelled at the provider, once, under `<key>:cancel`
    assert provider_object("payment_intents", op.provider_reference)["status"] == "canceled"
    [cancel] = ProviderCall.objects.filter(operation=op, purpose="dispatch", step=CallStep.CANCEL)
    assert cancel.key == f"{op.idempotency_key}:cancel"
    # and the secret key can no longer pay it: refused, no charge, no order
    assert _pay_with_the_secret_key(op.provider_reference) == 400
    assert localstripe.succeeded_charges_for(purchase.id) == []
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.PAYMENT_FAILED
    assert not Order.objects.filter(purchase_id=purchase.id).exists()
    # and running the outbox again sends nothing more
    relay_drain()
    assert ProviderCall.objects.filter(operation=op, step=CallStep.CANCEL).count() == 1
