"""The x402 SDK's own `requests` client buys a report through Verity on the
local chain, with no Verity-specific payment code: its stock spend policy only widened
in configuration (the local USDC is not one of its default assets), the API key as a
session header. 402 -> it pays -> 202 while the chain is slow -> 200 with the report,
one transfer on chain."""

from __future__ import annotations

import os

import pytest
from x402 import x402ClientSync
from x402.http.clients.requests import x402_requests
from x402.mechanisms.evm import EthAccountSigner
from x402.mechanisms.evm.exact import register_exact_evm_client

from payments import services
from payments.models import PaymentOperation, ProviderCall
from payments.providers.x402 import decode_header
from tests.outbox import settle_outbox

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_sdks_own_client_buys_a_report(live_server, agent, report, chain):
    purchase = agent.new_purchase(report.sku)
    payer = chain.new_payer()
    client = register_exact_evm_client(x402ClientSync(), EthAccountSigner(payer))
    client.set_spend_controls(
        {
            "allowed_assets": [
                {  # configuration only
                    "network": os.environ["X402_NETWORK"],
                    "asset": os.environ["X402_ASSET"],
                    "max_amount_per_payment": str(20 * 10**6),
                }
            ]
        }
    )  # the buyer's cap: 20 USDC
    session = x402_requests(client)
    session.headers["Authorization"] = f"Api-Key {agent.key}"
    url = f"{live_server.url}/api/v1/purchases/{purchase['id']}/deliverable"

    chain.automine(False)  # the chain is slow: the facilitator answers settlement_pending
    pending = session.get(url, timeout=60)
    chain.mine()
    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    services.operation_reconcile(operation_id=op.id, actor="test")  # the sweep's read-back
    settle_outbox()
    done = session.get(url, timeout=60)  # polling: no second payment

    assert pending.status_code == 202 and pending.json()["code"] == "settlement_pending", (
        pending.text
    )
    assert done.status_code == 200, done.text
    assert done.json()["result"]
    assert decode_header(pending.headers["PAYMENT-RESPONSE"])["errorReason"] == "settlement_pending"
    assert chain.transfers(payer.address) == 1
    assert ProviderCall.objects.filter(operation=op, step="settle").count() == 1
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1
    session.close()
