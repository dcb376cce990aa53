"""Which adapter serves each rail: the one registration a rail needs.

A rail is a package beside `stripe/` and `x402/` (as Saleor's `payment/gateways/<name>/`)
whose adapter implements `payments.providers.base.RailAdapter`, plus one line in
`_ADAPTERS` below and a `Rail` value (payments/enums.py). The services pick the adapter
for an operation's rail through `payments.services.provider_for(operation)`; nothing
else imports a rail's package to reach its provider. A rail that keeps its own evidence
in Verity's tables (x402: the authorization and the refund transfer) also registers its
read-back and refund send as a `RailEvidence`
(`payments.services.common.rail_evidence_register`), from its own services module
(payments/services/x402_refunds.py), which payments/services/__init__.py imports.
"""

from __future__ import annotations

from collections.abc import Callable

from payments.enums import Rail

from . import stripe, x402
from .base import RailAdapter

_ADAPTERS: dict[str, Callable[[], RailAdapter]] = {
    Rail.STRIPE.value: stripe.get_provider,
    Rail.X402.value: x402.get_provider,
}


class UnknownRail(LookupError):
    """An operation names a rail that has no adapter: a programming or data error, never
    something to guess around (no default rail)."""


def registered_rails() -> tuple[str, ...]:
    return tuple(_ADAPTERS)


def adapter_for_rail(rail: str) -> RailAdapter:
    """The adapter of `rail`. Raises UnknownRail, naming the registered rails."""
    factory = _ADAPTERS.get(str(rail))
    if factory is None:
        raise UnknownRail(
            f"no payment adapter is registered for rail {rail!r}; registered "
            f"rails: {', '.join(sorted(_ADAPTERS))} "
            "(payments/providers/registry.py)"
        )
    return factory()
