"""Stripe's vocabulary: what a PaymentIntent's or a Refund's status means in Verity's
words (payments.providers.base.ProviderObject). The services ask these properties and
never hold sets of Stripe statuses themselves."""

from __future__ import annotations

from payments.enums import OperationKind, Outcome

from ..base import ProviderObject

# PaymentIntent statuses in which a cancel still stops the payment before money moves
# (the buyer's 3-D Secure or a slow confirm could otherwise complete it later).
_CANCELLABLE_INTENT = frozenset(
    {"requires_payment_method", "requires_confirmation", "requires_action"}
)
# PaymentIntent statuses in which a payment's confirm never applied or the buyer never
# acted: no money moved (yet).
_NOT_APPLIED_INTENT = frozenset(
    {"requires_payment_method", "requires_confirmation", "requires_action"}
)
_REFUND_OUTCOME = {
    "succeeded": Outcome.SUCCEEDED,
    "pending": Outcome.AWAITING_PROVIDER,
    "requires_action": Outcome.AWAITING_PROVIDER,
    "failed": Outcome.FAILED,
    "canceled": Outcome.FAILED,
}
# Statuses Stripe does not move on its own any more.
_FINAL = frozenset({"succeeded", "requires_capture", "canceled", "failed"})
# A refund's statuses in which the provider may still pay the buyer back.
_REFUND_IN_FLIGHT = frozenset({"pending", "requires_action"})
# A refund's statuses that returned nothing (a later event cannot revive them).
_REFUND_RETURNED_NOTHING = frozenset({"failed", "canceled"})


class StripeObject(ProviderObject):
    """A PaymentIntent or a Refund as Stripe reports it."""

    @property
    def _intent(self) -> bool:
        return self.object_type == "payment_intent"

    @property
    def _refund(self) -> bool:
        return self.object_type == "refund"

    @property
    def confirm_unapplied(self) -> bool:
        return self._intent and self.status == "requires_confirmation"

    @property
    def cancellable(self) -> bool:
        return self._intent and self.status in _CANCELLABLE_INTENT

    @property
    def canceled(self) -> bool:
        return self.status == "canceled"

    @property
    def money_in_flight(self) -> bool:
        return self.status == "processing" or self.refund_in_flight

    @property
    def refund_returned_nothing(self) -> bool:
        return self._refund and self.status in _REFUND_RETURNED_NOTHING

    @property
    def refund_in_flight(self) -> bool:
        return self._refund and self.status in _REFUND_IN_FLIGHT

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def final(self) -> bool:
        return self.status in _FINAL

    def outcome_for(self, kind: str) -> Outcome | None:
        """docs/reliability.md#outcome-classification. For a capture, `requires_capture` is
        not yet success; for a void, only `canceled` is success."""
        s = self.status
        if self._refund:
            return _REFUND_OUTCOME.get(s)
        if kind == OperationKind.VOID:
            if s == "canceled":
                return Outcome.SUCCEEDED
            if s == "succeeded":
                return Outcome.FAILED  # already captured: it can no longer be voided
            return None
        if kind == OperationKind.CAPTURE:
            if s == "succeeded":
                return Outcome.SUCCEEDED
            if s == "canceled":
                return Outcome.FAILED
            return None  # requires_capture: the capture has not happened (yet)
        if s in ("succeeded", "requires_capture"):
            return Outcome.SUCCEEDED
        if s == "processing":
            return Outcome.AWAITING_PROVIDER
        if s == "requires_action":
            return Outcome.AWAITING_BUYER
        if s == "canceled":
            return Outcome.FAILED
        if s == "requires_payment_method" and self.has_payment_error:
            return Outcome.FAILED
        # requires_confirmation / requires_payment_method without an error: confirm never
        # applied (yet). Absence of evidence is not failure.
        return None

    def shows_no_money_moved(self, kind: str) -> bool:
        s = self.status
        if self._refund:
            return False
        if kind in (OperationKind.CHARGE, OperationKind.AUTHORIZE):
            return s in _NOT_APPLIED_INTENT
        if kind == OperationKind.CAPTURE:
            return s == "requires_capture" or s in _NOT_APPLIED_INTENT  # nothing captured
        if kind == OperationKind.VOID:
            return s == "requires_capture"  # the authorization still stands: not cancelled
        return False
