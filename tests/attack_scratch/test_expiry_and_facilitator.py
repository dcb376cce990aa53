""""No money ever" verdicts against the chain: an expiry taken at the latest block (no
depth) then rolled back (evm_snapshot / evm_revert), and a facilitator that broadcasts
the transfer but answers a refusal. Judged from raw Transfer logs and DB rows."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.attack_scratch.chainside import (
    PRICE_ATOMIC,
    charge,
    send,
    signed,
)
from tests.x402.conftest import settle_outbox

pytestmark = pytest.mark.django_db(transaction=True)


class _Refuse(Exception):
    """before_settle raises it to answer its body without forwarding anything."""


def _facilitator_that_refuses_after_sending(real: str, *, status: int = 200,
                                             before_settle=None):
    """Passes /supported and /settle to the real facilitator (which broadcasts and mines the
    transfer), then answers /settle with a refusal: an invalid-signature verdict (status
    200), or a refused credential (status 401/403, no body). `before_settle()` runs first
    (e.g. the payer's balance moves away: the real facilitator then refuses honestly)."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            r = requests.get(f"{real}{self.path}", timeout=10)
            self._answer(r.status_code, r.json())

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if self.path == "/settle" and before_settle is not None:
                try:
                    before_settle()
                except _Refuse as refusal:
                    return self._answer(200, refusal.args[0])
                r = requests.post(f"{real}{self.path}", json=body, timeout=30)
                return self._answer(r.status_code, r.json())
            r = requests.post(f"{real}{self.path}", json=body, timeout=30)
            answer = r.json()
            if self.path == "/settle":
                if status != 200:
                    return self._answer(status, {"error": "unauthorized"})
                answer = {"success": False, "errorReason": "invalid_exact_evm_payload_signature",
                          "transaction": "", "network": answer.get("network", ""),
                          "payer": answer.get("payer", "")}
            self._answer(200, answer)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.xfail(strict=True, reason="ChainJudge.audit checks only 'counted <= received': "
                   "12.50 received for a failed purchase (counted 0) is no violation")
def test_the_chain_judge_finds_money_received_for_a_failed_purchase(agent, report, chain,
                                                                     settings):
    """The judge of the drills and the machine, asked about the refusing-facilitator case:
    the chain's Transfer logs to pay_to must equal what Verity counts as received."""
    from tests.attack_scratch.chainside import audit

    server = _facilitator_that_refuses_after_sending(chain.facilitator)
    settings.X402_FACILITATOR_URL = f"http://127.0.0.1:{server.server_port}"
    try:
        payer = chain.new_payer()
        purchase = agent.new_purchase(report.sku)
        header, _auth, _sig = signed(agent, purchase, payer)
        send(agent, purchase, header)
    finally:
        server.shutdown()
    settle_outbox()
    assert charge(purchase).outcome == "failed"
    assert chain.received_from(payer.address) == PRICE_ATOMIC

    assert audit(chain, purchase).violations != []
