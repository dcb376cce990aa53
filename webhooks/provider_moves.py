"""Processing of events about money the provider moved on its own: disputes
(`charge.dispute.*`), refunds no Verity operation requested (`refund.*`,
`charge.refunded`) and captures/cancels of an authorization made outside Verity
(`payment_intent.succeeded` / `payment_intent.canceled`).

`evaluate_provider_move` runs first in `webhooks.services._evaluate_locked`; it returns
a verdict, or None to let the ordinary matching judge the event (an event about
Verity's own operation always goes there). Writes go through payments' services
(`payments.services.disputes`, `payments.services.external`).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db.models import Sum

from payments.enums import PAYMENT_KINDS, OperationKind, Origin, Outcome, Verification
from payments.errors import ApplyResult
from payments.models import PaymentOperation
from payments.providers.stripe.webhooks import (
    dispute_from_event_payload,
    object_from_event_payload,
)
from payments.services import operation_apply_observation
from payments.services.disputes import DisputeApply, dispute_apply_observation
from payments.services.external import (
    ExternalResult,
    external_intent_move_record,
    external_refund_record,
)
from recovery.models import OutboxCategory
from recovery.outbox import outbox_put

from . import selectors
from .models import EventResult, ProviderEvent

DISPUTE_EVENT_PREFIX = "charge.dispute."
EXTERNAL_REFUND_EVENT_TYPES = frozenset(
    {
        "refund.created",
        "refund.updated",
        "charge.refund.updated",
    }
)
EXTERNAL_INTENT_EVENT_TYPES = frozenset({"payment_intent.succeeded", "payment_intent.canceled"})


@dataclass(frozen=True)
class MoveVerdict:
    result: EventResult
    reason: str = ""
    operation_id: str = ""
    purchase_id: str = ""


def evaluate_provider_move(event: ProviderEvent) -> MoveVerdict | None:
    object_type = str((event.payload["data"]["object"] or {}).get("object") or "")
    if object_type == "dispute" and event.type.startswith(DISPUTE_EVENT_PREFIX):
        return _dispute(event)
    if object_type == "refund" and event.type in EXTERNAL_REFUND_EVENT_TYPES:
        return _refund(event)
    if object_type == "charge" and event.type == "charge.refunded":
        _charge_refunded(event)
        return None  # the ordinary handler still prompts read-backs of Verity's refunds
    if object_type == "payment_intent" and event.type in EXTERNAL_INTENT_EVENT_TYPES:
        return _intent(event)
    return None


def _actor(event: ProviderEvent) -> str:
    return f"webhook:{event.event_id}"[:150]


def _dispute(event: ProviderEvent) -> MoveVerdict:
    obj = dispute_from_event_payload(event.payload)
    applied = dispute_apply_observation(
        obj=obj,
        verification=Verification.WEBHOOK,
        cause=f"webhook:{event.type}"[:64],
        actor=_actor(event),
    )
    ids = {"operation_id": applied.operation_id, "purchase_id": applied.purchase_id}
    if applied.result == DisputeApply.APPLIED:
        return MoveVerdict(EventResult.APPLIED, "dispute", **ids)
    if applied.result in (DisputeApply.NO_CHANGE, DisputeApply.STALE):
        return MoveVerdict(EventResult.IGNORED, f"dispute_{applied.result.value}", **ids)
    if applied.result == DisputeApply.NO_MATCH:
        return MoveVerdict(EventResult.HELD, "no_matching_operation")
    if applied.result == DisputeApply.WAITING:
        return MoveVerdict(EventResult.HELD, applied.reason, **ids)
    if applied.result == DisputeApply.CONFLICT:
        return MoveVerdict(EventResult.QUARANTINED, f"conflict:dispute:{applied.reason}", **ids)
    return MoveVerdict(EventResult.QUARANTINED, f"mismatch:{applied.reason}", **ids)


def _payment_for(intent_id: str, charge_id: str):
    payment = selectors.payment_operation_for_intent(intent_id)
    if payment is None and charge_id:
        payment = (
            PaymentOperation.objects.filter(provider_charge=charge_id, kind__in=PAYMENT_KINDS)
            .order_by("-created_at")
            .first()
        )
    return payment


def _external_verdict(recorded, *, fall_through_on=()) -> MoveVerdict | None:
    ids = {"operation_id": recorded.operation_id, "purchase_id": recorded.purchase_id}
    if recorded.result in fall_through_on:
        return None
    if recorded.result == ExternalResult.RECORDED:
        return MoveVerdict(EventResult.APPLIED, "made_outside_verity", **ids)
    if recorded.result == ExternalResult.MISMATCH:
        return MoveVerdict(EventResult.QUARANTINED, f"mismatch:{recorded.reason}", **ids)
    if recorded.result == ExternalResult.NOT_EXTERNAL:
        return MoveVerdict(EventResult.HELD, recorded.reason or "not_settled", **ids)
    if recorded.result == ExternalResult.NOTHING_MOVED:
        return MoveVerdict(EventResult.IGNORED, recorded.reason, **ids)
    return None


def _apply_to_external(event: ProviderEvent, op, obj) -> MoveVerdict:
    """A later event about an external operation already recorded (a pending dashboard
    refund that succeeded, a redelivery): the one observation function applies it. The
    object carries none of Verity's metadata, which the ordinary matching would call a
    mismatch."""

    applied = operation_apply_observation(
        operation_id=op.pk,
        obj=obj,
        source=Verification.WEBHOOK,
        cause=f"webhook:{event.type}"[:64],
        actor=_actor(event),
    )
    applied = ApplyResult(applied)
    value = applied.value
    ids = {"operation_id": op.pk, "purchase_id": op.purchase_id}
    if applied is ApplyResult.APPLIED:
        return MoveVerdict(EventResult.APPLIED, "made_outside_verity", **ids)
    if applied in (ApplyResult.NO_CHANGE, ApplyResult.STALE):
        return MoveVerdict(EventResult.IGNORED, value, **ids)
    return MoveVerdict(EventResult.QUARANTINED, value, **ids)


def _refund(event: ProviderEvent) -> MoveVerdict | None:
    obj = object_from_event_payload(event.payload)
    known = selectors.operation_for_refund(obj)
    if known is not None and known.origin == Origin.PROVIDER:
        return _apply_to_external(event, known, obj)
    if obj.metadata.get("operation_id") or known is not None:
        return None  # Verity's own refund (its answer may not be applied yet)
    charge = str(event.payload["data"]["object"].get("charge") or "")
    payment = _payment_for(obj.payment_intent, charge)
    if payment is None:
        return None
    recorded = external_refund_record(
        payment_operation_id=payment.pk,
        refund=obj,
        verification=Verification.WEBHOOK,
        cause=f"webhook:{event.type}"[:64],
        actor=_actor(event),
    )
    return _external_verdict(recorded, fall_through_on=(ExternalResult.KNOWN,))


def _charge_refunded(event: ProviderEvent) -> None:
    """The Charge says how much was refunded, not which refunds: if that is more than
    Verity's own refunds explain, read the payment's refunds at the provider (outbox,
    outside this transaction) and record the external ones."""
    data = event.payload["data"]["object"]
    obj = object_from_event_payload(event.payload)
    payment = _payment_for(obj.payment_intent, obj.id)
    refunded = data.get("amount_refunded")
    if payment is None or not isinstance(refunded, int):
        return
    expected_account = payment.provider_account or getattr(settings, "STRIPE_ACCOUNT", "") or ""
    if obj.account != expected_account or (
        obj.currency and obj.currency.lower() != payment.currency.lower()
    ):
        return  # the ordinary handler quarantines it
    explained = (
        payment.children.filter(kind=OperationKind.REFUND)
        .exclude(outcome=Outcome.FAILED)
        .aggregate(s=Sum("amount"))["s"]
        or 0
    )
    if refunded > explained:
        outbox_put(
            category=OutboxCategory.PROVIDER_REFUNDS_READ,
            payload={"operation": payment.pk},
            dedupe_key=f"refunds-read:{payment.pk}:{event.event_id}",
        )


def _intent(event: ProviderEvent) -> MoveVerdict | None:
    obj = object_from_event_payload(event.payload)
    payment = selectors.payment_operation_for_intent(obj.id)
    if (
        payment is None
        or payment.kind != OperationKind.AUTHORIZE
        or payment.outcome != Outcome.SUCCEEDED
    ):
        return None
    external = payment.children.filter(
        origin=Origin.PROVIDER,
        kind=(OperationKind.CAPTURE if obj.succeeded else OperationKind.VOID),
    ).first()
    if external is not None:  # redelivered or repeated: already recorded
        return MoveVerdict(
            EventResult.IGNORED, "made_outside_verity_known", external.pk, external.purchase_id
        )
    recorded = external_intent_move_record(
        payment_operation_id=payment.pk,
        obj=obj,
        verification=Verification.WEBHOOK,
        cause=f"webhook:{event.type}"[:64],
        actor=_actor(event),
    )
    return _external_verdict(
        recorded, fall_through_on=(ExternalResult.NOT_EXTERNAL, ExternalResult.KNOWN)
    )
