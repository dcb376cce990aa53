"""The x402 v2 HTTP transport (the SDK's schemas): the PAYMENT-REQUIRED, PAYMENT-SIGNATURE
and PAYMENT-RESPONSE headers, and what Verity checks of a signed EIP-3009 authorization
before it is forwarded to the facilitator."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from . import sdk

PAYMENT_REQUIRED_HEADER = "PAYMENT-REQUIRED"
PAYMENT_SIGNATURE_HEADER = "PAYMENT-SIGNATURE"
PAYMENT_RESPONSE_HEADER = "PAYMENT-RESPONSE"


class PaymentSignatureInvalid(ValueError):
    pass


@dataclass(frozen=True)
class SignedPayment:
    """A decoded PAYMENT-SIGNATURE: the EIP-3009 authorization and what identifies it."""

    # The PaymentPayload as sent (camelCase), forwarded to the facilitator.
    payload: dict[str, Any]
    accepted: dict[str, Any]
    payer: str
    to: str
    value: str
    valid_after: int
    valid_before: int
    nonce: str
    signature_hash: str
    payload_hash: str
    payment_identifier: str
    signature: str = ""


_PAYLOAD_KEYS = {"authorization", "signature"}
_AUTH_KEYS = {"from", "to", "value", "validAfter", "validBefore", "nonce"}


def _uint256(raw: object) -> int:
    """EIP-3009's uint256 fields: a decimal integer (string or number) in range."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError("not an integer")
    value = int(raw)
    if not 0 <= value < 2**256:
        raise ValueError("out of uint256 range")
    return value


def forwarded_payload(signed: SignedPayment, requirements: dict[str, Any]) -> dict[str, Any]:
    """The PaymentPayload the facilitator settles: rebuilt from what Verity checked (the
    authorization's six fields, the signature, Verity's own requirements as `accepted`),
    never the buyer's document as sent."""
    auth = signed.payload["payload"]["authorization"]
    out = {
        "x402Version": 2,
        "accepted": requirements,
        "payload": {
            "authorization": {k: auth[k] for k in sorted(_AUTH_KEYS)},
            "signature": signed.signature,
        },
    }
    if signed.payload.get("resource"):
        out["resource"] = signed.payload["resource"]
    return out


def signature_matches(
    signed: SignedPayment, *, chain_id: int, token_name: str, token_version: str, asset: str
) -> bool:
    """The EIP-712 TransferWithAuthorization signature recovers to `from` (an EOA's
    signature). False for anything else, including a contract wallet's (EIP-1271/6492),
    which only the chain can judge."""
    try:
        sig = bytes.fromhex(signed.signature[2:])
        if len(sig) != 65:
            return False
        digest = sdk.hash_eip3009_authorization(
            sdk.ExactEIP3009Authorization(
                from_address=signed.payer,
                to=signed.to,
                value=signed.value,
                valid_after=str(signed.valid_after),
                valid_before=str(signed.valid_before),
                nonce=signed.nonce,
            ),
            chain_id,
            sdk.Web3.to_checksum_address(asset),
            token_name,
            token_version,
        )
        return sdk.verify_eoa_signature(digest, sig, signed.payer)
    except Exception:  # noqa: BLE001 - unrecoverable: not an EOA's signature of this
        return False


_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def signature_refused_by_token(signed: SignedPayment) -> bool:
    """An EOA's 65-byte signature the token refuses (OpenZeppelin ECDSA.tryRecover, used
    by FiatTokenV2_2's SignatureChecker): s in the upper half of the curve order (a
    malleated signature) or v not 27/28. A longer signature is a contract wallet's: the
    chain judges it."""
    try:
        sig = bytes.fromhex(signed.signature[2:])
    except ValueError:
        return True
    if len(sig) != 65:
        return False
    return int.from_bytes(sig[32:64], "big") > _SECP256K1_N // 2 or sig[64] not in (27, 28)


def requirements_for(
    *,
    amount_atomic: int,
    network: str,
    asset: str,
    pay_to: str,
    max_timeout_seconds: int,
    token_name: str,
    token_version: str,
) -> dict[str, Any]:
    return sdk.PaymentRequirements(
        scheme="exact",
        network=network,
        asset=asset,
        amount=str(amount_atomic),
        pay_to=pay_to,
        max_timeout_seconds=max_timeout_seconds,
        extra={"name": token_name, "version": token_version},
    ).model_dump(by_alias=True, exclude_none=True)


def payment_required(
    *, requirements: dict[str, Any], resource_url: str, description: str, error: str = ""
) -> dict[str, Any]:
    return sdk.PaymentRequired(
        x402_version=2,
        error=error or None,
        resource=sdk.ResourceInfo(
            url=resource_url, description=description, mime_type="application/json"
        ),
        accepts=[sdk.PaymentRequirements.model_validate(requirements)],
        extensions={sdk.PAYMENT_IDENTIFIER: sdk.declare_payment_identifier_extension()},
    ).model_dump(by_alias=True, exclude_none=True)


def encode_header(value: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(value, separators=(",", ":")).encode()).decode()


def decode_header(value: str) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(base64.b64decode(value.encode(), validate=False).decode())
    return decoded


def parse_payment_signature(header: str) -> SignedPayment:
    try:
        raw = decode_header(header.strip())
        payload = sdk.PaymentPayload.model_validate(raw)
    except Exception as exc:  # noqa: BLE001 - anything undecodable is the sender's error
        raise PaymentSignatureInvalid(
            "PAYMENT-SIGNATURE is not a base64 x402 v2 payment payload"
        ) from exc
    if payload.x402_version != 2:
        raise PaymentSignatureInvalid("only x402 version 2 is accepted")
    inner = payload.payload or {}
    auth = inner.get("authorization") or {}
    signature = str(inner.get("signature") or "")
    # Exactly what Verity checks and nothing beside it: a Permit2 authorization next to the
    # EIP-3009 one would be settled as Permit2 by the facilitator.
    if set(inner) != _PAYLOAD_KEYS or not isinstance(auth, dict) or set(auth) != _AUTH_KEYS:
        raise PaymentSignatureInvalid(
            "the payload must be exactly an EIP-3009 authorization "
            "(authorization: from, to, value, validAfter, "
            "validBefore, nonce; signature) and nothing else"
        )
    try:
        payer = sdk.Web3.to_checksum_address(auth["from"])
        to = sdk.Web3.to_checksum_address(auth["to"])
        value = str(_uint256(auth["value"]))
        valid_after = _uint256(auth["validAfter"])
        valid_before = _uint256(auth["validBefore"])
        nonce = str(auth["nonce"]).lower()
        if not (nonce.startswith("0x") and len(nonce) == 66):
            raise ValueError("nonce")
        int(nonce, 16)
        if not signature.startswith("0x") or len(signature) < 132:
            raise ValueError("signature")
    except (KeyError, TypeError, ValueError) as exc:
        raise PaymentSignatureInvalid(
            "the payload is not an EIP-3009 authorization "
            "(from, to, value, validAfter, validBefore, nonce, "
            "signature)"
        ) from exc
    try:
        identifier = sdk.extract_payment_identifier(payload) or ""
    except Exception:  # noqa: BLE001 - a malformed extension is no identifier
        identifier = ""
    dumped = payload.model_dump(by_alias=True, exclude_none=True)
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":")).encode()
    return SignedPayment(
        payload=dumped,
        accepted=dumped["accepted"],
        payer=payer,
        to=to,
        value=value,
        signature=signature,
        valid_after=valid_after,
        valid_before=valid_before,
        nonce=nonce,
        signature_hash=hashlib.sha256(signature.lower().encode()).hexdigest(),
        payload_hash=hashlib.sha256(canonical).hexdigest(),
        payment_identifier=str(identifier)[:128],
    )


def settle_response(
    *,
    success: bool,
    transaction: str,
    network: str,
    payer: str,
    error_reason: str = "",
    amount: str = "",
) -> dict[str, Any]:
    body = {"success": success, "transaction": transaction, "network": network, "payer": payer}
    if error_reason:
        body["errorReason"] = error_reason
    if amount:
        body["amount"] = amount
    return body
