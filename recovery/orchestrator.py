"""The orchestrator: resume a paid purchase from its first incomplete step. Never charges.

Rules (docs/recovery.md#step-policy):
- runs only when the purchase is `paid`/`fulfilling` AND its charge/authorization
  succeeded at the provider: an unknown payment never satisfies a dependency;
- one StepRun per (purchase, step), created with INSERT ... ON CONFLICT DO NOTHING;
- a step runs under its StepRun row lock, so a redelivered or concurrent run waits and
  then finds it done; its effect is a row with its own unique constraint besides;
- the confirmation e-mail is recorded before it is sent and sent outside any
  transaction; a send found `running` after its lease (the worker died mid-send) becomes
  `unknown` and goes to a person — an e-mail cannot be unsent, so it is never resent blindly;
- a step that cannot complete follows its policy: retry (bounded, backoff in the outbox),
  compensate (void before capture, refund after: a new linked operation with its own
  key, dispatched through the outbox and reconciled like any other) or manual review;
- the decision (completed_forward, compensated, manual) is recorded once.
Lock order in recovery: StepRun -> (payments) Purchase -> PaymentOperation.
"""

from __future__ import annotations

import logging
import smtplib
import socket
from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from audit.services import audit_write
from events.models import EventType
from events.record import event_record
from payments.enums import (
    OVERTURN_CAUSE,
    PAYMENT_KINDS,
    Grade,
    OperationKind,
    Outcome,
    PurchaseStatus,
)
from payments.locks import lock_operation
from payments.models import PaymentOperation, Product, Purchase
from payments.money import format_money
from payments.selectors import purchase_money
from payments.services import (
    DomainError,
    duplicate_compensation_ensure,
    purchase_transition,
    refund_request,
    void_create,
)
from payments.services.external import external_intent_read
from payments.services.x402_finality import X402_VANISHED_CAUSE
from webhooks.services import held_events_retry_now

from .halts import is_halted, step_halt_name
from .metrics import REFUND_OUTCOMES
from .models import (
    EmailMessage,
    InventoryCommit,
    LedgerEntry,
    Order,
    OutboxCategory,
    RecoveryDecision,
    StepName,
    StepRun,
    StepState,
)
from .outbox import dispatch_put, outbox_put, run_steps_put
from .steps import (
    DB_STEPS,
    PaymentInfo,
    Policy,
    PurchaseContext,
    StepRejected,
    deliverable_execute,
    deliverable_expiry,
    deliverable_job_reference,
    ledger_record_refund,
    ledger_record_sale,
    ledger_record_void,
    ledger_reverse_unmade,
    step_key,
)

log = logging.getLogger(__name__)
ACTOR = "orchestrator"

# Pseudo-states returned (never stored) when a run stops without an outcome.
HALTED = "halted"
BUSY = "busy"  # another worker holds this step's lease right now
NOT_READY = "not_ready"  # not paid (or payment not succeeded): nothing may run
COMPLETED = "completed"

_WAITING_FOR_PERSON = (StepState.MANUAL, StepState.UNKNOWN)
# Steps run on a paid purchase, and on one whose dispute was won: the money is the
# merchant's again, so fulfilment the dispute paused resumes (recovery.disputes). The
# purchase keeps saying `dispute_won` meanwhile (no transition leaves it for fulfilling).
FULFILLABLE_STATUSES = (PurchaseStatus.PAID, PurchaseStatus.FULFILLING, PurchaseStatus.DISPUTE_WON)


class StepRetryLater(Exception):
    """A transient step failure: the outbox message backs off and runs again."""


def run_steps_message_put(purchase_id: str) -> None:
    """Call inside atomic(). Same dedupe key as the core's, so the two absorb each other."""
    run_steps_put(purchase_id=purchase_id)


# -- context --------------------------------------------------------------------------


def _info(op: PaymentOperation) -> PaymentInfo:
    return PaymentInfo(
        id=op.id,
        kind=op.kind,
        amount=op.amount,
        currency=op.currency,
        provider_reference=op.provider_reference or "",
        provider_charge=op.provider_charge or "",
    )


def load_context(purchase_id: str) -> PurchaseContext | None:
    """None unless the purchase is paid/fulfilling with a succeeded payment operation."""

    purchase = Purchase.objects.select_related("quote").get(id=purchase_id)
    if purchase.status not in FULFILLABLE_STATUSES:
        return None
    payment = purchase.operations.filter(
        kind__in=PAYMENT_KINDS, outcome=Outcome.SUCCEEDED, is_duplicate=False
    ).first()
    if payment is None:
        return None  # unknown/pending never satisfies a dependency (unknown is not success)
    capture = purchase.operations.filter(
        kind=OperationKind.CAPTURE, outcome=Outcome.SUCCEEDED
    ).first()
    items = [i for i in (purchase.quote.items or []) if i.get("sku")]
    products = Product.objects.filter(sku__in=[i["sku"] for i in items])
    return PurchaseContext(
        purchase_id=purchase.id,
        customer_reference=purchase.customer_reference,
        customer_email=purchase.customer_email,
        amount=purchase.amount,
        currency=purchase.currency,
        items=items,
        payment=_info(payment),
        product_kinds={p.sku: p.kind for p in products},
        product_policies={p.sku: p.step_policy or {} for p in products},
        captured=_info(capture) if capture else None,
    )


def _still_fulfillable(purchase_id: str) -> bool:
    """Re-checked before every step (and under the confirmation step's lock)."""

    status = Purchase.objects.filter(id=purchase_id).values_list("status", flat=True).get()
    return status in FULFILLABLE_STATUSES


def _status_url(purchase_id: str) -> str:
    token = Purchase.objects.filter(id=purchase_id).values_list("status_token", flat=True).get()
    return f"{settings.PUBLIC_BASE_URL.rstrip('/')}/status/{token}/"


def _ensure_step_runs(ctx: PurchaseContext) -> None:
    StepRun.objects.bulk_create(
        [
            StepRun(purchase_id=ctx.purchase_id, step=step, key=step_key(ctx.purchase_id, step))
            for step in ctx.steps
        ],
        ignore_conflicts=True,
    )


def _lock_run(purchase_id: str, step: str) -> StepRun:
    return StepRun.objects.select_for_update().get(purchase_id=purchase_id, step=step)


def _decide(purchase_id: str, decision: str, detail: str = "") -> None:
    RecoveryDecision.objects.bulk_create(
        [RecoveryDecision(purchase_id=purchase_id, decision=decision, detail=detail[:2000])],
        ignore_conflicts=True,
    )


def _manual_review(purchase_id: str, detail: str) -> None:
    """Inside the caller's atomic(): the purchase goes to a person; decision `manual`."""

    purchase_transition(
        purchase_id=purchase_id, name="mark_manual_review", cause="step_needs_review", actor=ACTOR
    )
    _decide(purchase_id, RecoveryDecision.Decision.MANUAL, detail)


def _give_up_locked(ctx: PurchaseContext, run: StepRun, error: str) -> None:
    """The step will not complete by retrying: apply its policy (caller holds the lock)."""
    run.last_error = error[:1000]
    if ctx.policy(run.step) == Policy.COMPENSATE:
        # Claim the compensation under the lock; the operation itself is created after
        # commit by _compensate (which is re-entrant if we crash in between).
        run.state = StepState.COMPENSATED
    else:
        run.state = StepState.MANUAL
        _manual_review(ctx.purchase_id, f"{run.step}: {error}")


# -- the steps ------------------------------------------------------------------------


def _run_db_step(ctx: PurchaseContext, step: str) -> str:
    retry_error: Exception | None = None
    with transaction.atomic():
        run = _lock_run(ctx.purchase_id, step)
        if run.state in (StepState.DONE, StepState.COMPENSATED, *_WAITING_FOR_PERSON):
            return run.state
        if is_halted(step_halt_name(step)):
            return HALTED
        if not _still_fulfillable(ctx.purchase_id):
            # Under the step's lock: the unwind of money that went back takes every step's
            # lock, so an effect is either made before it (and unwound) or never.
            return NOT_READY
        now = timezone.now()
        run.attempts += 1
        run.started_at = run.started_at or now
        try:
            with transaction.atomic():  # a savepoint: a failed effect rolls back alone
                result = DB_STEPS[step](ctx, run)
        except StepRejected as exc:
            _give_up_locked(ctx, run, str(exc))
        except Exception as exc:  # transient: bounded retries, then the policy
            run.state = StepState.FAILED
            run.last_error = f"{type(exc).__name__}: {exc}"[:1000]
            if run.attempts >= ctx.max_attempts(step):
                _give_up_locked(ctx, run, run.last_error)
            else:
                retry_error = exc
        else:
            run.state, run.result, run.last_error = StepState.DONE, result, ""
            run.completed_at = now
        run.save(
            update_fields=[
                "state",
                "attempts",
                "started_at",
                "completed_at",
                "result",
                "last_error",
            ]
        )
        state = run.state
    if retry_error is not None:
        raise StepRetryLater(f"{step}: {retry_error}") from retry_error
    return state


def _definitely_not_sent(exc: BaseException) -> bool:
    # Refused before any message data was accepted: safe to send again later.
    return isinstance(
        exc,
        (
            ConnectionRefusedError,
            socket.gaierror,
            smtplib.SMTPConnectError,
            smtplib.SMTPRecipientsRefused,
            smtplib.SMTPSenderRefused,
            smtplib.SMTPHeloError,
        ),
    )


def _confirmation_text(ctx: PurchaseContext) -> tuple[str, str]:
    order = (
        Order.objects.filter(purchase_id=ctx.purchase_id)
        .values_list("reference", flat=True)
        .first()
    )
    amount = format_money(ctx.payment.amount, ctx.payment.currency)
    subject = f"Order {order or ctx.purchase_id} confirmed"
    body = (
        f"Thank you. Your payment of {amount} is confirmed and your order "
        f"{order or ''} is being prepared.\n\nPurchase: {ctx.purchase_id}\n"
        f"Status: {_status_url(ctx.purchase_id)}\n"
        f"Questions: {settings.SUPPORT_CONTACT}\n"
    )
    return subject, body


def _run_confirmation(ctx: PurchaseContext) -> str:
    step = StepName.CONFIRMATION
    with transaction.atomic():
        run = _lock_run(ctx.purchase_id, step)
        if run.state in (StepState.DONE, *_WAITING_FOR_PERSON):
            return run.state
        now = timezone.now()
        if run.state == StepState.RUNNING:
            lease = timedelta(seconds=settings.STEP_LEASE_SECONDS)
            if run.started_at and run.started_at > now - lease:
                return BUSY
            # The sender died mid-send: the e-mail may or may not have left. Never resend
            # without review (docs/recovery.md#step-policy).
            run.state = StepState.UNKNOWN
            run.last_error = "send outcome unknown: the worker stopped while sending"
            run.save(update_fields=["state", "last_error"])
            _manual_review(ctx.purchase_id, "confirmation e-mail: send outcome unknown")
            return run.state
        if is_halted(step_halt_name(step)):
            return HALTED
        if not _still_fulfillable(ctx.purchase_id):
            return NOT_READY  # never "payment confirmed" for a voided/refunded purchase
        if not ctx.customer_email:
            run.state, run.result, run.completed_at = StepState.DONE, {"skipped": "no_email"}, now
            run.save(update_fields=["state", "result", "completed_at"])
            return run.state
        subject, body = _confirmation_text(ctx)
        # The attempt is recorded before sending (an e-mail cannot be unsent).
        EmailMessage.objects.bulk_create(
            [
                EmailMessage(
                    purchase_id=ctx.purchase_id,
                    kind="confirmation",
                    to=ctx.customer_email,
                    subject=subject[:200],
                )
            ],
            ignore_conflicts=True,
        )
        email = EmailMessage.objects.get(purchase_id=ctx.purchase_id, kind="confirmation")
        if email.sent_at is not None:  # the effect exists already
            run.state, run.completed_at = StepState.DONE, now
            run.save(update_fields=["state", "completed_at"])
            return run.state
        run.state, run.started_at = StepState.RUNNING, now
        run.attempts += 1
        run.save(update_fields=["state", "started_at", "attempts"])

    # Outside any transaction: a slow mail server holds no row lock.
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [email.to], fail_silently=False)
    except Exception as exc:
        retry = False
        with transaction.atomic():
            run = _lock_run(ctx.purchase_id, step)
            run.last_error = f"{type(exc).__name__}: {exc}"[:1000]
            if _definitely_not_sent(exc) and run.attempts < ctx.max_attempts(step):
                run.state, retry = StepState.FAILED, True
            elif _definitely_not_sent(exc):
                run.state = StepState.MANUAL
                _manual_review(ctx.purchase_id, f"confirmation e-mail: {run.last_error}")
            else:
                run.state = StepState.UNKNOWN
                _manual_review(ctx.purchase_id, f"confirmation e-mail unknown: {run.last_error}")
            run.save(update_fields=["state", "last_error"])
            state = run.state
        if retry:
            raise StepRetryLater(f"confirmation: {exc}") from exc
        return state

    with transaction.atomic():
        run = _lock_run(ctx.purchase_id, step)
        sent_at = timezone.now()
        EmailMessage.objects.filter(id=email.id, sent_at__isnull=True).update(sent_at=sent_at)
        if run.state == StepState.RUNNING:
            run.state, run.completed_at, run.last_error = StepState.DONE, sent_at, ""
            run.result = {"email": email.id}
            run.save(update_fields=["state", "completed_at", "last_error", "result"])
        return run.state


def _run_deliverable(ctx: PurchaseContext) -> str:
    """Claimed by one worker under the lock; the job reference is stored before the job
    starts; the result is kept for the redelivery period."""
    step = StepName.DELIVERABLE
    with transaction.atomic():
        run = _lock_run(ctx.purchase_id, step)
        if run.state in (StepState.DONE, StepState.COMPENSATED, *_WAITING_FOR_PERSON):
            return run.state
        now = timezone.now()
        lease = timedelta(seconds=settings.STEP_LEASE_SECONDS)
        if run.state == StepState.RUNNING and run.started_at and run.started_at > now - lease:
            return BUSY
        if is_halted(step_halt_name(step)):
            return HALTED
        if not _still_fulfillable(ctx.purchase_id):
            return NOT_READY
        if not run.external_reference:
            run.external_reference = deliverable_job_reference(run)
        run.state, run.started_at = StepState.RUNNING, now
        run.attempts += 1
        run.save(update_fields=["external_reference", "state", "started_at", "attempts"])
        reference = run.external_reference
    try:
        result = deliverable_execute(ctx, reference)
    except Exception as exc:
        retry = False
        with transaction.atomic():
            run = _lock_run(ctx.purchase_id, step)
            run.state = StepState.FAILED
            run.last_error = f"{type(exc).__name__}: {exc}"[:1000]
            if run.attempts >= ctx.max_attempts(step):
                _give_up_locked(ctx, run, run.last_error)
            else:
                retry = True
            run.save(update_fields=["state", "last_error"])
            state = run.state
        if retry:
            raise StepRetryLater(f"deliverable: {exc}") from exc
        return state
    with transaction.atomic():
        run = _lock_run(ctx.purchase_id, step)
        if run.state == StepState.RUNNING:
            now = timezone.now()
            # The money went back while the job ran (the unwind found it running): the
            # result is kept for the record, never served.
            expires = deliverable_expiry() if _still_fulfillable(ctx.purchase_id) else now
            run.state, run.result = StepState.DONE, result
            run.completed_at, run.result_expires_at = now, expires
            run.save(update_fields=["state", "result", "completed_at", "result_expires_at"])
            if expires > now:  # served: the storefront may fetch it now
                event_record(
                    purchase_id=ctx.purchase_id,
                    event_type=EventType.DELIVERABLE_READY,
                    change={
                        "deliverable": {
                            "download_path": result.get("download_path"),
                            "expires_at": expires.isoformat(),
                        }
                    },
                )
        return run.state


# -- compensation ---------------------------------------------------------------------


def _existing_compensation(ctx: PurchaseContext) -> PaymentOperation | None:
    """The compensation of the purchase's OWN payment: a compensation belongs to the
    payment it returns (its parent). A duplicate charge's refund is a compensation of the
    same purchase but returns the duplicate; taking it left the own charge unrefunded, no
    decision recorded and the purchase `fulfilling` for ever."""
    return (
        PaymentOperation.objects.filter(
            purchase_id=ctx.purchase_id, is_compensation=True, parent_id=ctx.payment.id
        )
        .exclude(outcome=Outcome.FAILED)
        .order_by("created_at")
        .first()
    )


def _compensate(ctx: PurchaseContext, step: str) -> str:
    """Start (or find) the linked void/refund for a compensated step. Re-entrant: the
    core refuses a second refund beyond the refundable amount and a second active
    operation on the purchase, so two runners cannot compensate twice."""

    run = StepRun.objects.get(purchase_id=ctx.purchase_id, step=step)
    if run.compensation_operation_id:
        return StepState.COMPENSATED
    op = _existing_compensation(ctx)
    if op is None:
        if is_halted("refunds"):
            raise StepRetryLater("compensation waits: the refunds workflow is halted")
        try:
            if ctx.payment.kind == OperationKind.AUTHORIZE and ctx.captured is None:
                op = void_create(purchase_id=ctx.purchase_id, compensation=True)
            else:
                op = refund_request(purchase_id=ctx.purchase_id, compensation=True)
        except DomainError as exc:
            op = _existing_compensation(ctx)
            if op is None:
                if exc.code in ("workflow_halted", "payment_unresolved"):
                    raise StepRetryLater(f"compensation waits: {exc.code}") from exc
                with transaction.atomic():
                    run = _lock_run(ctx.purchase_id, step)
                    run.state = StepState.MANUAL
                    run.last_error = f"compensation refused: {exc.code}"
                    run.save(update_fields=["state", "last_error"])
                    _manual_review(ctx.purchase_id, f"{step}: compensation refused ({exc.code})")
                return StepState.MANUAL
    with transaction.atomic():
        StepRun.objects.filter(id=run.id, compensation_operation_id="").update(
            compensation_operation_id=op.id
        )
        # Compensations need no approval: dispatch through the outbox (a second dispatch
        # of the same operation is a no-op in the core).
        dispatch_put(operation_id=op.id)
    log.info(
        "compensation started purchase=%s step=%s operation=%s kind=%s",
        ctx.purchase_id,
        step,
        op.id,
        op.kind,
    )
    return StepState.COMPENSATED


# -- entry points ---------------------------------------------------------------------


def purchase_fulfil(*, purchase_id: str) -> str:
    """Run the purchase's steps from the first incomplete one. Idempotent; never charges.

    Returns `completed`, or the state where it stopped (a StepState value, `halted`,
    `busy`, `not_ready`). Raises StepRetryLater for a transient failure (the outbox
    backs the message off and runs it again).
    """

    ctx = load_context(purchase_id)
    if ctx is None:
        status = Purchase.objects.filter(id=purchase_id).values_list("status", flat=True).get()
        return COMPLETED if status == PurchaseStatus.COMPLETED else NOT_READY
    _ensure_step_runs(ctx)
    purchase_transition(
        purchase_id=purchase_id, name="mark_fulfilling", cause="fulfilment_started", actor=ACTOR
    )
    for step in ctx.steps:
        if not _still_fulfillable(purchase_id):
            # A void or full refund (or a person) changed the purchase during this run:
            # no further order, e-mail or CRM update for it.
            return NOT_READY
        if step == StepName.CONFIRMATION:
            state = _run_confirmation(ctx)
        elif step == StepName.DELIVERABLE:
            state = _run_deliverable(ctx)
        else:
            state = _run_db_step(ctx, step)
        if state == StepState.COMPENSATED:
            return _compensate(ctx, step)
        if state == BUSY:
            # Another worker holds this step's lease. Retry later rather than finish this
            # message: if that worker died, the retry after its lease finds out.
            raise StepRetryLater(f"{step}: running in another worker")
        if state != StepState.DONE:
            return state
    with transaction.atomic():
        purchase = purchase_transition(
            purchase_id=purchase_id,
            name="mark_completed",
            cause="fulfilment_completed",
            actor=ACTOR,
        )
        if purchase.status == PurchaseStatus.COMPLETED:
            _decide(purchase_id, RecoveryDecision.Decision.COMPLETED_FORWARD)
    return COMPLETED


def operation_settled(*, operation_id: str) -> None:
    """Follow-up of a settled operation (the core already moved holds and status)."""

    op = PaymentOperation.objects.select_related("parent").get(id=operation_id)
    info = _info(op)
    if op.kind in (*PAYMENT_KINDS, OperationKind.CAPTURE) and op.is_terminal:
        with transaction.atomic():  # provider events that waited for this record: now
            held_for = op.parent_id if op.kind == OperationKind.CAPTURE else op.id
            assert held_for is not None  # a capture's parent is the authorization it takes
            held_events_retry_now(operation_id=held_for)
    if op.kind in (OperationKind.REFUND, OperationKind.VOID) and op.is_terminal:
        REFUND_OUTCOMES.labels(kind=op.kind, outcome=op.outcome).inc()
    if op.kind in PAYMENT_KINDS and op.is_duplicate:
        _duplicate_settled(op)
        return
    if (parent := op.parent) is not None and parent.is_duplicate:
        if op.kind == OperationKind.REFUND and op.is_terminal:
            with transaction.atomic():
                if _outcome_locked(op) == Outcome.SUCCEEDED:
                    duplicate_return_book(op)
                else:
                    ledger_reverse_unmade(purchase_id=op.purchase_id, operation_id=op.id)
        if op.is_compensation and op.outcome == Outcome.FAILED and op.grade != Grade.ACKNOWLEDGED:
            # The provider refused the duplicate's return (e.g. part of it was refunded in
            # the dashboard since): a new compensation asks for what is left, if anything
            # (the core refuses to ask again what the provider already refused). Only on
            # the provider's word: a person's "failed" may be overturned — the first
            # return may still land — so a new one waits until the read-back confirms it
            # (else the duplicate could be returned twice).
            _duplicate_settled(parent)
        return  # the return of a duplicate: nothing downstream bought anything with it
    if (
        op.kind == OperationKind.CAPTURE
        and op.outcome == Outcome.FAILED
        and op.grade != Grade.ACKNOWLEDGED
        and op.parent_id
    ):
        # The provider refused the capture: the authorization may be gone (cancelled in
        # the dashboard, expired). Read it back; a cancel found there is recorded as the
        # void it is, whose settlement unwinds the goods (the money is not coming).
        _authorization_read_after_failed_capture(op)
    if op.kind == OperationKind.VOID and op.outcome == Outcome.SUCCEEDED:
        _unwind_after_void(op)
    if (
        op.kind == OperationKind.REFUND
        and op.outcome == Outcome.SUCCEEDED
        and purchase_money(op.purchase_id).returned
    ):
        purchase_goods_unwind(
            purchase_id=op.purchase_id,
            detail=f"refund {op.id} returned the payment in full: order cancelled",
        )
    with transaction.atomic():
        outcome = op.outcome
        if op.kind in (OperationKind.REFUND, OperationKind.VOID):
            outcome = _outcome_locked(op)
        if outcome == Outcome.SUCCEEDED:
            if op.kind in PAYMENT_KINDS:
                run_steps_message_put(op.purchase_id)
            elif op.kind == OperationKind.CAPTURE:
                ledger_record_sale(purchase_id=op.purchase_id, payment=info)
            elif op.kind == OperationKind.REFUND:
                # A refund can settle before fulfilment ever ran: the purchase is no longer
                # paid, so the ledger step never books the sale this refund reverses. Book
                # it here first (idempotent: the ledger step books the same rows).
                if op.parent is not None and op.parent.kind == OperationKind.CHARGE:
                    ledger_record_sale(purchase_id=op.purchase_id, payment=_info(op.parent))
                ledger_record_refund(purchase_id=op.purchase_id, refund=info)
            elif op.kind == OperationKind.VOID:
                ledger_record_void(purchase_id=op.purchase_id, void=info, amount=op.amount)
        elif outcome == Outcome.FAILED and op.kind in (OperationKind.REFUND, OperationKind.VOID):
            # A person's "succeeded" the provider's record overturned (the refund never
            # happened, the authorization still stands): what was booked on it is reversed,
            # or the room the overturn freed would be booked a second time.
            if ledger_reverse_unmade(purchase_id=op.purchase_id, operation_id=op.id):
                log.warning("ledger reversed for overturned operation=%s", op.id)
        elif outcome == Outcome.FAILED and op.kind in (*PAYMENT_KINDS, OperationKind.CAPTURE):
            # Overturned: a person's "succeeded" the provider's record contradicts. The
            # ledger step's row lock first, so a booking in flight lands before the reversal.
            StepRun.objects.select_for_update().filter(
                purchase_id=op.purchase_id, step=StepName.LEDGER
            ).first()
            if ledger_reverse_unmade(purchase_id=op.purchase_id, operation_id=op.id):
                log.warning("ledger reversed for overturned operation=%s", op.id)
            if op.kind in PAYMENT_KINDS:
                _unwind_after_overturn(op)
        runs = list(StepRun.objects.select_for_update().filter(compensation_operation_id=op.id))
        if not (op.is_compensation or runs):
            return
        if op.outcome == Outcome.SUCCEEDED:
            steps = ", ".join(r.step for r in runs) or "step"
            _decide(
                op.purchase_id,
                RecoveryDecision.Decision.COMPENSATED,
                f"{steps}: {op.kind} {op.id} confirmed by the provider",
            )
        elif op.outcome == Outcome.FAILED:
            for run in runs:
                run.state = StepState.MANUAL
                run.last_error = f"compensation {op.kind} {op.id} failed: {op.reason}"[:1000]
                run.save(update_fields=["state", "last_error"])
            _manual_review(op.purchase_id, f"compensation {op.kind} {op.id} failed")


def _outcome_locked(op: PaymentOperation) -> str:
    """The operation's outcome read under its row lock (inside the caller's atomic()): an
    overturn committing while a booking is in flight waits for it, and its own settled
    message then reverses what was booked; a booking never lands after its reversal.
    The step runs it compensates are locked first (the lock order above)."""
    list(StepRun.objects.select_for_update().filter(compensation_operation_id=op.id))
    outcome: str = lock_operation(op.id).outcome
    return outcome


def duplicate_return_book(refund: PaymentOperation) -> None:
    """The return of a duplicate is booked only when the duplicate's sale was (a dispute of
    the duplicate books it): a duplicate and its return never touch the books otherwise,
    and when they do, they net to nothing. Idempotent; inside the caller's atomic()."""
    if LedgerEntry.objects.filter(
        purchase_id=refund.purchase_id, operation_id=refund.parent_id, entry_type="sale"
    ).exists():
        ledger_record_refund(purchase_id=refund.purchase_id, refund=_info(refund))


def _duplicate_settled(op: PaymentOperation) -> None:
    """A confirmed duplicate: its compensating refund/void must exist (the core creates it
    in the same transaction when it can; this retries while the purchase's slot is busy)."""

    if op.outcome != Outcome.SUCCEEDED:
        return
    try:
        duplicate_compensation_ensure(operation_id=op.id)
    except DomainError as exc:
        raise StepRetryLater(f"duplicate compensation waits: {exc.code}") from exc


def fulfilment_unfinished(purchase_id: str) -> bool:
    """Some step of the purchase has not reached a final state (done or compensated)."""
    runs = StepRun.objects.filter(purchase_id=purchase_id)
    return (
        not runs.exists()
        or runs.exclude(state__in=[StepState.DONE, StepState.COMPENSATED]).exists()
    )


def _unwind_after_void(op: PaymentOperation) -> None:
    """A void (an operator's, after fulfilment started, or a step's compensation): the
    goods follow the money back."""
    purchase_goods_unwind(
        purchase_id=op.purchase_id, detail=f"void {op.id} after fulfilment: order cancelled"
    )


def _authorization_read_after_failed_capture(op: PaymentOperation) -> None:
    try:
        assert op.parent_id is not None  # a capture's authorization
        result = external_intent_read(
            payment_operation_id=op.parent_id, cause="readback:capture_failed"
        )
    except Exception:  # a read-back is a refresh, not a precondition (the reconciler's)
        log.warning("authorization read-back after failed capture=%s failed", op.id, exc_info=True)
        return
    if result is not None:
        log.info(
            "authorization read-back after failed capture=%s: %s %s",
            op.id,
            result.result,
            result.reason,
        )


def purchase_goods_unwind(*, purchase_id: str, detail: str, tell_customer: bool = True) -> bool:
    """The purchase's money went back (voided, refunded in full, a dispute lost): nothing it
    bought stays live (docs/reliability.md#rules-every-money-movement-obeys). The order is
    cancelled, committed stock goes back to the shelf, the deliverable is no longer served,
    the decision is recorded and the customer is told once. Idempotent; True when this call
    unwound something.

    Every step's lock first (lock order StepRun -> Purchase): a step that is making its
    effect right now commits it before the unwind reads, and a step that runs after finds
    the purchase no longer fulfillable under its own lock (the status changed before this
    runs), so no effect outlives the unwind."""
    now = timezone.now()
    with transaction.atomic():
        list(
            StepRun.objects.select_for_update()
            .filter(purchase_id=purchase_id)
            .order_by("id")
            .values_list("id", flat=True)
        )
        cancelled = Order.objects.filter(purchase_id=purchase_id, cancelled_at__isnull=True).update(
            cancelled_at=now
        )
        released = 0
        for commit in InventoryCommit.objects.select_for_update().filter(
            purchase_id=purchase_id, released_at__isnull=True
        ):
            # Only physical goods took stock (steps.run_inventory); F(): never read-then-write.
            Product.objects.filter(sku=commit.sku).exclude(kind=Product.Kind.DIGITAL).update(
                stock=F("stock") + commit.quantity
            )
            commit.released_at = now
            commit.save(update_fields=["released_at"])
            released += 1
        withdrawn = (
            StepRun.objects.filter(
                purchase_id=purchase_id, step=StepName.DELIVERABLE, state=StepState.DONE
            )
            .filter(Q(result_expires_at__isnull=True) | Q(result_expires_at__gt=now))
            .update(result_expires_at=now)
        )
        unwound = bool(cancelled or released or withdrawn)
        if unwound:
            _decide(purchase_id, RecoveryDecision.Decision.COMPENSATED, detail)
            log.warning(
                "goods unwound purchase=%s order=%s stock=%s deliverable=%s: %s",
                purchase_id,
                cancelled,
                released,
                withdrawn,
                detail,
            )
        email = _cancellation_recorded(purchase_id) if unwound and tell_customer else None
        if email is not None:
            # Sent by the relay after this commits, and sent again while the mail server
            # provably took nothing (recovery.handlers): never lost to one failed send.
            outbox_put(
                category=OutboxCategory.CUSTOMER_EMAIL,
                payload={"email": email.id},
                dedupe_key=f"email:{email.id}",
            )
    return unwound


def _cancellation_recorded(purchase_id: str) -> EmailMessage | None:
    """The customer is told once (recorded before sending: an e-mail cannot be unsent)."""
    purchase = Purchase.objects.filter(id=purchase_id).only("customer_email").get()
    if not purchase.customer_email:
        return None
    subject = f"Purchase {purchase_id}: your order is cancelled, your money went back"
    _, created = EmailMessage.objects.get_or_create(
        purchase_id=purchase_id,
        kind="cancellation",
        defaults={"to": purchase.customer_email, "subject": subject[:200]},
    )
    if not created:
        return None
    return EmailMessage.objects.get(purchase_id=purchase_id, kind="cancellation")


class EmailNotSentYet(Exception):
    """The mail server refused before taking any data: the outbox sends it again."""


def customer_email_send(*, email_id: int) -> None:
    """The outbox's CUSTOMER_EMAIL: send a recorded e-mail once. Refused before any data
    (`_definitely_not_sent`, as the confirmation step decides): raise, and the relay tries
    again with its capped backoff (a message that keeps failing shows in the console's
    stuck-outbox queue). Any other failure may have sent it: never resent (an e-mail cannot
    be unsent), logged, the row left unsent for a person. No transaction may be open."""
    email = EmailMessage.objects.filter(id=email_id, sent_at__isnull=True).first()
    if email is None:
        return  # sent already (or gone)
    body = (
        f"Your payment for purchase {email.purchase_id} went back to you, so your "
        f"order is cancelled and nothing more will be delivered.\n\n"
        f"Status: {_status_url(email.purchase_id)}\n"
        f"Questions: {settings.SUPPORT_CONTACT}\n"
    )
    try:
        send_mail(email.subject, body, settings.DEFAULT_FROM_EMAIL, [email.to], fail_silently=False)
    except Exception as exc:
        if _definitely_not_sent(exc):
            raise EmailNotSentYet(f"{email.kind} e-mail {email.id}: {type(exc).__name__}") from None
        log.warning(
            "%s e-mail outcome unknown, not resent purchase=%s",
            email.kind,
            email.purchase_id,
            exc_info=True,
        )
        return
    EmailMessage.objects.filter(id=email.id, sent_at__isnull=True).update(sent_at=timezone.now())


def _unwind_after_overturn(op: PaymentOperation) -> None:
    """A payment fulfilled on a person's "succeeded" that the provider's record overturned
    (no money came): the goods go, as after a void; an e-mail already sent cannot be
    unsent — the purchase waits in manual review for a person to write to the buyer (so
    no automatic e-mail here). Idempotent."""
    if op.transitions.filter(cause=OVERTURN_CAUSE, target=Outcome.FAILED).exists():
        purchase_goods_unwind(
            purchase_id=op.purchase_id,
            tell_customer=False,
            detail=f"payment {op.id} overturned by the provider: order cancelled",
        )
    elif op.transitions.filter(cause=X402_VANISHED_CAUSE, target=Outcome.FAILED).exists():
        # The chain took an x402 transfer back after the deliverable went out (a reorg,
        # then the payer's cancel): no money came, nothing of it stays live, and the
        # buyer is told why (once), with a way to pay again.
        purchase_goods_unwind(
            purchase_id=op.purchase_id,
            tell_customer=False,
            detail=f"x402 payment {op.id}: its transfer left the chain before it was "
            f"final: order cancelled",
        )
        email = _reversed_payment_recorded(op.purchase_id)
        if email is not None:
            transaction.on_commit(lambda: _reversed_payment_send(email))


def _reversed_payment_recorded(purchase_id: str) -> EmailMessage | None:
    purchase = Purchase.objects.filter(id=purchase_id).only("customer_email").get()
    if not purchase.customer_email:
        return None
    subject = f"Purchase {purchase_id}: your payment did not complete, your order is cancelled"
    email, created = EmailMessage.objects.get_or_create(
        purchase_id=purchase_id,
        kind="payment_reversed",
        defaults={"to": purchase.customer_email, "subject": subject[:200]},
    )
    return email if created else None


def _reversed_payment_send(email: EmailMessage) -> None:
    body = (
        f"The on-chain transfer that paid for purchase {email.purchase_id} was undone "
        f"by the network before it became final, and the authorization was cancelled, "
        f"so no money reached us. Your order is cancelled and the report is no longer "
        f"available. If you still want it, pay again from the status page.\n\n"
        f"Status: {_status_url(email.purchase_id)}\n"
        f"Questions: {settings.SUPPORT_CONTACT}\n"
    )
    try:
        send_mail(email.subject, body, settings.DEFAULT_FROM_EMAIL, [email.to], fail_silently=False)
    except Exception:  # at most once: a person sees the unsent row, nothing resends it
        log.warning(
            "payment-reversed e-mail not sent purchase=%s", email.purchase_id, exc_info=True
        )
        return
    EmailMessage.objects.filter(id=email.id, sent_at__isnull=True).update(sent_at=timezone.now())


def step_resolve(
    *, purchase_id: str, step: str, resolution: str, actor: str, reason: str, ip: str | None = None
) -> StepRun:
    """A person settles a step waiting for review: `done` (it did happen / was done by
    hand) or `retry` (safe to run again, e.g. the e-mail provably never left).
    Writes its AuditEntry in the same transaction, then resumes the purchase."""
    if resolution not in ("done", "retry"):
        raise ValueError("resolution must be 'done' or 'retry'")
    if not (reason or "").strip() or not (actor or "").strip():
        raise ValueError("actor and reason are required")
    with transaction.atomic():
        run = _lock_run(purchase_id, step)
        if run.state not in (*_WAITING_FOR_PERSON, StepState.FAILED):
            raise ValueError(f"step {step} is {run.state}: nothing to resolve")
        before = run.state
        if resolution == "done":
            run.state, run.completed_at = StepState.DONE, timezone.now()
        else:
            run.state, run.attempts, run.started_at = StepState.PENDING, 0, None
        run.last_error = ""
        run.save(update_fields=["state", "completed_at", "attempts", "started_at", "last_error"])
        audit_write(
            actor=actor,
            action="step_resolve",
            target_type="step_run",
            target_id=run.key,
            purchase_id=purchase_id,
            reason=reason,
            ip=ip or None,
            before={"state": before},
            after={"state": run.state},
            detail={"step": step, "from": before, "to": run.state},
        )
        purchase_transition(
            purchase_id=purchase_id, name="mark_fulfilling", cause="step_resolved", actor=actor
        )
        run_steps_message_put(purchase_id)
    return run
