"""The Stripe rail's adapter (as Saleor's `payment/gateways/stripe/`).

`api.py` is the only module that calls the Stripe SDK for money movements; `webhooks.py`
verifies and normalises Stripe's webhook deliveries. The rail is registered in
`payments/providers/registry.py`; services reach it through
`payments.services.provider_for(operation)`, never by importing this package.
"""

from .api import (
    LIST_MAX_PAGES,
    LIST_PAGE_LIMIT,
    SHARED_PAYMENT_TOKEN_PREFIX,
    DrillMode,
    DrillRefused,
    FaultDrillHTTPClient,
    StripeProvider,
    get_provider,
    normalise,
)
from .objects import StripeObject

__all__ = [
    "LIST_MAX_PAGES",
    "LIST_PAGE_LIMIT",
    "SHARED_PAYMENT_TOKEN_PREFIX",
    "DrillMode",
    "DrillRefused",
    "FaultDrillHTTPClient",
    "StripeObject",
    "StripeProvider",
    "get_provider",
    "normalise",
]
