"""A settlement waiting for the chain, as every surface shows it: the REST purchase view,
the console purchase page, the customer's status page and the metrics."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from payments.models import PaymentOperation, X402Authorization
from support.access import Role, ensure_groups
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)


def _pending(agent, report, chain):
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    payer = chain.new_payer()
    header, _ = sign(agent.get(url).headers["PAYMENT-REQUIRED"], payer)
    chain.automine(False)
    agent.get(url, **{SIGNATURE: header})
    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    assert op.outcome == "awaiting_provider"
    return purchase, op, payer


def test_every_surface_shows_the_rail_network_payer_and_transaction(
    agent, report, chain, client, settings
):
    settings.X402_EXPLORER_TX_URL = "https://explorer.example/tx/{tx}"
    purchase, op, payer = _pending(agent, report, chain)
    tx = X402Authorization.objects.get(operation=op).transaction_hash
    ensure_groups()
    user = User.objects.create_user(username="olga-x402", password="pw")
    user.groups.add(*Group.objects.filter(name=Role.OPERATOR))
    client.force_login(user)

    view = agent.get(f"purchases/{purchase['id']}").json()
    page = client.get(f"/console/purchases/{purchase['id']}/").content.decode()
    status = client.get(f"/status/{op.purchase.status_token}/").content.decode()
    metrics = client.get("/metrics").content.decode()

    assert view["payment"]["rail"] == "x402"
    assert view["payment"]["x402"]["network"] == "eip155:31337"
    assert view["payment"]["x402"]["payer"] == payer.address
    assert view["payment"]["x402"]["transaction"] == tx
    assert "waiting for confirmation on eip155:31337" in view["customer_message"]
    assert "x402" in page and payer.address in page
    assert f"https://explorer.example/tx/{tx}" in page
    assert "separate transfer back" in page
    assert "Don&#x27;t pay again" in status or "Don't pay again" in status
    assert "verity_x402_pending_settlements 1.0" in metrics
    chain.mine()
