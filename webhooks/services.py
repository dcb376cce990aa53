"""Webhook services: ingest a verified event once, process it through the one function
that applies provider observations, and quarantine triage.

Lock order (never reversed anywhere): ProviderEvent row, then the operation row (taken
inside `payments.services.operation_apply_observation`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from audit.services import audit_write
from payments.enums import (
    OWN_RECORD_UNSETTLED,
    PAYMENT_KINDS,
    SLOT_HOLDING_OUTCOMES,
    TERMINAL_OUTCOMES,
    Grade,
    OperationKind,
    Outcome,
    Verification,
)
from payments.errors import ApplyResult, DomainError, ErrorCode
from payments.models import OperationTransition, PaymentOperation
from payments.providers.base import ProviderObject, outcome_from_object
from payments.providers.stripe.webhooks import (
    event_created_at,
    event_shape_problem,
    object_from_event_payload,
    safe_event_payload,
)
from payments.services import (
    operation_apply_observation,
    operation_read_canonical,
    operation_reconcile,
)
from payments.view_queries import execute_prepared
from recovery.models import OutboxCategory, OutboxMessage
from recovery.outbox import outbox_put, reconcile_put, relay_kick

from . import selectors
from .metrics import WEBHOOK_RESULTS
from .models import FINAL_RESULTS, EventResult, ProviderEvent
from .provider_moves import evaluate_provider_move

log = logging.getLogger(__name__)

# An event whose object Verity does not know yet (the webhook beat the synchronous
# response, or the operation row is not committed yet) is retried this many times with
# capped exponential backoff, then quarantined `unmatched` for a person. An event about
# money the provider moved while Verity's own record of it is unsettled (an external
# refund or a dispute of a payment still unknown here; payments.enums.OWN_RECORD_UNSETTLED)
# waits as long as that record does: the reconciler settles it.
HELD_MAX_ATTEMPTS = getattr(settings, "WEBHOOK_HELD_MAX_ATTEMPTS", 10)
HELD_BASE_DELAY_SECONDS = getattr(settings, "WEBHOOK_HELD_BASE_DELAY_SECONDS", 2.0)
HELD_MAX_DELAY_SECONDS = getattr(settings, "WEBHOOK_HELD_MAX_DELAY_SECONDS", 300.0)
# ...polled at most this far apart; the settle of that record retries it at once
# (held_events_retry_now, from the orchestrator's OPERATION_SETTLED follow-up).
HELD_WAITING_MAX_DELAY_SECONDS = getattr(settings, "WEBHOOK_HELD_WAITING_MAX_DELAY_SECONDS", 60.0)

REFUND_EVENT_TYPES = frozenset(
    {
        "refund.created",
        "refund.updated",
        "refund.failed",
        "charge.refund.updated",
    }
)
CHARGE_REFUND_EVENT_TYPES = frozenset({"charge.refunded"})


# -- ingestion -----------------------------------------------------------------------

# One statement both backends parse (PostgreSQL, and SQLite >= 3.35 for `make run`): no
# PostgreSQL-only cast to jsonb — the JSON text is an untyped literal that PostgreSQL
# coerces to the column's jsonb type and SQLite stores as text, which is what Django's
# JSONField reads on each. (Such a cast here made every webhook a 500 on the embedded
# default.)
_INSERT_SQL = """
INSERT INTO webhooks_providerevent
    (event_id, type, account, object_id, created, received_at, payload, result,
     result_reason, operation_id, purchase_id, attempts)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, '', %s, 0)
ON CONFLICT (event_id) DO NOTHING
RETURNING id
"""


def event_ingest(*, event: dict) -> bool:
    """Store a verified event once and queue its processing. True if it was new.

    On PostgreSQL outside a transaction (a webhook request): one statement, the event's
    `INSERT … ON CONFLICT DO NOTHING RETURNING id` and its outbox row in one data-modifying
    CTE (`_event_ingest_one_statement`), the relay kicked once it returns. Otherwise
    (SQLite, or inside a caller's transaction): the same insert and, only when a row came
    back, one outbox insert, in one transaction. Either way a duplicate delivery (also
    concurrent ones) writes nothing, a rejected event is stored without an outbox row, and
    no check-then-insert window exists (dj-stripe #1239).
    """
    rejected = event_shape_problem(event)
    safe = safe_event_payload(event)
    obj = safe["data"]["object"]
    created = event_created_at(safe)
    # Datetimes through the backend's adapter, as the ORM would store them (SQLite keeps
    # naive UTC text; a raw aware value would be stored in another text format).
    adapt = connection.ops.adapt_datetimefield_value
    params = [
        safe["id"][:100],
        safe["type"][:100],
        safe["account"][:100],
        obj["id"][:100],
        adapt(created),
        adapt(timezone.now()),
        json.dumps(safe),
        (EventResult.REJECTED if rejected else EventResult.PENDING).value,
        rejected,
        "" if rejected else obj["metadata"].get("purchase_id", "")[:40],
    ]
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        return _event_ingest_one_statement(params=params, rejected=rejected, event_id=safe["id"])
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_INSERT_SQL, params)
            row = cursor.fetchone()
        if row is None:
            return False
        if rejected:
            # Stored so the delivery is visible and counted; never processed.
            WEBHOOK_RESULTS.labels(result=EventResult.REJECTED.value).inc()
            log.warning("webhook rejected event=%s reason=%s", safe["id"], rejected)
            return True
        outbox_put(
            category=OutboxCategory.PROCESS_EVENT,
            payload={"event": row[0]},
            dedupe_key=f"event:{safe['id']}",
        )
    return True


# PostgreSQL: the event and its outbox row in ONE statement — a data-modifying
# CTE, atomic on its own, so no BEGIN/COMMIT round trips: 1 round trip instead of 4, and
# the same guarantees (a duplicate writes nothing; a rejected event gets no outbox row).
# SQLite has no INSERT inside WITH: it keeps the two statements in one transaction above.
_INSERT_WITH_OUTBOX_SQL = (
    """
WITH e AS ("""
    + _INSERT_SQL
    + """),
o AS (
    INSERT INTO recovery_outboxmessage
        (category, payload, dedupe_key, available_at, claimed_until, attempts, last_error,
         processed_at, created_at)
    SELECT %s, jsonb_build_object('event', e.id), %s, %s, NULL, 0, '', NULL, %s
    FROM e WHERE %s
    ON CONFLICT DO NOTHING
)
SELECT id FROM e
"""
)


def _event_ingest_one_statement(*, params: list, rejected: str, event_id: str) -> bool:
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    outbox = [OutboxCategory.PROCESS_EVENT.value, f"event:{event_id}", now, now, not rejected]
    row = execute_prepared(_INSERT_WITH_OUTBOX_SQL, [*params, *outbox], fetch="one")
    if row is None:
        return False
    if rejected:
        # Stored so the delivery is visible and counted; never processed.
        WEBHOOK_RESULTS.labels(result=EventResult.REJECTED.value).inc()
        log.warning("webhook rejected event=%s reason=%s", event_id, rejected)
        return True
    # Committed already (autocommit, no transaction open): on_commit runs the kick at once,
    # robust as in outbox_put (a failed kick is logged; the beat sweep drains the row).
    relay_kick()
    return True


# -- processing ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Verdict:
    result: EventResult
    reason: str = ""
    operation_id: str = ""
    purchase_id: str = ""
    # set when the provider's record must decide, read outside any transaction: the
    # observation conflicts with a terminal outcome, or states a failure the provider can
    # still undo. Called as decide(event, verdict) -> the final verdict.
    decide: Callable[[ProviderEvent, _Verdict], _Verdict] | None = None


def event_process(*, event_id: int) -> str:
    """Apply one stored event. Idempotent: an event already applied, ignored or
    quarantined returns its result untouched (and counts nothing). Returns the result."""
    with transaction.atomic():
        event = ProviderEvent.objects.select_for_update().get(pk=event_id)
        if event.result in FINAL_RESULTS:
            return event.result
        verdict = _evaluate_locked(event)
        if verdict.decide is None:
            result = _event_finish_locked(event, verdict)
    if verdict.decide is not None:
        # The provider's record decides. The read is network I/O, so it happens with no
        # transaction open; the event stays pending meanwhile (a concurrent run would only
        # repeat the read).
        verdict = verdict.decide(event, verdict)
        with transaction.atomic():
            event = ProviderEvent.objects.select_for_update().get(pk=event_id)
            if event.result in FINAL_RESULTS:
                return event.result
            result = _event_finish_locked(event, verdict)
    WEBHOOK_RESULTS.labels(result=result).inc()
    return result


# Held while a record Verity owns is unsettled or busy: such an event waits as long as
# that record does: it matched, so it is never quarantined by a count of its retries (a
# pending dashboard refund may hold `purchase_busy` for many minutes). Its owners: the
# console's "held" queue, verity_webhook_held_oldest_age_seconds and its alert, and the
# read-back each retry prompts of the record it waits for.
WAITING_ON_OWN_RECORD = (*OWN_RECORD_UNSETTLED, "purchase_busy")


def _prompt_read_back_locked(operation_id: str) -> None:
    """Queue a read-back of the operation a held event waits for, if it can be read (open,
    or settled only by a person: an acknowledged outcome is no longer read on its own
    schedule after ACKNOWLEDGED_READBACK_SECONDS)."""
    op = PaymentOperation.objects.filter(pk=operation_id).values("outcome", "grade").first()
    # Never sent, or being sent right now (its worker settles it): nothing to read yet.
    if op is None or op["outcome"] in (
        Outcome.PENDING,
        Outcome.AWAITING_APPROVAL,
        Outcome.DISPATCHING,
    ):
        return
    if op["outcome"] in TERMINAL_OUTCOMES and op["grade"] != Grade.ACKNOWLEDGED:
        return
    # A read-back already queued for later (the reconcile schedule) absorbs this one: make
    # it due now. Bounded by the held event's own cadence (HELD_WAITING_MAX_DELAY_SECONDS).
    reconcile_put(operation_id=operation_id, due_now=True, even_after_failure=True)


def _event_finish_locked(event: ProviderEvent, verdict: _Verdict) -> str:
    event.attempts += 1
    result, reason = verdict.result, verdict.reason
    fields = ["result", "result_reason", "attempts", "processed_at"]
    if result == EventResult.HELD:
        if event.attempts >= HELD_MAX_ATTEMPTS and reason not in WAITING_ON_OWN_RECORD:
            result, reason = EventResult.QUARANTINED, "unmatched"
        else:
            if reason == "purchase_busy" and verdict.purchase_id:
                # It waits for whatever holds the purchase's slot, not for its payment.
                for busy in PaymentOperation.objects.filter(
                    purchase_id=verdict.purchase_id, outcome__in=SLOT_HOLDING_OUTCOMES
                ).values_list("pk", flat=True):
                    _prompt_read_back_locked(busy)
            elif verdict.operation_id and reason in WAITING_ON_OWN_RECORD:
                _prompt_read_back_locked(verdict.operation_id)
            delay = min(
                HELD_BASE_DELAY_SECONDS * 2 ** (event.attempts - 1),
                HELD_WAITING_MAX_DELAY_SECONDS
                if reason in WAITING_ON_OWN_RECORD
                else HELD_MAX_DELAY_SECONDS,
            )
            # A new dedupe key per attempt: the message being handled right now is still
            # unprocessed and would absorb a re-put under the original key.
            outbox_put(
                category=OutboxCategory.PROCESS_EVENT,
                payload={"event": event.pk},
                dedupe_key=f"event:{event.event_id}:held:{event.attempts}",
                delay_seconds=delay,
            )
    event.result, event.result_reason = result, reason[:200]
    event.processed_at = None if result == EventResult.HELD else timezone.now()
    if verdict.operation_id:
        event.operation_id = verdict.operation_id
        fields.append("operation_id")
    if verdict.purchase_id:
        event.purchase_id = verdict.purchase_id
        fields.append("purchase_id")
    event.save(update_fields=fields)
    log.info(
        "webhook processed event=%s type=%s result=%s reason=%s operation=%s",
        event.event_id,
        event.type,
        result,
        reason,
        event.operation_id,
    )
    return result


def held_events_retry_now(*, operation_id: str) -> int:
    """Verity's record of a payment settled: events held waiting for it (an external refund
    or a dispute of that payment, OWN_RECORD_UNSETTLED) are retried now instead of at their
    backoff. Call inside atomic(). Returns how many were waiting."""
    assert transaction.get_connection().in_atomic_block, "held_events_retry_now needs atomic()"
    waiting = list(
        ProviderEvent.objects.filter(
            operation_id=operation_id,
            result=EventResult.HELD,
            result_reason__in=OWN_RECORD_UNSETTLED,
        ).values_list("pk", flat=True)
    )
    if waiting:
        OutboxMessage.objects.filter(
            category=OutboxCategory.PROCESS_EVENT,
            processed_at__isnull=True,
            payload__event__in=waiting,
            available_at__gt=timezone.now(),
        ).update(available_at=timezone.now())
        outbox_put(
            category=OutboxCategory.NOOP, payload={}, dedupe_key=f"held-events-kick:{operation_id}"
        )
    return len(waiting)


def _evaluate_locked(event: ProviderEvent) -> _Verdict:
    # Disputes and money moved outside Verity first (webhooks.provider_moves); None means
    # the event is about Verity's own operations and the matching below judges it.

    moved = evaluate_provider_move(event)
    if moved is not None:
        return _Verdict(moved.result, moved.reason, moved.operation_id, moved.purchase_id)
    obj = object_from_event_payload(event.payload)
    if obj.object_type == "payment_intent" and event.type.startswith("payment_intent."):
        op = selectors.operation_for_payment_intent(obj)
    elif obj.object_type == "refund" and event.type in REFUND_EVENT_TYPES:
        op = selectors.operation_for_refund(obj)
    elif obj.object_type == "charge" and event.type in CHARGE_REFUND_EVENT_TYPES:
        return _evaluate_charge_refunded(event, obj)
    else:
        return _Verdict(EventResult.IGNORED, "unhandled_type")
    if op is None:
        return _Verdict(EventResult.HELD, "no_matching_operation")
    void = _void_of(op, obj)
    if void is not None:
        op = void  # a canceled PaymentIntent is the void's evidence, not the payment's
    mismatch = _mismatch(op, obj)
    if mismatch:
        return _Verdict(EventResult.QUARANTINED, f"mismatch:{mismatch}", op.pk, op.purchase_id)
    verdict = _apply(event, op, obj)
    if void is not None and verdict.result == EventResult.IGNORED and op.is_terminal:
        # The provider agrees with Verity's void; record that.
        return _Verdict(EventResult.APPLIED, "agrees_with_void", op.pk, op.purchase_id)
    return verdict


def _void_of(op, obj: ProviderObject):
    """The void a `canceled` PaymentIntent answers, if Verity voided that payment."""

    if not obj.canceled or op.kind not in PAYMENT_KINDS:
        return None
    return (
        PaymentOperation.objects.select_related("purchase", "parent")
        .filter(parent=op, kind=OperationKind.VOID)
        .exclude(outcome=Outcome.FAILED)
        .order_by("-created_at")
        .first()
    )


def _older_than_current(event: ProviderEvent, op) -> bool:
    """A non-terminal event created before the state Verity holds was reached (a late
    `processing` after `requires_action`) is history, not news. Compared in whole seconds
    (the provider's `created` resolution); no `created` means no judgement."""

    if event.created is None:
        return False
    newer_event = (
        ProviderEvent.objects.filter(
            object_id=event.object_id, result=EventResult.APPLIED, created__gt=event.created
        )
        .exclude(pk=event.pk)
        .exists()
    )
    if newer_event:
        return True
    last = (
        OperationTransition.objects.filter(operation_id=op.pk, field="outcome", target=op.outcome)
        .order_by("-created_at", "-id")
        .values_list("created_at", flat=True)
        .first()
    )
    return last is not None and event.created < last.replace(microsecond=0)


def _apply(event: ProviderEvent, op, obj: ProviderObject) -> _Verdict:
    target = outcome_from_object(obj, kind=op.kind)
    if (
        target is not None
        and target not in (Outcome.SUCCEEDED, Outcome.FAILED)
        and not op.is_terminal
        and _older_than_current(event, op)
    ):
        return _Verdict(EventResult.IGNORED, "stale_event", op.pk, op.purchase_id)
    if target == Outcome.FAILED and not obj.final and not op.is_terminal:
        # A failed attempt is not the provider's last word: the same PaymentIntent can
        # still be paid (the buyer's 3-D Secure again, another method), and the provider
        # does not order its deliveries, so this event may be older than a success. It
        # settles nothing by itself: the provider's record, read back outside this
        # transaction, does (event_process -> _verify_failure_outside_transaction).
        return _Verdict(
            EventResult.HELD,
            "unverified_failure",
            op.pk,
            op.purchase_id,
            decide=_verify_failure_outside_transaction,
        )

    applied = operation_apply_observation(
        operation_id=op.pk,
        obj=obj,
        source=Verification.WEBHOOK,
        cause=f"webhook:{event.type}"[:64],
        actor=f"webhook:{event.event_id}"[:150],
    )
    applied = ApplyResult(applied)
    value = applied.value
    if applied is ApplyResult.APPLIED:
        return _Verdict(EventResult.APPLIED, "", op.pk, op.purchase_id)
    if applied in (ApplyResult.NO_CHANGE, ApplyResult.STALE):
        return _Verdict(EventResult.IGNORED, value, op.pk, op.purchase_id)
    if applied is ApplyResult.MISMATCH:
        return _Verdict(EventResult.QUARANTINED, "mismatch", op.pk, op.purchase_id)
    if applied is ApplyResult.CONFLICT:
        return _Verdict(
            EventResult.QUARANTINED,
            "conflict",
            op.pk,
            op.purchase_id,
            decide=_resolve_conflict_outside_transaction,
        )
    raise ValueError(f"unexpected apply result {value!r}")


def _mismatch(op, obj: ProviderObject) -> str:
    """The first field on which a signed object disagrees with the operation it claims
    to be about, or "" (docs/webhooks.md#which-account-an-event-is-about). Never applied when
    non-empty."""
    if op.kind == OperationKind.REFUND:
        payment = op.parent or op
        expected_ref, expected_amount = op.provider_reference, op.amount
    elif op.kind in (OperationKind.CAPTURE, OperationKind.VOID):
        # capture/void act on the parent's PaymentIntent, which keeps the authorized
        # amount and the parent's metadata
        payment = op.parent or op
        expected_ref = payment.provider_reference or op.provider_reference
        expected_amount = payment.amount
    else:
        payment = op
        expected_ref, expected_amount = op.provider_reference, op.amount
    expected_account = payment.provider_account or getattr(settings, "STRIPE_ACCOUNT", "") or ""
    if obj.account != expected_account:
        return "account"
    if expected_ref and obj.id != expected_ref:
        return "reference"
    if (
        op.kind == OperationKind.REFUND
        and obj.payment_intent
        and payment.provider_reference
        and obj.payment_intent != payment.provider_reference
    ):
        return "reference"
    if obj.metadata.get("purchase_id") != op.purchase_id:
        return "purchase"
    if obj.metadata.get("customer_reference") != op.purchase.customer_reference:
        return "customer_reference"
    meta_op = obj.metadata.get("operation_id")
    if meta_op and meta_op not in (op.pk, op.parent_id):
        return "operation"
    if obj.amount != expected_amount:
        return "amount"
    if obj.currency.lower() != (op.currency or "").lower():
        return "currency"
    return ""


def _evaluate_charge_refunded(event: ProviderEvent, obj: ProviderObject) -> _Verdict:
    """`charge.refunded` carries a Charge, not the Refund (and Stripe no longer embeds
    the refunds list), so it settles nothing itself: it prompts an early read-back of the
    payment's open refund operations (through the outbox; the reconciler is read-only)."""

    payment = selectors.payment_operation_for_intent(obj.payment_intent)
    if payment is None:
        return _Verdict(EventResult.HELD, "no_matching_operation")
    expected_account = payment.provider_account or getattr(settings, "STRIPE_ACCOUNT", "") or ""
    why = ""
    if obj.account != expected_account:
        why = "account"
    elif obj.metadata.get("purchase_id") not in (None, payment.purchase_id):
        why = "purchase"
    elif obj.currency and obj.currency.lower() != payment.currency.lower():
        why = "currency"
    if why:
        return _Verdict(EventResult.QUARANTINED, f"mismatch:{why}", payment.pk, payment.purchase_id)
    open_refunds = list(
        PaymentOperation.objects.filter(
            parent=payment,
            kind=OperationKind.REFUND,
            outcome__in=[Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER],
        ).values_list("pk", flat=True)
    )
    for op_id in open_refunds:
        # Own dedupe key: the reconciler's scheduled (delayed) message must not absorb it.
        reconcile_put(operation_id=op_id, event_id=event.event_id)
    return _Verdict(
        EventResult.IGNORED,
        f"charge_refunded_prompt:{len(open_refunds)}",
        payment.pk,
        payment.purchase_id,
    )


def _read_back_outside_transaction(operation_id: str, *, actor: str) -> PaymentOperation:
    """The operation after a read-back at the provider (which applies its record); as it
    stands when none may run (being sent right now, or settled meanwhile)."""
    try:
        return operation_reconcile(operation_id=operation_id, actor=actor)
    except DomainError:
        return PaymentOperation.objects.get(pk=operation_id)


def _verify_failure_outside_transaction(event: ProviderEvent, verdict: _Verdict) -> _Verdict:
    """An event stating a failure the provider can still undo, about a payment Verity has
    not settled: read the payment back (the read applies what the provider's record says).

    - the provider's record says failed too -> applied (`readback_agrees`);
    - it says something else that settles the payment (e.g. succeeded: the event was
      older than the success) -> ignored (`superseded_by_readback`);
    - still unsettled (the read failed, the payment is being sent right now, or the
      provider is still working on it) -> held, waiting on Verity's own record: retried
      with a read-back (never quarantined by a count of its retries).
    """
    op = _read_back_outside_transaction(verdict.operation_id, actor="webhook-failure-check")
    if op.outcome == Outcome.FAILED:
        return _Verdict(EventResult.APPLIED, "readback_agrees", op.pk, op.purchase_id)
    if op.is_terminal:
        return _Verdict(EventResult.IGNORED, "superseded_by_readback", op.pk, op.purchase_id)
    return _Verdict(EventResult.HELD, "payment_not_settled", op.pk, op.purchase_id)


def _resolve_conflict_outside_transaction(event: ProviderEvent, verdict: _Verdict) -> _Verdict:
    """Terminal vs a different terminal: read the canonical object at the provider.

    - canonical agrees with what Verity holds: the event described an earlier state
      (e.g. a decline before a successful retry of the same PaymentIntent) -> ignored;
    - Verity now agrees with the event (a read-back settled it) -> applied;
    - otherwise (the provider says what the event says, Verity holds the opposite, or
      the read failed) -> quarantined `conflict` for a person. Never overwritten here.
    """

    obj = object_from_event_payload(event.payload)
    op = PaymentOperation.objects.get(pk=verdict.operation_id)
    event_outcome = outcome_from_object(obj, kind=op.kind)
    canonical_outcome = None
    if not op.is_terminal or op.grade == Grade.ACKNOWLEDGED:
        # A person's outcome is read back too: the provider's record outranks it.
        op = _read_back_outside_transaction(op.pk, actor="webhook-conflict")
    if op.outcome == event_outcome:
        return _Verdict(EventResult.APPLIED, "readback_agrees", op.pk, op.purchase_id)
    canonical = _read_canonical_outside_transaction(op, obj)
    if canonical is not None:
        canonical_outcome = outcome_from_object(canonical, kind=op.kind)
    if canonical_outcome is not None and canonical_outcome == op.outcome:
        return _Verdict(EventResult.IGNORED, "superseded_by_readback", op.pk, op.purchase_id)
    return _Verdict(EventResult.QUARANTINED, "conflict", op.pk, op.purchase_id)


def _read_canonical_outside_transaction(op, obj: ProviderObject) -> ProviderObject | None:
    """Read-only, recorded as a reconcile ProviderCall by the payments core."""

    return operation_read_canonical(operation_id=op.pk)


# -- quarantine triage ---------------------------------------------------------------


def _audit(
    *, acting_user, action: str, event: ProviderEvent, reason: str, before: dict, ip: str | None
):
    return audit_write(
        actor=acting_user.get_username(),
        action=action,
        target_type="provider_event",
        target_id=str(event.pk),
        reason=reason,
        purchase_id=event.purchase_id,
        ip=ip,
        before=before,
        after={"result": event.result, "reason": event.result_reason},
        detail={
            "event": event.event_id,
            "type": event.type,
            "previous_reason": before.get("reason", ""),
        },
    )


def _triage_locked(*, event_id: int, acting_user, reason: str) -> ProviderEvent:
    # The permission (Action.TRIAGE_QUARANTINE) is checked at the edge, by the console's
    # support.services.event_triage_by_user, before this runs.
    if not (reason or "").strip():
        raise DomainError(
            ErrorCode.REASON_REQUIRED, "A reason is required.", status=422, owner="support"
        )
    event = ProviderEvent.objects.select_for_update().get(pk=event_id)
    if event.result != EventResult.QUARANTINED:
        raise DomainError(
            ErrorCode.EVENT_NOT_QUARANTINED,
            "This event is not quarantined.",
            status=409,
            owner="support",
        )
    return event


def event_quarantine_release(
    *, event_id: int, acting_user, reason: str, ip: str | None = None
) -> ProviderEvent:
    """Send a quarantined event through processing again (e.g. after the operation it
    names was corrected). Matching rules still apply: a mismatched event is quarantined
    again, never forced through."""
    with transaction.atomic():
        event = _triage_locked(event_id=event_id, acting_user=acting_user, reason=reason)
        before = {"result": event.result, "reason": event.result_reason}
        event.result, event.result_reason, event.attempts = EventResult.PENDING, "", 0
        event.processed_at = None
        event.save(update_fields=["result", "result_reason", "attempts", "processed_at"])
        audit = _audit(
            acting_user=acting_user,
            action="webhook_event_release",
            event=event,
            reason=reason,
            before=before,
            ip=ip,
        )
        outbox_put(
            category=OutboxCategory.PROCESS_EVENT,
            payload={"event": event.pk},
            dedupe_key=f"event:{event.event_id}:release:{audit.pk}",
        )
    return event


def event_quarantine_dismiss(
    *, event_id: int, acting_user, reason: str, ip: str | None = None
) -> ProviderEvent:
    """Close a quarantined event without applying it (recorded as ignored)."""
    with transaction.atomic():
        event = _triage_locked(event_id=event_id, acting_user=acting_user, reason=reason)
        before = {"result": event.result, "reason": event.result_reason}
        event.result = EventResult.IGNORED
        event.result_reason = f"dismissed:{before['reason']}"[:200]
        event.processed_at = timezone.now()
        event.save(update_fields=["result", "result_reason", "processed_at"])
        _audit(
            acting_user=acting_user,
            action="webhook_event_dismiss",
            event=event,
            reason=reason,
            before=before,
            ip=ip,
        )
    return event
