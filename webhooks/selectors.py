"""Reads for webhook processing and for the console (queues, timelines)."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from payments.enums import PAYMENT_KINDS, TERMINAL_OUTCOMES, OperationKind
from payments.models import PaymentOperation
from payments.providers.base import ProviderObject

from .models import EventResult, ProviderEvent

_PI_KINDS = (*PAYMENT_KINDS, OperationKind.CAPTURE, OperationKind.VOID)


def quarantined_events() -> QuerySet[ProviderEvent]:
    """The operators' queue: oldest first."""
    return ProviderEvent.objects.filter(result=EventResult.QUARANTINED).order_by(
        "received_at", "id"
    )


def events_for_operation(op_id: str) -> QuerySet[ProviderEvent]:
    return ProviderEvent.objects.filter(operation_id=op_id).order_by("received_at", "id")


def events_for_purchase(purchase_id: str) -> QuerySet[ProviderEvent]:
    """Events matched to the purchase, or naming it in their metadata (so a quarantined
    or still-held event shows on the timeline too)."""
    return ProviderEvent.objects.filter(purchase_id=purchase_id).order_by("received_at", "id")


# -- matching (reads payments' rows; the writes stay in payments.services) ------------


def _operations():
    return PaymentOperation.objects.select_related("purchase", "parent")


def payment_operation_for_intent(intent_id: str):
    """The charge/authorize operation whose PaymentIntent this is, or None."""
    if not intent_id:
        return None
    return (
        _operations()
        .filter(provider_reference=intent_id, kind__in=PAYMENT_KINDS)
        .order_by("-created_at")
        .first()
    )


def operation_for_payment_intent(obj: ProviderObject):
    """The operation a PaymentIntent event is about.

    capture/void operations act on their parent's PaymentIntent: the most recent
    non-terminal operation on that PaymentIntent is the one the event can settle;
    otherwise the payment operation (where a late event is judged stale or conflicting).
    Falls back to the `operation_id` metadata when no operation holds the reference yet.
    """
    ops = list(
        _operations()
        .filter(
            Q(provider_reference=obj.id, kind__in=_PI_KINDS)
            | Q(
                parent__provider_reference=obj.id,
                kind__in=(OperationKind.CAPTURE, OperationKind.VOID),
            )
        )
        .order_by("-created_at", "-pk")
    )
    if not ops:
        meta_op = obj.metadata.get("operation_id")
        if not meta_op:
            return None
        root = _operations().filter(pk=meta_op, kind__in=PAYMENT_KINDS).first()
        if root is None:
            return None
        ops = [
            root,
            *_operations()
            .filter(parent=root, kind__in=(OperationKind.CAPTURE, OperationKind.VOID))
            .order_by("-created_at", "-pk"),
        ]
        ops.sort(key=lambda o: (o.created_at, o.pk), reverse=True)
    for op in ops:
        if op.outcome not in TERMINAL_OUTCOMES:
            return op
    for op in ops:
        if op.kind in PAYMENT_KINDS:
            return op
    return ops[0]


def operation_for_refund(obj: ProviderObject):
    """The refund operation a Refund event is about: by reference, else metadata."""
    op = (
        _operations()
        .filter(provider_reference=obj.id, kind=OperationKind.REFUND)
        .order_by("-created_at")
        .first()
    )
    if op is None and obj.metadata.get("operation_id"):
        op = (
            _operations().filter(pk=obj.metadata["operation_id"], kind=OperationKind.REFUND).first()
        )
    return op
