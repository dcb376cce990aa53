"""Payments reads: lookups (a client sees only its own rows).

The views and their `next_action` are built by payments/api/presenters.py, at the edge: a
view joins the core's rows with the workflow's (fulfilment steps, the order reference), so
it sits above both layers, beside every surface that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from .customers import customer_key
from .enums import PAYMENT_KINDS, DisputeStatus, OperationKind, Outcome
from .models import ApiClient, Dispute, PaymentOperation, Product, Purchase
from .view_queries import CompiledRead, operations_for_view

# -- lookups (ownership: a client sees only its own purchases) ------------------------


def products_list():
    return Product.objects.order_by("sku")


PURCHASE_LIST_MAX = 100


@dataclass(frozen=True)
class PurchaseFilter:
    statuses: tuple[str, ...] = ()
    customer_reference: str = ""
    created_after: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive
    amount_min: int | None = None
    amount_max: int | None = None


def purchases_list_for_client(
    *,
    api_client: ApiClient,
    where: PurchaseFilter,
    cursor: tuple[datetime, str] | None = None,
    limit: int = 20,
) -> list[Purchase]:
    """The client's purchases, newest first, after `cursor` (the last row's created_at and
    id): keyset pagination, so a page costs the same at row 10 and at row 1 000 000."""
    qs = Purchase.objects.select_related("quote").filter(api_client=api_client)
    if where.statuses:
        qs = qs.filter(status__in=where.statuses)
    if where.customer_reference:
        # Matched as the purchase stored it: trimmed, NFKC, case-insensitive (its key).
        qs = qs.filter(customer_key=customer_key(where.customer_reference))
    if where.created_after:
        qs = qs.filter(created_at__gte=where.created_after)
    if where.created_before:
        qs = qs.filter(created_at__lt=where.created_before)
    if where.amount_min is not None:
        qs = qs.filter(amount__gte=where.amount_min)
    if where.amount_max is not None:
        qs = qs.filter(amount__lte=where.amount_max)
    if cursor is not None:
        at, pk = cursor
        # `created_at <= at` is implied by the OR, and is what the index can seek to: the
        # OR alone made the planner walk the client's index from its newest row (a page
        # deep in 1 M purchases read ~half of them: bench/scale.py "later page").
        qs = qs.filter(created_at__lte=at).filter(
            Q(created_at__lt=at) | Q(created_at=at, id__lt=pk)
        )
    return list(qs.order_by("-created_at", "-id")[: max(1, min(limit, PURCHASE_LIST_MAX))])


# Compiled once per process, a prepared statement on PostgreSQL (payments.view_queries).
_PURCHASE_OF_CLIENT = CompiledRead(
    lambda pk, client_id: Purchase.objects.select_related("quote").filter(
        pk=pk, api_client_id=client_id
    )[:1],
    "\x01verity-purchase",
    "\x01verity-client",
)


def purchase_get_for_client(*, purchase_id: str, api_client: ApiClient) -> Purchase | None:
    # By primary key: no ORDER BY (.first() would add one).
    found = _PURCHASE_OF_CLIENT.instances(purchase_id, api_client.pk)
    return found[0] if found else None


def operation_get_for_client(
    *, operation_id: str, api_client: ApiClient
) -> PaymentOperation | None:
    """The client's own operations; a resolver credential (`operations:resolve`, an
    operations tool that must act on operations it did not request) sees every one."""
    qs = operations_for_view().filter(pk=operation_id)
    if not api_client.has_scope("operations:resolve"):
        qs = qs.filter(purchase__api_client=api_client)
    return next(iter(qs[:1]), None)  # by primary key: no ORDER BY to compile


# -- money (goods follow it: docs/reliability.md#rules-every-money-movement-obeys) ----


@dataclass(frozen=True)
class PurchaseMoney:
    """What the purchase's OWN payment did with the buyer's money (a duplicate charge and
    its return excluded): read from the operations and disputes, never from the status."""

    paid: bool  # a charge succeeded or an authorization is held
    captured: int  # charged, or captured of an authorization
    refunded: int  # own refunds the provider confirmed
    refund_awaiting_provider: bool  # an own refund the provider has not settled yet
    voided: bool  # the authorization was released
    dispute_lost: bool  # the bank gave (some of) the money back to the buyer
    dispute_lost_amount: int = 0  # what lost disputes gave back (a chargeback may be partial)

    @property
    def returned(self) -> bool:
        """The money went back to the buyer IN FULL: voided, or refunds and lost disputes
        together gave back all that was captured. A lost chargeback of part of the payment
        leaves the merchant the rest: the goods stay, as after a partial refund."""
        return self.voided or (
            self.captured > 0 and self.refunded + self.dispute_lost_amount >= self.captured
        )

    @property
    def kept(self) -> bool:
        return self.paid and not self.returned


def purchase_money(purchase_id: str) -> PurchaseMoney:
    own = PaymentOperation.objects.filter(purchase_id=purchase_id, is_duplicate=False).exclude(
        parent__is_duplicate=True
    )
    rows = own.values_list("kind", "outcome", "amount")
    paid = captured = refunded = 0
    awaiting = voided = False
    for kind, outcome, amount in rows:
        if kind in PAYMENT_KINDS and outcome == Outcome.SUCCEEDED:
            paid = 1
            if kind == OperationKind.CHARGE:
                captured += amount
        elif kind == OperationKind.CAPTURE and outcome == Outcome.SUCCEEDED:
            captured += amount
        elif kind == OperationKind.REFUND and outcome == Outcome.SUCCEEDED:
            refunded += amount
        elif kind == OperationKind.REFUND and outcome == Outcome.AWAITING_PROVIDER:
            awaiting = True
        elif kind == OperationKind.VOID and outcome == Outcome.SUCCEEDED:
            voided = True
    lost = list(
        Dispute.objects.filter(
            purchase_id=purchase_id, payment__is_duplicate=False, status=DisputeStatus.LOST
        ).values_list("amount", flat=True)
    )
    return PurchaseMoney(
        paid=bool(paid),
        captured=captured,
        refunded=refunded,
        refund_awaiting_provider=awaiting,
        voided=voided,
        dispute_lost=bool(lost),
        dispute_lost_amount=sum(lost),
    )
