"""Stripe's vocabulary: what a PaymentIntent's or a Refund's status means in Verity's
words (payments.providers.base.ProviderObject). The services ask these properties and
never hold sets of Stripe statuses themselves."""
from __future__ import annotations

from ..base import ProviderObject

# PaymentIntent statuses in which a cancel still stops the payment before money moves
# (the buyer's 3-D Secure or a slow confirm could otherwise complete it later).
_CANCELLABLE_INTENT = frozenset({"requires_payment_method", "requires_confirmation",
                                 "requires_action"})
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
