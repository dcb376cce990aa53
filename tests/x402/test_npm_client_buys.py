"""Interop beside tests/x402/test_sdk_client_buys.py: the x402 project's own npm client
(`@x402/fetch` with `@x402/evm`, pinned in tools/x402_fetch/package-lock.json) buys a
report through Verity on the local chain, unmodified: tools/x402_fetch/buy.mjs only wires
the stock wrapper to a viem account and sends the API key. 402 -> it pays -> 202 while the
chain is slow -> 200 with the report; one transfer on chain, one settle."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from payments import services
from payments.models import PaymentOperation, ProviderCall
from tests.outbox import settle_outbox

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "tools" / "x402_fetch"

if not (CLIENT / "node_modules" / "@x402" / "fetch").is_dir() or not shutil.which("node"):
    reason = "needs Node and tools/x402_fetch's packages: make deps"
    if os.environ.get("CI"):
        raise RuntimeError(reason)  # CI must run it, never skip it silently
    pytest.skip(reason, allow_module_level=True)


def _buy(url: str, *, payer_key: str, api_key: str) -> dict:
    env = {
        "PATH": os.environ["PATH"],
        "X402_BUYER_KEY": payer_key,
        "VERITY_API_KEY": api_key,
        # the buyer's spend policy (configuration only): this chain's USDC, capped at 20
        "X402_NETWORK": os.environ["X402_NETWORK"],
        "X402_ASSET": os.environ["X402_ASSET"],
        "X402_MAX_AMOUNT": str(20 * 10**6),
    }
    done = subprocess.run(
        ["node", str(CLIENT / "buy.mjs"), url],
        env=env,
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_npm_client_buys_a_report(live_server, agent, report, chain):
    purchase = agent.new_purchase(report.sku)
    payer = chain.new_payer()
    url = f"{live_server.url}/api/v1/purchases/{purchase['id']}/deliverable"
    buyer = {"payer_key": "0x" + payer.key.hex().removeprefix("0x"), "api_key": agent.key}

    chain.automine(False)  # the chain is slow: the facilitator answers settlement_pending
    pending = _buy(url, **buyer)
    chain.mine()
    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    services.operation_reconcile(operation_id=op.id, actor="test")  # the sweep's read-back
    settle_outbox()
    done = _buy(url, **buyer)  # polling: no second payment

    assert pending["status"] == 202 and pending["body"]["code"] == "settlement_pending", pending
    assert pending["paymentResponse"]["errorReason"] == "settlement_pending"
    assert done["status"] == 200, done
    assert done["body"]["result"]
    assert chain.transfers(payer.address) == 1
    assert ProviderCall.objects.filter(operation=op, step="settle").count() == 1
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1
