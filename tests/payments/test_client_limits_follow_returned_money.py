"""Spending allowance and money that went back (docs/walkthrough.md, "Spending limits").

The rule: a charge the client asked for consumes its allowance, and a refund the merchant
or buyer decides on does not give it back (otherwise refunding and charging again would
spend past the limit). A duplicate charge is different: the client never asked to pay
twice; Verity took it in error and its compensation returned it. Once that return is
confirmed the duplicate's hold is released: it no longer counts as consumed.
Counted at localstripe (refunds) and in the database (holds, client_limits).
"""

import pytest

from payments import services
from payments.enums import HoldState
from payments.models import Hold
from tests.payments.test_provider_outranks_people import _charged_twice, _reload

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_refunded_duplicates_hold_is_released_and_an_ordinary_refund_keeps_consumed(
    new_purchase, api_client, drill, read_drill, resolver, localstripe
):  # noqa: F811
    # given a purchase charged twice, the first charge the duplicate, returned in full
    purchase, first, retry = _charged_twice(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )
    services.operation_reconcile(operation_id=first.id)
    assert _reload(first).is_duplicate
    [comp] = _reload(first).children.filter(kind="refund", is_compensation=True)
    services.operation_dispatch(operation_id=comp.id)
    assert [r["amount"] for r in localstripe.refunds_for(first.provider_reference)] == [
        first.amount
    ]

    # then only the charge the client asked for counts as consumed
    assert Hold.objects.get(operation=first).state == HoldState.RELEASED
    assert Hold.objects.get(operation=retry).state == HoldState.CONSUMED
    assert services.client_limits(api_client)["consumed"] == retry.amount

    # and an ordinary refund of the purchase gives nothing back to the allowance
    refund = services.refund_request(
        purchase_id=purchase.id, amount=retry.amount, compensation=True
    )
    services.operation_dispatch(operation_id=refund.id)
    assert services.client_limits(api_client)["consumed"] == retry.amount
