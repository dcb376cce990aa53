"""A failed purchase's retry after the buyer bought the same basket in another purchase.

A declined purchase does not block a new one (the buyer may well try again), so the same
buyer can open and pay purchase B for the same items. A `retry_of` on the declined purchase
A afterwards would charge the buyer a second time for one basket: the duplicate guard runs
when a purchase opens, so it is asked again when a payment is retried (REST, MCP and ACP
all go through `payment_create`). Counted at localstripe and in the database.
"""

import pytest

from payments.models import PaymentOperation

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_retry_of_a_declined_purchase_is_refused_once_the_same_basket_was_bought_again(
    storefront, product, localstripe
):
    customer = "cust-bought-elsewhere"
    first = storefront.new_purchase(product.sku, customer)
    declined = storefront.pay(first["id"], "pm_card_chargeCustomerFail")
    assert declined.status_code == 402, declined.content
    failed_op = declined.json()["operation"]

    second = storefront.new_purchase(product.sku, customer)
    paid = storefront.pay(second["id"])
    assert paid.status_code == 201, paid.content

    retry = storefront.pay(first["id"], extra={"retry_of": failed_op})

    assert retry.status_code == 409, retry.content
    assert retry.json()["code"] == "probable_duplicate_purchase"
    assert retry.json()["purchase"] == second["id"]
    assert len(localstripe.succeeded_charges_for(first["id"])) == 0
    assert len(localstripe.succeeded_charges_for(second["id"])) == 1
    assert PaymentOperation.objects.filter(purchase_id=first["id"]).count() == 1


def test_a_retry_of_a_declined_purchase_still_works_when_nothing_else_was_bought(
    storefront, product, localstripe
):
    first = storefront.new_purchase(product.sku, "cust-retry-alone")
    declined = storefront.pay(first["id"], "pm_card_chargeCustomerFail")
    assert declined.status_code == 402, declined.content

    retry = storefront.pay(first["id"], extra={"retry_of": declined.json()["operation"]})

    assert retry.status_code == 201, retry.content
    assert len(localstripe.succeeded_charges_for(first["id"])) == 1
