"""Query sets that load an operation view in ONE statement (issue 18).

`operation_view` needs the operation, its purchase (and quote, for a failed payment's
next action), its hold, the payment that retried it, and three counts: dispatch and
reconcile provider calls, and payment attempts on the purchase. Joined, and counted with
scalar subqueries on the foreign-key indexes, that is one round trip instead of five;
`payments.selectors` falls back to its own queries for an operation loaded without them.

The counts are `RawSQL` on purpose: the ORM's `Subquery(…annotate(Count))` costs more CPU
to compile on every request (~5 ms, expression hashing) than the whole query takes in
PostgreSQL. The SQL is plain and portable (PostgreSQL and SQLite).
"""
from __future__ import annotations

from django.db.models import IntegerField, QuerySet
from django.db.models.expressions import RawSQL

from .enums import PAYMENT_KINDS, CallPurpose
from .models import PaymentOperation, ProviderCall

_OP = PaymentOperation._meta.db_table
_CALL = ProviderCall._meta.db_table
_PAYMENT_KIND_VALUES = [k.value for k in PAYMENT_KINDS]


def _calls(purpose: CallPurpose) -> RawSQL:
    return RawSQL(f'SELECT COUNT(*) FROM "{_CALL}" c WHERE c."operation_id" = "{_OP}"."id" '
                  f'AND c."purpose" = %s', [purpose.value], output_field=IntegerField())


def _payment_attempts() -> RawSQL:
    marks = ", ".join(["%s"] * len(_PAYMENT_KIND_VALUES))
    return RawSQL(f'SELECT COUNT(*) FROM "{_OP}" p WHERE p."purchase_id" = '
                  f'"{_OP}"."purchase_id" AND p."kind" IN ({marks})', _PAYMENT_KIND_VALUES,
                  output_field=IntegerField())


def _retried_by_id() -> RawSQL:
    # Only the id of the retry is shown: one scalar, not a join of its ~40 columns.
    return RawSQL(f'SELECT r."id" FROM "{_OP}" r WHERE r."retry_of_id" = "{_OP}"."id"', [])


def operations_for_view(qs: QuerySet | None = None) -> QuerySet:
    """`qs` (default: every operation) joined and annotated for `operation_view`."""
    qs = PaymentOperation.objects.all() if qs is None else qs
    return (qs.select_related("purchase", "purchase__quote", "hold")
            .annotate(view_dispatch_attempts=_calls(CallPurpose.DISPATCH),
                      view_reconcile_attempts=_calls(CallPurpose.RECONCILE),
                      view_payment_attempts=_payment_attempts(),
                      view_retried_by_id=_retried_by_id()))


def retried_by_id(op: PaymentOperation) -> str | None:
    """The id of the operation that retried `op`, from the annotation if loaded."""
    if "view_retried_by_id" in op.__dict__:
        return op.view_retried_by_id
    retry = getattr(op, "retried_by", None)
    return retry.id if retry is not None else None


__all__ = ["operations_for_view", "retried_by_id"]


# -- the purchase view: its operations read once ----------------------------------------

_OPS_ATTR = "_view_operations"


def purchase_operations_load(purchase) -> list:
    """Read the purchase's operations once (with their parents), ordered by creation, and
    keep them on the instance for the rest of one `purchase_view` (which drops them at its
    end): the latest payment, the refund summary and the customer copy all read this list
    instead of one query each."""
    ops = list(purchase.operations.select_related("parent").order_by("created_at", "id"))
    setattr(purchase, _OPS_ATTR, ops)
    return ops


_ORDER_ATTR = "_view_order_reference"


def purchase_order_reference(purchase, read) -> str | None:
    """`read(purchase.id)` once per `purchase_view` (the view and the customer copy both
    show it)."""
    if _ORDER_ATTR not in purchase.__dict__:
        if purchase_operations_loaded(purchase) is None:
            return read(purchase.id)  # not inside a purchase_view: read as before
        purchase.__dict__[_ORDER_ATTR] = read(purchase.id)
    return purchase.__dict__[_ORDER_ATTR]


def purchase_operations_loaded(purchase) -> list | None:
    """The list `purchase_operations_load` kept on this instance, or None."""
    return getattr(purchase, _OPS_ATTR, None)


def purchase_operations_forget(purchase) -> None:
    purchase.__dict__.pop(_OPS_ATTR, None)
    purchase.__dict__.pop(_ORDER_ATTR, None)


__all__ += ["purchase_operations_forget", "purchase_order_reference", "purchase_operations_load",
            "purchase_operations_loaded"]
