"""How a settle is classified (docs/x402.md#how-a-settle-is-classified): one settle answer
-> an outcome class. The function is pure; the
table is the rule, and the facilitator-down case runs through Verity for real."""

from __future__ import annotations

import pytest

from payments.models import PaymentOperation
from payments.providers.x402 import SettleKind, classify_settle
from tests.stack import free_port
from tests.x402.chain import SIGNATURE, sign

TX = "0x" + "ab" * 32


@pytest.mark.parametrize(
    "status,body,kind,reason",
    [
        (200, {"success": True, "transaction": TX, "network": "eip155:1"}, SettleKind.SUCCESS, ""),
        (
            200,
            {"success": False, "errorReason": "settlement_pending", "transaction": TX},
            SettleKind.PENDING,
            "",
        ),
        (
            500,
            {"success": False, "errorReason": "settlement_pending", "transaction": TX},
            SettleKind.PENDING,
            "",
        ),
        (
            200,
            {
                "success": False,
                "errorReason": "invalid_exact_evm_payload_signature",
                "transaction": "",
            },
            SettleKind.INVALID,
            "authorization_invalid",
        ),
        (
            200,
            {
                "success": False,
                "errorReason": "invalid_exact_evm_insufficient_balance",
                "transaction": "",
            },
            SettleKind.INVALID,
            "insufficient_balance",
        ),
        # A used nonce may be our own earlier transfer; an expiry is the chain's to prove.
        (
            200,
            {
                "success": False,
                "errorReason": "invalid_exact_evm_nonce_already_used",
                "transaction": "",
            },
            SettleKind.UNKNOWN,
            "",
        ),
        (
            200,
            {
                "success": False,
                "errorReason": "invalid_exact_evm_payload_authorization_valid_before",
                "transaction": "",
            },
            SettleKind.UNKNOWN,
            "",
        ),
        # A failure after a possible broadcast, with or without a hash.
        (
            200,
            {"success": False, "errorReason": "transaction_failed", "transaction": ""},
            SettleKind.UNKNOWN,
            "",
        ),
        (
            200,
            {"success": False, "errorReason": "transaction_failed", "transaction": TX},
            SettleKind.UNKNOWN,
            "",
        ),
        (500, None, SettleKind.UNKNOWN, ""),
        (502, {"error": "bad gateway"}, SettleKind.UNKNOWN, ""),
        (
            500,
            {
                "success": False,
                "errorReason": "invalid_exact_evm_payload_signature",
                "transaction": "",
            },
            SettleKind.UNKNOWN,
            "",
        ),
    ],
)
def test_a_settle_answer_is_classified_by_its_status_and_body(status, body, kind, reason):
    answer = classify_settle(status, body)
    assert (answer.kind, answer.reason) == (kind, reason)


@pytest.mark.django_db(transaction=True)
def test_a_facilitator_that_cannot_be_reached_fails_not_sent_and_nothing_moves(
    agent, report, chain, settings
):
    settings.X402_FACILITATOR_URL = f"http://127.0.0.1:{free_port()}"  # nothing listens
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    payer = chain.new_payer()
    header, _ = sign(agent.get(url).headers["PAYMENT-REQUIRED"], payer)

    r = agent.get(url, **{SIGNATURE: header})

    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    assert r.status_code == 402 and r.json()["code"] == "payment_failed", r.content
    assert (op.outcome, op.reason) == ("failed", "provider_unreachable")
    assert "PAYMENT-REQUIRED" in r.headers
    assert chain.transfers(payer.address) == 0
