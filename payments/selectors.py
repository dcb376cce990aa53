"""Payments reads: lookups (a client sees only its own rows).

The views and their `next_action` are built by payments/api/presenters.py, at the edge: a
view joins the core's rows with the workflow's (fulfilment steps, the order reference), so
it sits above both layers, beside every surface that reads it.
"""
from __future__ import annotations

from .models import ApiClient, PaymentOperation, Product, Purchase
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
