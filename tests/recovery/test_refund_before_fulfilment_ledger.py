"""A refund that settles before fulfilment ever ran still leaves the ledger equal to what
the provider holds (a full refund of a charge whose RUN_STEPS had not been handled yet
once booked the refund but never the sale: ledger minus provider = -amount)."""

import pytest
from django.db.models import Sum

from recovery.models import LedgerEntry
from recovery.relay import relay_drain
from tests.api.client import ALL_SCOPES, Api
from tests.factories import ProductFactory, make_client

pytestmark = pytest.mark.django_db(transaction=True)


def _provider_balance(purchase_id: str) -> int:
    return (
        LedgerEntry.objects.filter(purchase_id=purchase_id, account="provider_balance").aggregate(
            s=Sum("amount")
        )["s"]
        or 0
    )


def test_a_refund_settled_before_fulfilment_books_the_sale_it_reverses(localstripe):
    # given a charge that succeeded at the provider, its follow-up work not run yet
    ProductFactory(sku="LEDGER-1", price=700, stock=100)
    client, key = make_client(scopes=ALL_SCOPES, auto_refund_limit=100_000)
    api = Api(key, client)
    purchase = api.new_purchase("LEDGER-1")["id"]
    assert api.pay(purchase).status_code == 201

    # when the buyer is refunded in full before the orchestrator ever handled the purchase
    refund = api.post(f"purchases/{purchase}/refunds", {})
    assert refund.status_code in (201, 202), refund.content
    for _ in range(20):
        if not relay_drain():
            break

    # then the provider holds nothing for it, and neither does the ledger
    charged = sum(pi["amount"] for pi in localstripe.succeeded_charges_for(purchase))
    pi_id = localstripe.succeeded_charges_for(purchase)[0]["id"]
    refunded = sum(
        r["amount"] for r in localstripe.refunds_for(pi_id) if r["status"] == "succeeded"
    )
    assert charged == refunded == 700
    assert _provider_balance(purchase) == charged - refunded == 0
