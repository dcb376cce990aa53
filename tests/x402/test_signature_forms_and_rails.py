"""Signature encodings the token reads differently, and the two rails on one purchase.
Counted on the chain (Transfer logs, authorizationState) and in DB rows."""

from __future__ import annotations

import pytest

from payments import services
from payments.models import PaymentOperation, ProviderCall
from payments.providers.x402 import decode_header, encode_header
from tests.outbox import settle_outbox
from tests.x402.chainside import PRICE_ATOMIC, charge, send, signed

pytestmark = pytest.mark.django_db(transaction=True)


def _with_signature(header: str, mutate) -> str:
    doc = decode_header(header)
    sig = bytes.fromhex(doc["payload"]["signature"][2:])
    doc["payload"]["signature"] = "0x" + mutate(sig).hex()
    return encode_header(doc)


def _compact(sig: bytes) -> bytes:
    """EIP-2098: r, then s with v's parity in its top bit (64 bytes)."""
    r, s, v = sig[:32], int.from_bytes(sig[32:64], "big"), sig[64]
    return r + (s | ((v - 27) << 255)).to_bytes(32, "big")


@pytest.mark.parametrize("form", ["compact_64", "padded_66", "v_plus_4", "upper_hex"])
def test_signature_encodings_are_refused_or_pay_once(agent, report, chain, form):
    payer = chain.new_payer()
    purchase = agent.new_purchase(report.sku)
    header, auth, _sig = signed(agent, purchase, payer)
    if form == "upper_hex":
        doc = decode_header(header)
        doc["payload"]["signature"] = "0x" + doc["payload"]["signature"][2:].upper()
        bad = encode_header(doc)
    else:
        bad = _with_signature(
            header,
            {
                "compact_64": _compact,
                "padded_66": lambda s: s + b"\0",
                "v_plus_4": lambda s: s[:64] + bytes([s[64] + 4]),
            }[form],
        )
    r = send(agent, purchase, bad)
    settle_outbox()
    ops = PaymentOperation.objects.filter(purchase_id=purchase["id"])
    if r.status_code in (400, 402):
        assert (
            not ops.exists()
            and not ProviderCall.objects.filter(operation__purchase_id=purchase["id"]).exists()
        )
        assert not chain.authorization_used(payer.address, auth["nonce"])
        # The genuine form still pays, once.
        assert send(agent, purchase, header).status_code in (200, 202)
        settle_outbox()
    assert chain.received_from(payer.address) == PRICE_ATOMIC or (
        r.status_code == 202 and ops.get().outcome != "succeeded"
    )
    assert (
        PaymentOperation.objects.filter(purchase_id=purchase["id"], outcome="succeeded").count()
        <= 1
    )
    assert chain.transfers(payer.address) <= 1


def test_a_card_payment_while_an_x402_transfer_is_pending_is_refused(agent, report, chain):
    payer = chain.new_payer()
    purchase = agent.new_purchase(report.sku)
    header, _auth, _sig = signed(agent, purchase, payer)
    chain.automine(False)
    assert send(agent, purchase, header).status_code == 202
    card = agent.pay(purchase["id"])
    chain.mine()
    chain.automine(True)
    services.operation_reconcile(operation_id=charge(purchase).id, actor="test")
    settle_outbox()

    assert card.status_code == 409, card.content
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1
    assert charge(purchase).outcome == "succeeded"
    assert chain.received_from(payer.address) == PRICE_ATOMIC


def test_an_x402_payment_after_a_card_payment_is_refused_before_settle(agent, report, chain):
    purchase = agent.new_purchase(report.sku)
    paid = agent.pay(purchase["id"])
    settle_outbox()
    assert paid.status_code in (200, 201, 202), paid.content
    payer = chain.new_payer()
    header, auth, _sig = (
        signed(agent, purchase, payer)
        if agent.get(f"purchases/{purchase['id']}/deliverable").status_code == 402
        else (None, None, None)
    )
    if header is None:  # no 402 offered once paid: sign against a fresh purchase's terms
        other = agent.new_purchase(report.sku)
        header, auth, _sig = signed(agent, other, payer)
    r = send(agent, purchase, header)
    settle_outbox()

    assert r.status_code in (402, 409), r.content
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"], rail="x402").count() == 0
    assert chain.received_from(payer.address) == 0
    assert not chain.authorization_used(payer.address, auth["nonce"])
