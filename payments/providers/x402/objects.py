"""The x402 rail's vocabulary: the transfer object the services apply, the chain's
statuses, the words a settle or a refund send is classified with, the fault drills."""

from __future__ import annotations

from payments.enums import Outcome, Reason

from ..base import ProviderObject

OBJECT_TYPE = "x402_transfer"


# The chain-level statuses an x402_transfer object carries (X402Transfer.outcome_for maps
# them): confirmed -> succeeded; pending -> awaiting_provider; expired/canceled/invalid ->
# failed; unknown -> unknown; anything else: no verdict.
class ChainStatus:
    CONFIRMED = "confirmed"
    PENDING = "pending"
    EXPIRED = "expired"
    CANCELED = "canceled"
    INVALID = "invalid"
    UNKNOWN = "unknown"
    UNUSED = "unused"  # the authorization is still usable: no verdict
    # The payer's nonce was used by a transaction that moved nothing to pay_to (EIP-3009
    # nonces are the payer's, shared by every transfer/receive/cancel on the token): the
    # authorization to Verity can never move money. Applied as `invalid` with the stable
    # reason USED_ELSEWHERE_REASON (payments.providers.base knows only the chain words).
    USED_ELSEWHERE = "used_elsewhere"


USED_ELSEWHERE_REASON = Reason.AUTHORIZATION_USED_ELSEWHERE.value


class X402Transfer(ProviderObject):
    """An EIP-3009 authorization's transfer (or a refund's transfer back) as the chain
    shows it: the x402 rail's vocabulary (payments.providers.base.ProviderObject)."""

    @property
    def final(self) -> bool:
        # Read from the chain only (no webhooks): mined, expired, cancelled or unusable.
        return self.status in (
            ChainStatus.CONFIRMED,
            ChainStatus.EXPIRED,
            ChainStatus.CANCELED,
            ChainStatus.INVALID,
        )

    @property
    def canceled(self) -> bool:
        return self.status == ChainStatus.CANCELED

    @property
    def money_in_flight(self) -> bool:
        # Broadcast but not mined: `pending`, or an authorization still `unused` whose
        # transaction hash is known (it may still land).
        return self.status == ChainStatus.PENDING or (
            self.status == ChainStatus.UNUSED and bool(self.id)
        )

    @property
    def refund_returned_nothing(self) -> bool:
        return self.status in (ChainStatus.INVALID, ChainStatus.EXPIRED, ChainStatus.CANCELED)

    @property
    def refund_in_flight(self) -> bool:
        return self.status == ChainStatus.PENDING

    @property
    def succeeded(self) -> bool:
        return self.status == ChainStatus.CONFIRMED

    def outcome_for(self, kind: str) -> Outcome | None:
        # What the chain (or the facilitator's answer) says of one EIP-3009 authorization
        # or transfer back (docs/x402.md#reconciled-from-the-chain-only): `unused` (still
        # usable) is no verdict.
        return _CHAIN_OUTCOME.get(self.status)

    def shows_no_money_moved(self, kind: str) -> bool:
        # `unused` is not proof (a broadcast transfer may still be mined); the no-money
        # states (expired, canceled, invalid) are verdicts already.
        return False


_CHAIN_OUTCOME = {
    ChainStatus.CONFIRMED: Outcome.SUCCEEDED,
    ChainStatus.PENDING: Outcome.AWAITING_PROVIDER,
    ChainStatus.EXPIRED: Outcome.FAILED,
    ChainStatus.CANCELED: Outcome.FAILED,
    ChainStatus.INVALID: Outcome.FAILED,
    ChainStatus.UNKNOWN: Outcome.UNKNOWN,
}


class SettleKind:
    SUCCESS = "success"
    PENDING = "pending"
    INVALID = "invalid"
    UNKNOWN = "unknown"
    NOT_SENT = "not_sent"


class DrillMode:
    # The facilitator settles for real; its answer is then dropped (a reset after the
    # request was written): Verity cannot know what happened.
    DROP_ANSWER_AFTER_SEND = "drop_answer_after_send"
    ALL = (DROP_ANSWER_AFTER_SEND,)


def never_connected(exc: Exception) -> bool:
    text = repr(exc)
    return "NewConnectionError" in text or "Connection refused" in text
