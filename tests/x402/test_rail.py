"""The x402 rail end to end: 402 requirements -> PAYMENT-SIGNATURE -> one settle through
the real facilitator -> one transfer on the real chain -> deliverable + PAYMENT-RESPONSE."""

from __future__ import annotations

import pytest

from payments.models import PaymentOperation, ProviderCall, X402Authorization
from payments.providers.x402 import decode_header
from recovery.models import StepRun
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)


def _unpaid(agent, report):
    purchase = agent.new_purchase(report.sku)
    r = agent.get(f"purchases/{purchase['id']}/deliverable")
    assert r.status_code == 402, r.content
    return purchase, r


def test_an_unpaid_deliverable_answers_402_with_the_quote_as_requirements(agent, report, chain):
    purchase, r = _unpaid(agent, report)

    required = decode_header(r.headers["PAYMENT-REQUIRED"])
    assert r.json()["code"] == "payment_required"
    [accepts] = required["accepts"]
    assert required["x402Version"] == 2
    assert accepts["scheme"] == "exact" and accepts["network"] == "eip155:31337"
    assert accepts["amount"] == str(1250 * 10**4)  # 12.50 USD in USDC's 6 decimals
    assert accepts["payTo"] == chain.pay_to
    assert accepts["asset"] == chain.token.address
    assert accepts["extra"] == {"name": "USD Coin", "version": "2"}
    assert "payment-identifier" in required["extensions"]
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0


def test_a_signed_authorization_moves_money_once_and_delivers_the_report(agent, report, chain):
    purchase, r = _unpaid(agent, report)
    payer = chain.new_payer()
    header, auth = sign(r.headers["PAYMENT-REQUIRED"], payer)

    paid = agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header})
    settle_outbox()
    again = agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header})

    assert paid.status_code in (200, 202), paid.content
    assert again.status_code == 200, again.content
    assert again.headers["Payment-Replayed"] == "true"
    response = decode_header(again.headers["PAYMENT-RESPONSE"])
    assert response["success"] is True and response["network"] == "eip155:31337"
    assert chain.transfers(payer.address) == 1
    assert chain.balance(chain.pay_to) >= 1250 * 10**4
    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    assert (op.rail, op.outcome, op.verification) == ("x402", "succeeded", "provider")
    stored = X402Authorization.objects.get(operation=op)
    assert stored.nonce == auth["nonce"].lower() and stored.payer == payer.address
    assert op.provider_reference == stored.transaction_hash == response["transaction"]
    assert ProviderCall.objects.filter(operation=op, purpose="dispatch", step="settle").count() == 1
    assert (
        StepRun.objects.filter(purchase_id=purchase["id"], step="deliverable", state="done").count()
        == 1
    )
    assert again.json()["result"]
