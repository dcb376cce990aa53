"""The attacker's and the judge's side: raw chain reads (eth_getLogs, receipts) and the
payer's own transactions. Nothing here calls Verity's proof code."""

from __future__ import annotations

from web3 import Web3

from payments.models import PaymentOperation, X402Authorization
from payments.providers.x402 import decode_header
from tests.x402.chain import SIGNATURE, ChainJudge, sign

PRICE_ATOMIC = 1250 * 10**4
TWA = (
    "transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,"
    "uint8,bytes32,bytes32)"
)


def required(agent, purchase) -> str:
    return agent.get(f"purchases/{purchase['id']}/deliverable").headers["PAYMENT-REQUIRED"]


def send(agent, purchase, header):
    return agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header})


def signed(agent, purchase, payer, **kw) -> tuple[str, dict, str]:
    """(PAYMENT-SIGNATURE, authorization, signature) for the purchase, by the SDK client."""
    header, auth = sign(required(agent, purchase), payer, **kw)
    return header, auth, decode_header(header)["payload"]["signature"]


def charge(purchase) -> PaymentOperation:
    return PaymentOperation.objects.get(purchase_id=purchase["id"], kind="charge")


def submit(chain, auth: dict, signature: str) -> str:
    """Anyone submits a payer's signed authorization straight to the token."""
    sig = bytes.fromhex(signature[2:])
    fn = chain.token.get_function_by_signature(TWA)
    return Web3.to_hex(
        fn(
            Web3.to_checksum_address(auth["from"]),
            Web3.to_checksum_address(auth["to"]),
            int(auth["value"]),
            int(auth["validAfter"]),
            int(auth["validBefore"]),
            bytes.fromhex(auth["nonce"][2:]),
            sig[64],
            sig[:32],
            sig[32:64],
        ).transact({"from": chain.admin})
    )


def counted_received(payer: str) -> int:
    """What Verity counts as received from `payer`: its succeeded x402 charges' values."""
    return sum(
        int(a.value)
        for a in X402Authorization.objects.filter(payer=payer, operation__outcome="succeeded")
    )


def audit(chain, *purchases):
    ops = [charge(p) for p in purchases]
    auths = X402Authorization.objects.filter(pk__in=[o.id for o in ops])
    return ChainJudge(chain).audit(auths, succeeded={o.id for o in ops if o.outcome == "succeeded"})
