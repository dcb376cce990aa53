"""A signature the token refuses is refused before anything is stored or sent: a malleated
(high-s) form of the payer's own signature recovers to the payer, but FiatTokenV2_2
(OpenZeppelin ECDSA) reverts it, so a settle would burn gas and hold the purchase."""

from __future__ import annotations

import pytest

from payments.models import PaymentOperation, ProviderCall
from payments.providers.x402 import decode_header, encode_header
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)

N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def _malleated(header: str) -> str:
    payload = decode_header(header)
    sig = bytes.fromhex(payload["payload"]["signature"][2:])
    r, s, v = sig[:32], int.from_bytes(sig[32:64], "big"), sig[64]
    high = r + (N - s).to_bytes(32, "big") + bytes([55 - v])  # 27 <-> 28
    payload["payload"]["signature"] = "0x" + high.hex()
    return encode_header(payload)


@pytest.mark.parametrize("form", ["high_s", "v_not_27_28"])
def test_a_signature_the_token_refuses_is_refused_before_anything_is_stored(
    agent, report, chain, form
):
    purchase = agent.new_purchase(report.sku)
    required = agent.get(f"purchases/{purchase['id']}/deliverable").headers["PAYMENT-REQUIRED"]
    payer = chain.new_payer()
    header, auth = sign(required, payer)
    if form == "high_s":
        bad = _malleated(header)
    else:
        payload = decode_header(header)
        sig = bytes.fromhex(payload["payload"]["signature"][2:])
        payload["payload"]["signature"] = "0x" + (sig[:64] + bytes([sig[64] - 27])).hex()
        bad = encode_header(payload)

    r = agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: bad})

    assert r.status_code == 402, r.content
    assert (
        decode_header(r.headers["PAYMENT-REQUIRED"])["error"]
        == "invalid_exact_evm_payload_signature"
    )
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0
    assert ProviderCall.objects.filter(operation__purchase_id=purchase["id"]).count() == 0
    assert chain.transfers(payer.address) == 0
    assert not chain.authorization_used(payer.address, auth["nonce"])
