"""A facilitator's "success" is not the proof of money, on the local chain too: one that
answers success naming another buyer's transaction gets nothing paid (the receipt read
finds no transfer of THIS authorization)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from payments.models import PaymentOperation
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)


def _lying_facilitator(transaction: str, supported: dict):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._answer(supported)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer({"success": True, "transaction": transaction, "network": "eip155:31337"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_success_naming_another_buyers_transaction_pays_nothing(agent, report, chain, settings):
    import requests

    other = agent.new_purchase(report.sku)
    required = agent.get(f"purchases/{other['id']}/deliverable").headers["PAYMENT-REQUIRED"]
    header, _ = sign(required, chain.new_payer())
    agent.get(f"purchases/{other['id']}/deliverable", **{SIGNATURE: header})
    settle_outbox()
    theirs = PaymentOperation.objects.get(purchase_id=other["id"]).provider_reference
    assert theirs
    supported = requests.get(f"{chain.facilitator}/supported", timeout=5).json()
    server = _lying_facilitator(theirs, supported)
    settings.X402_LOCAL_CHAIN = True
    settings.X402_FACILITATOR_URL = f"http://127.0.0.1:{server.server_port}"
    try:
        purchase = agent.new_purchase(report.sku)
        required = agent.get(f"purchases/{purchase['id']}/deliverable").headers["PAYMENT-REQUIRED"]
        payer = chain.new_payer()
        header, auth = sign(required, payer)
        r = agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header})
        settle_outbox()
    finally:
        server.shutdown()

    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    assert op.outcome != "succeeded", (op.outcome, r.content)
    assert r.status_code == 202 and r.json()["code"] == "settlement_pending", r.content
    assert chain.transfers(payer.address) == 0
    assert not chain.authorization_used(payer.address, auth["nonce"])
