"""The x402 rail's adapter object: what the rail is and can do, for the services
(payments.providers.base.RailAdapter). Its calls (the facilitator's settle, the chain
reader, the refund signer) are in facilitator.py, chain.py and refunds.py."""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from payments.enums import Rail

from ..base import RailRefusal
from .objects import OBJECT_TYPE


class X402Provider:
    rail = Rail.X402.value
    # The authorization (payer, nonce) is the identity; its transaction hash may only
    # become known later (the AuthorizationUsed log), so it is not compared.
    reference_is_identity = False
    has_capture_and_void = False
    no_capture_or_void_why = (
        "the transfer is final on chain, there is nothing to void or "
        "capture. A refund is a separate transfer back."
    )
    takes_payment_method_token = False
    # A refund is a transfer back of Verity's own money: a person approves it.
    refunds_need_a_person = True

    def object_type_for(self, kind: str) -> str:
        # A payment is a transfer; a refund on this rail is a transfer back.
        return OBJECT_TYPE

    def dedupes_idempotency_keys(self) -> bool:
        # Nothing on a chain dedupes a second settle: a replay could pay twice.
        return False

    def refund_refusal(self) -> RailRefusal | None:
        if settings.X402_REFUND_PRIVATE_KEY:
            return None
        # No reversal exists on a chain: the money goes back as a separate transfer from
        # the refund signer, and none is configured here.
        return RailRefusal(
            "x402_refund_signer_missing",
            "This purchase was paid over x402: "
            "a refund is a separate transfer back to the payer, and no refund "
            "signer is configured (X402_REFUND_PRIVATE_KEY).",
        )


@lru_cache(maxsize=1)
def get_provider() -> X402Provider:
    return X402Provider()
