"""Declining a refund awaiting approval through the API."""

import pytest

from payments.models import PaymentOperation
from support.models import AuditEntry

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_declined_refund_sends_nothing_and_frees_the_amount(
    other_storefront, ops_tool, product, localstripe
):
    # given a paid purchase of a client without automatic refunds, and a refund request
    purchase = other_storefront.new_purchase(product.sku)
    assert other_storefront.pay(purchase["id"]).status_code == 201
    r = other_storefront.post(f"purchases/{purchase['id']}/refunds", {})
    assert r.status_code == 202 and r.json()["outcome"] == "awaiting_approval", r.content
    refund_id = r.json()["id"]
    # a client without operations:resolve cannot decline; no reason is refused
    r = other_storefront.post(f"operations/{refund_id}/decline", {"reason": "mine"})
    assert r.status_code == 403, r.content
    r = ops_tool.post(f"operations/{refund_id}/decline", {"reason": ""})
    assert r.status_code == 400, r.content
    r = ops_tool.post(f"operations/{refund_id}/decline", {"reason": "x", "force": True})
    assert r.status_code == 400 and r.json()["code"] == "unknown_field", r.content
    assert PaymentOperation.objects.get(id=refund_id).outcome == "awaiting_approval"
    # when the ops tool declines it
    r = ops_tool.post(f"operations/{refund_id}/decline", {"reason": "not returned"})
    # then nothing reached the provider, the decision is audited, the amount is free
    assert r.status_code == 200, r.content
    assert (r.json()["outcome"], r.json()["reason"]) == ("failed", "refund_declined")
    pi = localstripe.succeeded_charges_for(purchase["id"])[0]
    assert localstripe.refunds_for(pi["id"]) == []
    assert AuditEntry.objects.filter(action="refund_decline", reason="not returned").count() == 1
    r = ops_tool.post(f"operations/{refund_id}/decline", {"reason": "again"})
    assert r.status_code == 409 and r.json()["code"] == "not_awaiting_approval"
    r = other_storefront.post(f"purchases/{purchase['id']}/refunds", {})
    assert r.status_code == 202 and r.json()["amount"] == purchase["amount"], r.content
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="refund").count() == 2
