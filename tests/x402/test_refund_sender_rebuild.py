"""A refund signer rebuilt when X402_RPC_URL or X402_REFUND_RECEIPT_TIMEOUT change
(get_refund_sender()) signs no nonce twice: the new instance has a new in-process send lock. While
refund 1 has read the signer's nonce (and will sign and broadcast with it) the setting
changes and refund 2 is dispatched in another thread of the same process through the
rebuilt signer. Judged on the chain: each refund exactly one transfer, two distinct
nonces, nothing signed over; the chain stays in control (automine off while pending)."""

import os
import threading
import time
from urllib.parse import urlparse

import pytest
from django.db import connections

from bench.fault_proxy import FaultProxy
from payments import services
from payments.models import PaymentOperation, X402RefundTransfer
from payments.providers.x402 import get_refund_sender
from tests.outbox import settle_outbox
from tests.x402.test_refund_nonce_race import (
    FUNDS,
    _mined_nonce,
    _race_after_the_nonce_read,
    _sends,
    _signer_lock_now,
    _two_approved_refunds,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("change", ["receipt_timeout", "rpc_url"])
def test_a_rebuild_mid_refund_never_signs_over_its_nonce(
    agent, report, chain, people, monkeypatch, settings, change
):
    settings.X402_REFUND_RECEIPT_TIMEOUT = 0.5
    payer, refund_1, refund_2, sender, signer_nonce = _two_approved_refunds(
        agent, report, chain, people
    )
    assert get_refund_sender() is sender
    chain.automine(False)
    proxy = None
    if change == "rpc_url":
        proxy = FaultProxy(urlparse(os.environ["X402_RPC_URL"]).port)
        proxy.up()
    other: dict = {}

    def competitor():
        if change == "rpc_url":
            settings.X402_RPC_URL = proxy.base
        else:
            settings.X402_REFUND_RECEIPT_TIMEOUT = 0.6

        def dispatch_2():
            try:
                other["sender"] = get_refund_sender()
                other["op"] = services.operation_dispatch(operation_id=refund_2.id)
            except BaseException as exc:  # noqa: BLE001
                other["error"] = repr(exc)
            finally:
                connections.close_all()

        t = threading.Thread(target=dispatch_2, daemon=True)
        other["thread"] = t
        t.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and t.is_alive():
            if _signer_lock_now(sender.address)[1]:
                other["waited"] = True
                break
            time.sleep(0.05)

    seen = _race_after_the_nonce_read(monkeypatch, sender, competitor)
    try:
        done_1 = services.operation_dispatch(operation_id=refund_1.id)
        other["thread"].join(60)
        assert "error" not in other, other
        assert other["sender"] is not sender  # rebuilt
        pending = chain.pending()
        chain.mine()
        read_1 = services.operation_reconcile(operation_id=refund_1.id, actor="test")
        read_2 = services.operation_reconcile(operation_id=refund_2.id, actor="test")
        settle_outbox()
    finally:
        chain.automine(True)
        if proxy is not None:
            proxy.down()

    print(
        "outcomes",
        done_1.outcome,
        other["op"].outcome,
        read_1.outcome,
        read_2.outcome,
        "waited",
        other.get("waited"),
        "pending",
        len(pending),
    )
    assert seen == [signer_nonce]
    row_1 = X402RefundTransfer.objects.get(operation=refund_1)
    row_2 = X402RefundTransfer.objects.get(operation=refund_2)
    assert (read_1.outcome, read_2.outcome) == ("succeeded", "succeeded")
    assert {
        _mined_nonce(chain, row_1.transaction_hash),
        _mined_nonce(chain, row_2.transaction_hash),
    } == {signer_nonce, signer_nonce + 1}
    assert chain.transfers_back(payer.address) == 2
    assert chain.balance(payer.address) == FUNDS
    assert _sends(refund_1) == 1 and _sends(refund_2) == 1
    assert PaymentOperation.objects.get(id=refund_2.id).outcome == "succeeded"
