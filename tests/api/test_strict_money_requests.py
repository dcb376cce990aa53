"""Money requests are strict (docs/walkthrough.md#api-rules-the-code-relies-on; duplicate
SKU lines are merged): a field Verity
does not understand, or another currency, is refused before anything is written."""

import pytest

from payments.models import Hold, PaymentOperation, Product, Purchase, Quote
from recovery.models import InventoryCommit
from tests.api.client import new_key
from tests.factories import ProductFactory
from tests.outbox import settle_outbox

pytestmark = pytest.mark.django_db(transaction=True)


def _code(response) -> str:
    return response.json().get("code")


def test_a_tip_and_another_currency_are_refused_and_nothing_is_charged(
    storefront, product, localstripe
):
    purchase = storefront.new_purchase(product.sku)
    key = new_key()
    # when an agent "tips" in euros
    r = storefront.post(
        f"purchases/{purchase['id']}/payments",
        {"payment_method": "pm_card_visa", "currency": "eur", "tip": 100},
        key=key,
    )
    # then it learns that it did not: 400 naming the field, nothing at the provider
    assert r.status_code == 400 and _code(r) == "unknown_field", r.content
    assert r.json()["fields"] == ["tip"]
    assert "tip" in r.json()["detail"]
    assert localstripe.payment_intents_for(purchase["id"]) == []
    assert not PaymentOperation.objects.filter(purchase_id=purchase["id"]).exists()
    # when only the currency is wrong: 422 currency_mismatch, still nothing
    r = storefront.post(
        f"purchases/{purchase['id']}/payments",
        {"payment_method": "pm_card_visa", "currency": "eur"},
        key=key,
    )
    assert r.status_code == 422 and _code(r) == "currency_mismatch", r.content
    assert localstripe.payment_intents_for(purchase["id"]) == []
    assert not PaymentOperation.objects.filter(purchase_id=purchase["id"]).exists()
    assert not Hold.objects.exists()
    # the refusals bound nothing: the same key with the right body charges once
    r = storefront.post(
        f"purchases/{purchase['id']}/payments",
        {"payment_method": "pm_card_visa", "currency": "USD"},
        key=key,
    )
    assert r.status_code == 201, r.content
    assert len(localstripe.succeeded_charges_for(purchase["id"])) == 1


def test_quotes_refuse_a_discount_and_an_item_price(storefront, product):
    r = storefront.post(
        "quotes",
        {"items": [{"sku": product.sku, "quantity": 1}], "currency": "usd", "discount": 50},
    )
    assert r.status_code == 400 and r.json()["fields"] == ["discount"], r.content
    r = storefront.post(
        "quotes", {"items": [{"sku": product.sku, "quantity": 1, "price": 1}], "currency": "usd"}
    )
    assert r.status_code == 400 and r.json()["fields"] == ["items[0].price"], r.content
    assert Quote.objects.count() == 0


def test_capture_void_and_refund_refuse_unknown_fields(storefront, product, localstripe):
    purchase = storefront.new_purchase(product.sku)
    r = storefront.pay(purchase["id"])
    assert r.status_code == 201
    for path, body in (
        ("refunds", {"amount": 100, "reason": "x"}),
        ("refunds", {"amount": 100, "currency": "eur"}),
        ("capture", {"amount": 1}),
        ("void", {"force": True}),
    ):
        r = storefront.post(f"purchases/{purchase['id']}/{path}", body)
        assert r.status_code in (400, 422), (path, r.content)
        assert _code(r) in ("unknown_field", "currency_mismatch"), (path, r.content)
    pi = localstripe.succeeded_charges_for(purchase["id"])[0]
    assert localstripe.refunds_for(pi["id"]) == []
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1


def test_a_purchase_in_a_currency_the_client_has_no_limit_for_is_refused(storefront):
    eur = ProductFactory(sku="EUR-1", price=900, currency="eur", stock=5)
    q = storefront.post("quotes", {"items": [{"sku": eur.sku, "quantity": 1}], "currency": "eur"})
    assert q.status_code == 201, q.content
    r = storefront.purchase(q.json())
    assert r.status_code == 422 and _code(r) == "currency_not_allowed", r.content
    assert r.json()["allowed_currencies"] == ["usd"]
    assert Purchase.objects.count() == 0 and Hold.objects.count() == 0


def test_duplicate_sku_lines_are_one_line_and_decrement_stock_once(storefront, localstripe):
    product = ProductFactory(sku="DUP-1", price=1000, stock=10)
    q = storefront.post(
        "quotes",
        {
            "items": [{"sku": product.sku, "quantity": 1}, {"sku": product.sku, "quantity": 2}],
            "currency": "usd",
        },
    )
    assert q.status_code == 201, q.content
    quote = q.json()
    assert [(i["sku"], i["quantity"]) for i in quote["items"]] == [("DUP-1", 3)]
    assert quote["amount"] == 3000
    p = storefront.purchase(quote)
    assert storefront.pay(p.json()["id"]).status_code == 201
    settle_outbox()
    assert Product.objects.get(sku="DUP-1").stock == 7
    assert list(
        InventoryCommit.objects.filter(purchase_id=p.json()["id"]).values_list("sku", "quantity")
    ) == [("DUP-1", 3)]
