"""Payments reads: lookups (a client sees only its own rows) and limits.

The views and their `next_action` are built by payments/presenters.py (re-exported here).
"""
from __future__ import annotations

from .models import ApiClient, PaymentOperation, Product, Purchase

# Re-exported: the views and next actions are built by payments/presenters.py.
from .presenters import (  # noqa: F401
    UNKNOWN_MESSAGE,
    disputes_view,
    iso,
    operation_next_action,
    operation_view,
    product_view,
    purchase_next_action,
    purchase_view,
    quote_view,
    status_url,
    _iso,
)
from .services.holds import _period_start, client_limits as figures_for
from .view_queries import CompiledRead, operations_for_view

# -- lookups (ownership: a client sees only its own purchases) ------------------------


def products_list():
    return Product.objects.order_by("sku")


# Compiled once per process, a prepared statement on PostgreSQL (payments.view_queries).
_PURCHASE_OF_CLIENT = CompiledRead(
    lambda pk, client_id: Purchase.objects.select_related("quote")
    .filter(pk=pk, api_client_id=client_id)[:1],
    "\x01verity-purchase", "\x01verity-client")


def purchase_get_for_client(*, purchase_id: str, api_client: ApiClient) -> Purchase | None:
    # By primary key: no ORDER BY (.first() would add one).
    found = _PURCHASE_OF_CLIENT.instances(purchase_id, api_client.pk)
    return found[0] if found else None


def operation_get_for_client(*, operation_id: str, api_client: ApiClient
                             ) -> PaymentOperation | None:
    """The client's own operations; a resolver credential (`operations:resolve`, an
    operations tool that must act on operations it did not request) sees every one."""
    qs = operations_for_view().filter(pk=operation_id)
    if not api_client.has_scope("operations:resolve"):
        qs = qs.filter(purchase__api_client=api_client)
    return next(iter(qs[:1]), None)  # by primary key: no ORDER BY to compile


# -- limits -------------------------------------------------------------------------


def client_limits(api_client: ApiClient) -> dict:
    """limit, consumed, reserved, unknown_exposure (minor units, the client's currency).

    The figures are the very ones the core's limit check uses (services.client_limits), so
    what a client reads is what it will be held to.
    """
    figures = figures_for(api_client)
    limit = figures["limit"] or None
    return {
        "currency": figures["currency"],
        "limit": limit,
        "period": figures["period"],
        "period_start": _iso(_period_start(api_client)),
        "consumed": figures["consumed"],
        "reserved": figures["reserved"],
        "unknown_exposure": figures["unknown_exposure"],
        "available": figures["available"] if limit else None,
    }
