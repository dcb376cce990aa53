"""The automatic-refund allowance is cumulative per payment and per client per
period, so splitting a refund into allowance-sized pieces does not skip finance approval.
Effects counted: refunds at localstripe and refund operations by outcome."""

import pytest
from django.test import override_settings

from payments.enums import OperationKind, Outcome
from payments.models import PaymentOperation
from tests.api.client import Api
from tests.factories import ProductFactory, make_client
from tests.outbox import settle_outbox

pytestmark = pytest.mark.django_db(transaction=True)


def _paid(api: Api, price: int) -> tuple[str, str]:
    product = ProductFactory(price=price, stock=100)
    purchase = api.new_purchase(product.sku)
    paid = api.pay(purchase["id"])
    assert paid.status_code == 201, paid.content
    op = PaymentOperation.objects.get(id=paid.json()["id"])
    return purchase["id"], op.provider_reference


def _refunds(purchase_id: str, outcome: Outcome) -> int:
    return PaymentOperation.objects.filter(
        purchase_id=purchase_id, kind=OperationKind.REFUND, outcome=outcome
    ).count()


def test_five_refunds_of_the_allowance_do_not_skip_approval(localstripe):
    # given a client allowed 500 of automatic refunds and a paid 2 500 purchase
    client, key = make_client(name="splitter", auto_refund_limit=500)
    api = Api(key, client)
    purchase_id, intent = _paid(api, 2500)

    # when it asks for five refunds of 500
    answers = [api.post(f"purchases/{purchase_id}/refunds", {"amount": 500}) for _ in range(5)]
    settle_outbox()

    # then only the first went out without a person; four wait for finance
    assert [a.status_code for a in answers] == [201, 202, 202, 202, 202], [
        a.content for a in answers
    ]
    assert _refunds(purchase_id, Outcome.SUCCEEDED) == 1
    assert _refunds(purchase_id, Outcome.AWAITING_APPROVAL) == 4
    assert len(localstripe.refunds_for(intent)) == 1


def test_a_failed_refund_gives_its_allowance_back(localstripe):
    # given a client allowed 500 and a refund of 300 that went out
    client, key = make_client(name="careful", auto_refund_limit=500)
    api = Api(key, client)
    purchase_id, intent = _paid(api, 2500)
    assert api.post(f"purchases/{purchase_id}/refunds", {"amount": 300}).status_code == 201

    # when it asks for 200 (fits) and then 1 more (does not)
    fits = api.post(f"purchases/{purchase_id}/refunds", {"amount": 200})
    over = api.post(f"purchases/{purchase_id}/refunds", {"amount": 1})
    settle_outbox()

    # then 500 went out automatically, the rest waits
    assert (fits.status_code, over.status_code) == (201, 202)
    assert len(localstripe.refunds_for(intent)) == 2
    assert _refunds(purchase_id, Outcome.AWAITING_APPROVAL) == 1


@override_settings(AUTO_REFUND_PERIOD_MULTIPLE=2)
def test_allowance_per_client_per_period_across_purchases(localstripe):
    # given a client allowed 500 per payment and 2 × 500 per period, with three purchases
    client, key = make_client(name="spreader", auto_refund_limit=500)
    api = Api(key, client)
    paid = [_paid(api, 1000) for _ in range(3)]

    # when it refunds 500 on each
    answers = [api.post(f"purchases/{pid}/refunds", {"amount": 500}) for pid, _ in paid]
    settle_outbox()

    # then the third waits for approval and never reached the provider
    assert [a.status_code for a in answers] == [201, 201, 202]
    assert [len(localstripe.refunds_for(intent)) for _, intent in paid] == [1, 1, 0]
