"""Read-backs: the provider's record of an operation, read outside any
transaction and applied through observations; on-demand reconciles, the sweep of dead
dispatches, read-backs before a follow-up money movement, replays, and cancelling an
unapplied confirm.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import FilteredRelation, Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from recovery.outbox import reconcile_put

from ..enums import (
    PAYMENT_KINDS,
    CallPurpose,
    CallStep,
    Classification,
    Grade,
    OperationKind,
    Outcome,
    Owner,
    Reason,
    RetryAdvice,
    Stage,
    Verification,
)
from ..errors import DomainError, ErrorCode
from ..locks import (
    assert_outside_transaction,
    lock_operation,
    lock_purchase,
    lock_purchase_and_operation,
    lock_purchases_and_operations,
)
from ..models import ApiClient, PaymentOperation, ProviderCall
from ..providers.base import CallResult, ProviderObject, payment_provider, shows_no_money_moved
from .common import (
    _halted,
    _lock_or_404,
    _record_call,
    change_batch,
    log,
    operation_audit_write,
    operation_workflow,
    payment_request,
    provider_for,
    rail_evidence_for,
    transition_record,
)
from .observations import (
    _apply_observation_locked,
    _mismatch,
    _schedule_reconcile,
    operation_apply_observation,
    outcome_apply_locked,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def _read_back_call(op: PaymentOperation) -> tuple[str, CallResult]:
    """The provider read itself: by provider reference, else by metadata. Network only
    once the sweep's prepare stored the read's bounds and the database's clock
    (`_read_bounds`), so the sweep runs it on its own threads — except on a rail that keeps
    its evidence in Verity's tables (RailEvidence: x402 reads the chain from them)."""
    evidence = rail_evidence_for(op.rail)
    if evidence is not None:
        return CallStep.RETRIEVE, evidence.read_back(op)
    provider = payment_provider(provider_for(op))
    if op.kind == OperationKind.REFUND:
        if op.provider_reference:
            return CallStep.RETRIEVE, provider.retrieve_refund(op.provider_reference)
        made_until, clock = _read_bounds(op)
        return CallStep.LIST, provider.find_by_metadata(
            object_type="refund",
            operation_id=op.id,
            created_since=op.created_at,
            created_until=made_until,
            now=clock.now,
        )
    parent = op.parent
    ref = op.provider_reference or (parent.provider_reference if parent is not None else "")
    if ref:
        return CallStep.RETRIEVE, provider.retrieve_payment_intent(ref)
    # A capture or a void reads its authorization's PaymentIntent, which names the parent.
    named = parent if parent is not None else op
    made_until, clock = _read_bounds(op)
    return CallStep.LIST, provider.find_by_metadata(
        object_type="payment_intent",
        operation_id=named.id,
        created_since=named.created_at,
        created_until=made_until,
        now=clock.now,
    )


_PREPARED_READ_BOUNDS = "read_bounds"

# One recorded send: step, started_at, finished_at, http_status.
_Send = tuple[str, datetime, datetime | None, int | None]


@dataclass(frozen=True)
class _DbClock:
    """The database's clock, read once with a batch's bounds and carried forward on this
    process's monotonic clock: the clock every stamp that bounds a read was taken from
    (`PaymentOperation.created_at`, a send's `started_at` and `finished_at`), so a read
    compares the provider's clock with it, never with this host's own."""

    read: datetime  # the database's now() when read
    at: float  # time.monotonic() then

    def now(self) -> datetime:
        return self.read + timedelta(seconds=time.monotonic() - self.at)


def _metadata_owner(op: PaymentOperation) -> str:
    """The operation whose id the provider object read by metadata carries."""
    if op.kind == OperationKind.REFUND or op.parent_id is None:
        return op.id
    return op.parent_id


def _made_until_of(operation_ids: list[str]) -> tuple[dict[str, datetime], _DbClock | None]:
    """The latest time the provider can have made an object carrying each operation's id,
    and the database's clock, read in the same statement (None for no operations).
    Only a send makes one, and each is recorded before it leaves (a dispatch call, or a
    one-call re-send recorded as a replay): the latest of its answers, or a send's time
    plus the longest a request lives while a send has none (a dead worker, a hung
    request), and never before the last send plus the provider's in-flight window — the
    same window every "none" verdict already waits out (`_past_inflight_window`). An
    operation with no send recorded is absent: its read stays unbounded above. So is one
    the provider was seen holding a request longer than that window (`_held_past_window`):
    the window bounds nothing it makes."""
    sends: dict[str, list[_Send]] = {}
    clock = None
    # Each operation joined to its sends (none: one row of NULLs), so the database's
    # clock comes back even for an operation that has sent nothing.
    rows = (
        PaymentOperation.objects.filter(id__in=operation_ids)
        .annotate(
            sends=FilteredRelation(
                "provider_calls",
                condition=Q(provider_calls__purpose__in=(CallPurpose.DISPATCH, CallPurpose.REPLAY)),
            ),
            db_now=Now(),
        )
        .values_list(
            "id",
            "sends__step",
            "sends__started_at",
            "sends__finished_at",
            "sends__http_status",
            "db_now",
        )
    )
    for op_id, step, started, finished, status, db_now in rows:
        if clock is None:
            clock = _DbClock(read=db_now, at=time.monotonic())
        if step is not None:
            sends.setdefault(op_id, []).append((step, started, finished, status))
    inflight = timedelta(seconds=settings.PROVIDER_INFLIGHT_WINDOW_SECONDS)
    lifetime = timedelta(seconds=settings.STRIPE_CONNECT_TIMEOUT + settings.STRIPE_READ_TIMEOUT)
    out = {}
    for op_id, made in sends.items():
        if _held_past_window(made):
            continue
        last = max(started for _step, started, _finished, _status in made)
        ends = [last + inflight]
        ends += [finished for _step, _started, finished, _status in made if finished is not None]
        if any(finished is None for _step, _started, finished, _status in made):
            ends.append(last + lifetime)
        out[op_id] = max(ends)
    return out, clock


def _held_past_window(sends: list[_Send]) -> bool:
    """(step, started_at, finished_at, http_status) of an operation's sends: one answered
    409 — its key's earlier request still running at the provider — that left longer than
    the provider's in-flight window after the first send of its step. The provider was
    seen holding a request longer than the window: it may still make its object, so
    neither the window nor the answers bound when."""
    inflight = timedelta(seconds=settings.PROVIDER_INFLIGHT_WINDOW_SECONDS)
    first: dict[str, datetime] = {}
    for step, started, _finished, _status in sorted(sends, key=lambda send: send[1]):
        first.setdefault(step, started)
    return any(
        status == 409 and started - first[step] > inflight
        for step, started, _finished, status in sends
    )


def _provider_held_past_window(op: PaymentOperation) -> bool:
    """`_held_past_window` of one operation's own sends, read now."""
    return _held_past_window(
        list(
            op.provider_calls.filter(
                purpose__in=(CallPurpose.DISPATCH, CallPurpose.REPLAY)
            ).values_list("step", "started_at", "finished_at", "http_status")
        )
    )


def _read_bounds(op: PaymentOperation) -> tuple[datetime | None, _DbClock]:
    """`_made_until_of` for one operation's object and the database's clock: stored on it
    by the sweep's prepare (its reads run on other threads, without the database), else
    read now."""
    if _PREPARED_READ_BOUNDS in op.__dict__:
        return cast("tuple[datetime | None, _DbClock]", op.__dict__[_PREPARED_READ_BOUNDS])
    owner = _metadata_owner(op)
    made_until, clock = _made_until_of([owner])
    if clock is None:  # the operation (or the parent its object names) is gone
        raise PaymentOperation.DoesNotExist(owner)
    return made_until.get(owner), clock


def _resend_window_open(op: PaymentOperation) -> bool:
    """A one-call payment (create with confirm=true, docs/reliability.md) whose answer Verity
    lacks, its first send well inside the provider's key window: asking again under the
    same key is answered from the provider's record of that key. Decided from the
    operation's own fields (no query), so the sweep can sort a batch by it."""
    if (
        op.kind not in PAYMENT_KINDS
        or op.provider_reference
        or op.confirm_claimed_at is None
        or op.outcome != Outcome.UNKNOWN
        or rail_evidence_for(op.rail) is not None
    ):
        return False
    provider = payment_provider(provider_for(op))
    if not provider.pays_in_one_call():
        # The provider no longer dedupes keys (configuration changed): a re-send would be a
        # second payment. Reading alone.
        return False
    usable = timedelta(
        seconds=settings.STRIPE_IDEMPOTENCY_WINDOW_SECONDS - settings.STRIPE_RESEND_MARGIN_SECONDS
    )
    return timezone.now() - op.confirm_claimed_at < usable


def _one_call_resend(op: PaymentOperation) -> CallResult | None:
    """Re-send a one-call payment's request, byte for byte, under its step key, or None
    when none may leave (not a one-call payment, its window closing, settled meanwhile, or
    the checkout halted: a re-send is a write, and a halt binds at claim time).
    Claimed under the locks and recorded as a `replay` call of the `pay` step.

    What comes back is the provider's stored answer for the key (the payment, or its
    decline), or the one execution the key allows if the first never arrived; a 409 is the
    first request still running there; a replayed 500 tells nothing. The caller reads when
    this tells nothing."""
    if not _resend_window_open(op):
        return None
    with transaction.atomic():
        _purchase, locked = lock_purchase_and_operation(op.id)
        if not _resend_window_open(locked) or _halted(operation_workflow(locked.kind)):
            return None
        if not locked.provider_calls.filter(
            purpose=CallPurpose.DISPATCH, step=CallStep.PAY
        ).exists():
            return None  # sent in two steps (create, then confirm): never re-sent
        attempt = (
            locked.provider_calls.filter(purpose=CallPurpose.REPLAY, step=CallStep.PAY).count() + 1
        )
        call = ProviderCall.objects.create(
            operation=locked,
            purpose=CallPurpose.REPLAY,
            step=CallStep.PAY,
            attempt=min(attempt, 32767),
            key=locked.provider_key(CallStep.PAY),
        )
    assert_outside_transaction()
    result = payment_provider(provider_for(op)).create_and_confirm_payment_intent(
        key=call.key, **payment_request(op)
    )
    _record_call(call, result)
    return result


def _resend_refused(result: CallResult) -> bool:
    """The provider refused the re-send as an invalid request (400/404, not an
    idempotency error, not a fault drill's stand-in that never left). Stripe keeps no answer
    under a key for a request it refused before executing, so had the first send run, the
    key would answer its stored result (or 409 while it runs); a refusal of the
    byte-identical request inside the key window says the first was refused too: nothing
    moved, as when the first send hears the refusal itself."""
    return (
        result.classification == Classification.REJECTED
        and result.http_status in (400, 404)
        and result.error_code != "idempotency_error"
        and not result.fault_drill
    )


def _settle_resend_refused(operation_id: str, result: CallResult, *, actor: str) -> None:
    with transaction.atomic():
        purchase, locked = lock_purchase_and_operation(operation_id)
        if locked.outcome != Outcome.UNKNOWN or locked.provider_reference:
            return  # settled meanwhile (the webhook, another reconcile)
        outcome_apply_locked(
            purchase,
            locked,
            Outcome.FAILED,
            grade=Grade.CONFIRMED,
            verification=Verification.PROVIDER,
            cause="resend_rejected",
            actor=actor,
            reason=Reason.INVALID_REQUEST,
            evidence={"http_status": result.http_status, "code": result.error_code},
        )


def _reconcile_call_row(op: PaymentOperation, step: str, result: CallResult) -> ProviderCall:
    """The reconcile call's record, built right after the answer (not yet saved)."""
    return ProviderCall(
        operation=op,
        purpose=CallPurpose.RECONCILE,
        step=step,
        attempt=min(op.reconcile_attempts + 1, 32767),
        http_status=result.http_status,
        classification=result.classification,
        request_id=result.request_id[:100],
        error_code=result.error_code[:64],
        fault_drill=result.fault_drill,
        finished_at=timezone.now(),
        safe_fields=result.object.safe_fields() if result.object else {"detail": result.detail},
    )


def _read_back(op: PaymentOperation) -> CallResult:
    """Read-only: by provider reference, else by metadata. Records a reconcile call."""
    step, result = _read_back_call(op)
    # A read claims nothing, so it is recorded once, after the answer (one INSERT).
    _reconcile_call_row(op, step, result).save(force_insert=True)
    return result


def operation_read_canonical(*, operation_id: str) -> ProviderObject | None:
    """The provider's current record of an operation, read (and recorded as a reconcile
    call) without applying it: for a caller that must judge a conflict itself."""
    assert_outside_transaction()
    op = PaymentOperation.objects.select_related("purchase", "parent").get(id=operation_id)
    result = _read_back(op)
    return result.object if result.classification == Classification.OK else None


def operation_reconcile(*, operation_id: str, actor: str = "reconciler") -> PaymentOperation:
    """Read the provider's record and apply it. Nothing found or provider unavailable
    keeps `unknown` (absence of evidence is not failure). Writes to the provider only in
    one case, the acknowledged follow-up: a person's "succeeded" on a payment the provider
    shows never applied is cancelled there, so the provider's record can overturn it."""
    assert_outside_transaction()
    op = PaymentOperation.objects.select_related("purchase", "parent").get(id=operation_id)
    refusal = _reconcile_refusal(op)
    if refusal is not None:
        raise refusal
    resent = _one_call_resend(op)
    if resent is not None and _resend_refused(resent):
        _settle_resend_refused(op.id, resent, actor=actor)
        settled = PaymentOperation.objects.select_related("purchase").get(id=operation_id)
        return _reconcile_finish(settled, resent, actor=actor)
    if (
        resent is not None
        and resent.object is not None
        and resent.classification in (Classification.OK, Classification.DECLINED)
    ):
        if resent.replayed:
            # The key's stored answer says what the payment WAS when the key first ran
            # (an authorization since cancelled, a payment since refunded): read the
            # PaymentIntent it names, by id, and apply the provider's record of now.
            result = payment_provider(provider_for(op)).retrieve_payment_intent(resent.object.id)
            _reconcile_call_row(op, CallStep.RETRIEVE, result).save(force_insert=True)
            if result.classification == Classification.OK and result.object is not None:
                operation_apply_observation(
                    operation_id=op.id,
                    obj=result.object,
                    source=Verification.PROVIDER,
                    cause="resend_readback",
                    actor=actor,
                )
        else:
            # The provider's own answer, executed now under the payment's key (a payment
            # or its decline).
            operation_apply_observation(
                operation_id=op.id,
                obj=resent.object,
                source=Verification.PROVIDER,
                cause="resend_answer",
                actor=actor,
            )
            result = resent
    else:
        result = _read_back(op)
        if result.classification == Classification.OK and result.object is not None:
            operation_apply_observation(
                operation_id=op.id,
                obj=result.object,
                source=Verification.PROVIDER,
                cause="reconcile",
                actor=actor,
            )
    settled = PaymentOperation.objects.select_related("purchase").get(id=operation_id)
    return _reconcile_finish(settled, result, actor=actor)


def _reconcile_refusal(op: PaymentOperation) -> DomainError | None:
    """Why this operation is not read back at all (nothing is read or written), or None."""
    # A person's (acknowledged) outcome is not the provider's: it can still be read back,
    # and the provider's record outranks it
    # (docs/reliability.md#the-providers-record-outranks-a-person).
    if op.is_terminal and op.grade != Grade.ACKNOWLEDGED:
        return DomainError(
            ErrorCode.ALREADY_SETTLED,
            f"This operation is already {op.outcome}.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.NONE,
            purchase=op.purchase_id,
            operation=op.id,
        )
    if op.outcome in (Outcome.PENDING, Outcome.AWAITING_APPROVAL):
        return DomainError(
            ErrorCode.NOT_DISPATCHED,
            "This operation was never sent to the provider.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.NONE,
            purchase=op.purchase_id,
            operation=op.id,
        )
    if op.outcome == Outcome.DISPATCHING:
        # Its worker holds the send: an x402 refund may be waiting for the
        # signer, about to sign. A read now finds nothing and would call that "nothing
        # moved" while the send can still happen. The worker's answer settles it; a dead
        # worker is found by the dead-dispatch sweep (-> unknown, then read back).
        return DomainError(
            ErrorCode.DISPATCH_IN_PROGRESS,
            "This operation is being sent to the "
            "provider right now; its answer settles it. Poll the operation.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.RECONCILIATION,
            purchase=op.purchase_id,
            operation=op.id,
        )
    return None


def _reconcile_finish(
    settled: PaymentOperation, result: CallResult, *, actor: str
) -> PaymentOperation:
    """After the read-back was applied: `settled` is the operation read again after that
    commit. A person's outcome is followed up; an open one is scheduled again (and
    escalated when it cannot settle by itself)."""
    operation_id = settled.id
    if settled.is_terminal:
        if settled.grade == Grade.ACKNOWLEDGED or settled.next_reconcile_at is not None:
            return _acknowledged_follow_up(settled, result, actor=actor)
        return settled  # nothing left to schedule
    if _created_unconfirmed(settled):
        resolved = _created_unconfirmed_settle(settled, result, actor=actor)
        if resolved is not None:
            return resolved
    unapplied = _confirm_unapplied(settled, result)
    with transaction.atomic():
        purchase = lock_purchase(settled.purchase_id)
        op = lock_operation(operation_id)
        if op.outcome in (Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER):
            op.reconcile_attempts += 1
            _schedule_reconcile(op, first=False)
            if unapplied and op.escalated_at is None:
                assert result.object is not None  # unapplied was read from it
                # The provider never applied the confirm and, past its in-flight window, it
                # will not by itself: reading again cannot settle it. A person decides now
                # (the console's "cancel at the provider and mark failed").
                op.stage, op.escalated_at = Stage.ESCALATED, timezone.now()
                op.next_action_owner = Owner.SUPPORT
                op.save(update_fields=["stage", "escalated_at", "next_action_owner", "updated_at"])
                transition_record(
                    purchase_id=purchase.id,
                    operation=op,
                    field="outcome",
                    source=op.outcome,
                    target=op.outcome,
                    cause="escalated_unapplied_write",
                    evidence={
                        "provider_status": result.object.status,
                        "recovery_owner": purchase.recovery_owner,
                    },
                    actor=actor,
                )
            if (
                op.reconcile_deadline
                and timezone.now() >= op.reconcile_deadline
                and op.escalated_at is None
            ):
                op.stage, op.escalated_at = Stage.ESCALATED, timezone.now()
                op.next_action_owner = Owner.SUPPORT
                op.save(update_fields=["stage", "escalated_at", "next_action_owner", "updated_at"])
                transition_record(
                    purchase_id=purchase.id,
                    operation=op,
                    field="outcome",
                    source=op.outcome,
                    target=op.outcome,
                    cause="escalated",
                    evidence={"recovery_owner": purchase.recovery_owner},
                    actor=actor,
                )
    return PaymentOperation.objects.select_related("purchase").get(id=operation_id)


def operations_reconcile_prepare(
    *, operation_ids: list[str]
) -> tuple[list[PaymentOperation], list[PaymentOperation], dict[str, DomainError]]:
    """The set-based reconcile (the sweep), step 1: one read of a batch. Returns
    the operations whose read-back is network only (`operation_reconcile_read` may run
    them on other threads), those read through the database too (x402: one by one with
    `operation_reconcile`), and the refused ones with the error `operation_reconcile`
    would raise (nothing is read or written for them)."""
    found = PaymentOperation.objects.select_related("purchase", "parent").in_bulk(
        list(operation_ids)
    )
    readable, sequential, refused = [], [], {}
    for op_id in operation_ids:
        op = found.get(op_id)
        if op is None:
            continue
        refusal = _reconcile_refusal(op)
        if refusal is not None:
            refused[op_id] = refusal
        elif rail_evidence_for(op.rail) is not None or _resend_window_open(op):
            # Its read-back reads the database (x402), or it is a one-call payment whose
            # lost answer is asked again under its key (a claimed write): one by one.
            sequential.append(op)
        else:
            readable.append(op)
    # When each object read by metadata can have been made, and the database's clock the
    # bounds are stamped by, read here: the reads run on other threads, without the
    # database. One statement for the batch.
    made_until, clock = _made_until_of(sorted({_metadata_owner(op) for op in readable}))
    for op in readable:
        op.__dict__[_PREPARED_READ_BOUNDS] = (made_until.get(_metadata_owner(op)), clock)
    return readable, sequential, refused


def operation_reconcile_read(op: PaymentOperation) -> tuple[CallResult, ProviderCall]:
    """Step 2: the read-back of one prepared (card-rail) operation and its reconcile call
    record, unsaved. Network only: safe on a worker thread, never inside a transaction."""
    step, result = _read_back_call(op)
    return result, _reconcile_call_row(op, step, result)


def operations_reconcile_apply(
    *, reads: list[tuple[PaymentOperation, CallResult, ProviderCall]], actor: str = "reconciler"
) -> dict[str, str]:
    """Step 3: apply a batch of read-backs set-based, with the effects of
    `operation_reconcile` on each: the reconcile call rows in one INSERT; every
    observation applied by the one apply path (`_apply_observation_locked`) in ONE
    transaction, both locks of the whole batch taken in two statements and the history
    and outbox rows inserted in one statement each; then one read of the results, and the
    per-operation follow-up (`_reconcile_finish`) only where one is due (an open or a
    person's outcome). A second operation of a purchase already in the batch, or a batch
    whose set-based apply raises (rolled back whole), is applied one by one as
    `operation_reconcile` does. Returns operation id -> "reconciled" | "refused" |
    "failed:<error>"."""
    assert_outside_transaction()
    outcomes: dict[str, str] = {}
    if not reads:
        return outcomes
    try:
        ProviderCall.objects.bulk_create([call for _, _, call in reads])
    except Exception as exc:  # noqa: BLE001 - as operation_reconcile: nothing applied
        log.warning("reconcile batch: recording %d read-backs failed", len(reads), exc_info=True)
        return {op.id: f"failed:{type(exc).__name__}" for op, _, _ in reads}
    batched: list[tuple[PaymentOperation, ProviderObject]] = []
    one_by_one: list[tuple[PaymentOperation, ProviderObject]] = []
    purchases: set[str] = set()
    for op, result, _ in reads:
        if result.classification != Classification.OK or result.object is None:
            continue
        (one_by_one if op.purchase_id in purchases else batched).append((op, result.object))
        purchases.add(op.purchase_id)
    if batched:
        objects = {op.id: obj for op, obj in batched}
        try:
            with transaction.atomic(), change_batch():
                for purchase, locked in lock_purchases_and_operations(
                    [(op.id, op.purchase_id) for op, _ in batched]
                ):
                    _apply_observation_locked(
                        purchase,
                        locked,
                        objects[locked.id],
                        source=Verification.PROVIDER,
                        cause="reconcile",
                        actor=actor,
                    )
        except Exception:  # noqa: BLE001 - rolled back whole: apply one by one instead
            log.warning(
                "reconcile batch: set-based apply of %d failed; applying one by one",
                len(batched),
                exc_info=True,
            )
            one_by_one = batched + one_by_one
    for op, obj in one_by_one:
        try:
            operation_apply_observation(
                operation_id=op.id,
                obj=obj,
                source=Verification.PROVIDER,
                cause="reconcile",
                actor=actor,
            )
        except Exception as exc:  # noqa: BLE001 - as operation_reconcile raising for it
            log.warning("reconcile batch: %s failed", op.id, exc_info=True)
            outcomes[op.id] = f"failed:{type(exc).__name__}"
    settled = PaymentOperation.objects.select_related("purchase").in_bulk(
        [op.id for op, _, _ in reads]
    )
    for op, result, _ in reads:
        if op.id in outcomes:
            continue
        try:
            _reconcile_finish(settled[op.id], result, actor=actor)
            outcomes[op.id] = "reconciled"
        except DomainError:
            outcomes[op.id] = "refused"
        except Exception as exc:  # noqa: BLE001 - one bad operation must not stop the rest
            log.warning("reconcile batch: %s failed", op.id, exc_info=True)
            outcomes[op.id] = f"failed:{type(exc).__name__}"
    return outcomes


def operation_reconcile_on_demand(*, operation_id: str, actor: str) -> int:
    """A read-back someone asked for (API, MCP). At most one per operation per
    RECONCILE_ON_DEMAND_COOLDOWN_SECONDS (without it, 200 POSTs would make 200 provider
    reads and 200 timeline rows): within the cooldown nothing is read or written and the
    caller answers the current state. Returns 0 after a read-back, else the seconds to
    wait (Retry-After). The claim is one atomic `cache.add` in the shared cache (Redis),
    so concurrent requests on any web process cannot both read."""
    from django.core.cache import cache

    cooldown = int(settings.RECONCILE_ON_DEMAND_COOLDOWN_SECONDS)
    op = PaymentOperation.objects.get(id=operation_id)
    # Whatever operation_reconcile would read (an operation a person settled
    # included) is under the cooldown; settled or never sent it refuses without reading.
    open_for_reading = _reconcile_refusal(op) is None
    key = f"reconcile-on-demand:{operation_id}"
    now = time.time()
    if open_for_reading and cooldown > 0:
        try:
            if not cache.add(key, now, timeout=cooldown):
                last = cache.get(key) or now
                return max(1, math.ceil(cooldown - (now - last)))
        except Exception:  # noqa: BLE001 - a cache outage must not stop a read-back
            log.warning("reconcile cooldown cache unavailable; reading back", exc_info=True)
    operation_reconcile(operation_id=operation_id, actor=actor)
    return 0


def _schedule_acknowledged_read_back(op: PaymentOperation) -> None:
    """A person's outcome stands only until the provider can be read: read it back on the
    reconcile schedule (no change of owner: the purchase follows the person's outcome)
    until the provider confirms or overturns it, for ACKNOWLEDGED_READBACK_SECONDS.
    Caller holds the operation's lock (or has just written it)."""
    now = timezone.now()
    settled_at = op.settled_at or now
    if now - settled_at >= timedelta(seconds=settings.ACKNOWLEDGED_READBACK_SECONDS):
        op.next_reconcile_at = None
        op.save(update_fields=["next_reconcile_at", "updated_at"])
        return
    schedule = settings.RECONCILE_SCHEDULE_SECONDS
    delay = schedule[min(op.reconcile_attempts, len(schedule) - 1)]
    op.next_reconcile_at = now + timedelta(seconds=delay)
    op.save(update_fields=["next_reconcile_at", "updated_at"])
    reconcile_put(operation_id=op.id, delay_seconds=delay)


def _acknowledged_follow_up(
    op: PaymentOperation, result: CallResult, *, actor: str
) -> PaymentOperation:
    """After a read-back of an operation a person settled (a "succeeded" accepted while the
    provider was unreachable must be read again: the provider may show the confirm
    unapplied). The observation was already applied: agreeing evidence
    upgraded it to confirmed, contradicting final evidence overturned it. What is left:
    - a payment the person called succeeded that the provider shows never applied, past
      the provider's in-flight window: cancel it at the provider (no money moved; the
      cancel makes that final), and the canceled record overturns the person's word;
    - nothing readable or nothing final yet: read again later."""
    if op.grade != Grade.ACKNOWLEDGED:
        if op.next_reconcile_at is not None:  # confirmed by agreeing evidence: done
            PaymentOperation.objects.filter(id=op.id).update(next_reconcile_at=None)
            op.next_reconcile_at = None
        return op
    obj = result.object if result.classification == Classification.OK else None
    if obj is not None and created_unconfirmed_adopt(op, obj):
        op.provider_reference = obj.id  # found by metadata: judged below as if stored
    if (
        obj is not None
        and op.kind in PAYMENT_KINDS
        and op.outcome in (Outcome.SUCCEEDED, Outcome.FAILED)
        and op.provider_reference
        and obj.id == op.provider_reference
        and shows_no_money_moved(obj, kind=op.kind)
        and (
            op.confirm_claimed_at is None
            or timezone.now() - op.confirm_claimed_at
            >= timedelta(seconds=settings.PROVIDER_INFLIGHT_WINDOW_SECONDS)
        )
    ):
        try:
            return operation_cancel_unapplied(
                operation_id=op.id,
                actor=actor,
                reason="read-back: the provider shows this payment never applied, "
                "contradicting a person's 'succeeded'",
            )
        except DomainError as exc:
            log.warning(
                "acknowledged follow-up: cancel refused operation=%s code=%s", op.id, exc.code
            )
    if (
        obj is not None
        and op.kind in (OperationKind.CAPTURE, OperationKind.VOID)
        and op.outcome == Outcome.SUCCEEDED
        and shows_no_money_moved(obj, kind=op.kind)
        and _past_inflight_window(op)
    ):
        # A person's "captured"/"voided" while the provider still shows the authorization
        # standing: the provider's record overturns it, as for charges.
        with transaction.atomic():
            purchase, locked = lock_purchase_and_operation(op.id)
            if (
                locked.grade == Grade.ACKNOWLEDGED
                and locked.outcome == Outcome.SUCCEEDED
                and not _mismatch(locked, obj)
            ):
                outcome_apply_locked(
                    purchase,
                    locked,
                    Outcome.FAILED,
                    grade=Grade.CONFIRMED,
                    verification=Verification.PROVIDER,
                    cause="readback_no_money_moved",
                    actor=actor,
                    evidence=obj.safe_fields(),
                    reason=Reason.PROVIDER_FAILED,
                    obj=obj,
                    final=True,
                )
        return PaymentOperation.objects.select_related("purchase").get(id=op.id)
    if (
        refund_never_received(op, result)
        or one_call_payment_never_received(op, result)
        or two_step_payment_never_created(op, result)
    ):
        # A person's word on a refund (or a one-call payment) the provider never received:
        # the provider is readable, holds no refund (no PaymentIntent) of this operation
        # and, past the in-flight window, will not. No money moved: a "succeeded" is
        # overturned, a "failed" confirmed (its amount, its purchase, are free again).
        with transaction.atomic():
            purchase, locked = lock_purchase_and_operation(op.id)
            if locked.grade == Grade.ACKNOWLEDGED and locked.outcome in (
                Outcome.SUCCEEDED,
                Outcome.FAILED,
            ):
                outcome_apply_locked(
                    purchase,
                    locked,
                    Outcome.FAILED,
                    grade=Grade.CONFIRMED,
                    verification=Verification.PROVIDER,
                    cause="readback_no_money_moved",
                    actor=actor,
                    evidence={"provider": f"no {_object_noun(op)} of this operation"},
                    reason=Reason.PROVIDER_FAILED,
                    final=True,
                )
        return PaymentOperation.objects.select_related("purchase").get(id=op.id)
    with transaction.atomic():
        lock_purchase(op.purchase_id)
        locked = lock_operation(op.id)
        if locked.grade == Grade.ACKNOWLEDGED:
            locked.reconcile_attempts += 1
            _schedule_acknowledged_read_back(locked)
        elif locked.next_reconcile_at is not None:
            locked.next_reconcile_at = None
            locked.save(update_fields=["next_reconcile_at", "updated_at"])
    return PaymentOperation.objects.select_related("purchase").get(id=op.id)


def refund_never_received(op: PaymentOperation, result: CallResult) -> bool:
    """A card-rail refund with no provider reference whose read-back (by metadata) found
    no refund of this operation at a readable provider, its last send older than the
    provider's in-flight window: the provider never received it, so no money moved.
    (A rail that reads back from its own evidence says so itself: an x402 refund with no
    transfer stored is `invalid`.)"""
    return (
        op.kind == OperationKind.REFUND
        and rail_evidence_for(op.rail) is None
        and not op.provider_reference
        and result.classification == Classification.NOT_FOUND
        and _past_inflight_window(op)
    )


def one_call_payment_never_received(op: PaymentOperation, result: CallResult) -> bool:
    """A one-call card payment (create with confirm=true) with no provider reference whose
    read-back (by metadata, every page) found no PaymentIntent of this operation at a
    readable provider, its last send (the first or a re-send under its key) older than the
    provider's in-flight window: no PaymentIntent exists, so none was charged. (Refused
    requests leave none: the provider keeps no answer for them.)"""
    if not (
        op.kind in PAYMENT_KINDS
        and rail_evidence_for(op.rail) is None
        and not op.provider_reference
        and op.confirm_claimed_at is not None
        and result.classification == Classification.NOT_FOUND
    ):
        return False
    age = _last_send_age(
        op.provider_calls.filter(
            step=CallStep.PAY, purpose__in=(CallPurpose.DISPATCH, CallPurpose.REPLAY)
        )
    )
    return (
        age is not None
        and age >= timedelta(seconds=settings.PROVIDER_INFLIGHT_WINDOW_SECONDS)
        and not _provider_held_past_window(op)
    )


def _created_unconfirmed(op: PaymentOperation) -> bool:
    """A two-step card payment left `unknown` after its create (the answer lost, or its
    worker died) and before its confirm was claimed: Verity sent no confirm, so it moved
    no money, but the provider may hold its PaymentIntent, payable with the secret key.
    The purchase stays busy until the read-back finds it (cancelled) or finds none."""
    return (
        op.kind in PAYMENT_KINDS
        and op.outcome == Outcome.UNKNOWN
        and op.confirm_claimed_at is None
        and rail_evidence_for(op.rail) is None
    )


def _created_unconfirmed_settle(
    op: PaymentOperation, result: CallResult, *, actor: str
) -> PaymentOperation | None:
    """Settle a `_created_unconfirmed` payment from its read-back: the PaymentIntent found
    still waiting for a confirm is adopted (its id stored) and cancelled at the provider,
    then the payment is `failed` on the provider's answer; none found by a complete read,
    past the provider's in-flight window, is `failed` (`not_confirmed`). None when neither
    holds yet (unreadable, still in flight, cancel refused): read again later."""
    obj = result.object if result.classification == Classification.OK else None
    if obj is not None and obj.confirm_unapplied:
        with transaction.atomic():
            _purchase, locked = lock_purchase_and_operation(op.id)
            if locked.outcome != Outcome.UNKNOWN or _mismatch(locked, obj):
                return None
            if not locked.provider_reference:
                locked.provider_reference = obj.id
                locked.save(update_fields=["provider_reference", "updated_at"])
        try:
            return operation_cancel_unapplied(
                operation_id=op.id,
                actor=actor,
                reason="the create's answer was lost and no confirm was sent: "
                "the PaymentIntent is cancelled so nobody can pay it",
            )
        except DomainError as exc:
            log.warning("unconfirmed create: cancel refused operation=%s code=%s", op.id, exc.code)
            return None
    if (
        result.classification == Classification.NOT_FOUND
        and not op.provider_reference
        and _past_inflight_window(op)
    ):
        with transaction.atomic():
            purchase, locked = lock_purchase_and_operation(op.id)
            if locked.outcome != Outcome.UNKNOWN or locked.provider_reference:
                return None
            outcome_apply_locked(
                purchase,
                locked,
                Outcome.FAILED,
                grade=Grade.CONFIRMED,
                verification=Verification.PROVIDER,
                cause="readback_never_created",
                actor=actor,
                evidence={"provider": "no payment intent of this operation"},
                reason=Reason.NOT_CONFIRMED,
            )
        return PaymentOperation.objects.select_related("purchase").get(id=op.id)
    return None


def created_unconfirmed_adopt(op: PaymentOperation, obj: ProviderObject) -> bool:
    """A card payment whose PaymentIntent's id Verity never heard (a two-step create's
    answer lost before its confirm was claimed, or a one-call payment's answers lost),
    judged by a person or after a person's word: the PaymentIntent the read-back found by
    metadata is stored as its reference, so the provider's record of it confirms or
    overturns the person and a payable one is cancelled before the purchase is free for
    another payment. True when stored."""
    if not (
        op.kind in PAYMENT_KINDS
        and not op.provider_reference
        and rail_evidence_for(op.rail) is None
    ):
        return False
    with transaction.atomic():
        _purchase, locked = lock_purchase_and_operation(op.id)
        if locked.provider_reference or _mismatch(locked, obj):
            return False
        locked.provider_reference = obj.id
        locked.save(update_fields=["provider_reference", "updated_at"])
    return True


def two_step_payment_never_created(op: PaymentOperation, result: CallResult) -> bool:
    """A two-step card payment whose confirm Verity never claimed, with no provider
    reference, whose read-back (by metadata, every page) found no PaymentIntent of it at a
    readable provider, its create sent longer ago than the provider's in-flight window:
    none exists, so none was charged (a person's "succeeded" is overturned)."""
    return (
        op.kind in PAYMENT_KINDS
        and rail_evidence_for(op.rail) is None
        and not op.provider_reference
        and op.confirm_claimed_at is None
        and result.classification == Classification.NOT_FOUND
        and _past_inflight_window(op)
    )


def _object_noun(op: PaymentOperation) -> str:
    return "refund" if op.kind == OperationKind.REFUND else "payment"


def _past_inflight_window(op: PaymentOperation) -> bool:
    """The operation's last write was sent longer ago than the provider's in-flight window,
    and the provider was never seen holding one of its requests longer than that window:
    what the provider shows now is what it applied."""
    age = _last_send_age(op.provider_calls.filter(purpose=CallPurpose.DISPATCH))
    return age is None or (
        age >= timedelta(seconds=settings.PROVIDER_INFLIGHT_WINDOW_SECONDS)
        and not _provider_held_past_window(op)
    )


def _last_send_age(sends: QuerySet[ProviderCall]) -> timedelta | None:
    """How long ago the latest of `sends` left, by the database's clock (the one its
    `started_at` was stamped by, whichever host sent it), or None when none was. One
    statement."""
    last = (
        sends.annotate(db_now=Now())
        .order_by("-started_at")
        .values_list("started_at", "db_now")
        .first()
    )
    if last is None:
        return None
    started, db_now = last
    return db_now - started


def _confirm_unapplied(op: PaymentOperation, result: CallResult) -> bool:
    """The read-back shows a confirm the provider never applied (the PaymentIntent still
    `requires_confirmation`), claimed longer ago than the provider's in-flight window."""
    return (
        op.kind in PAYMENT_KINDS
        and op.outcome == Outcome.UNKNOWN
        and result.classification == Classification.OK
        and result.object is not None
        and result.object.confirm_unapplied
        and op.confirm_claimed_at is not None
        and timezone.now() - op.confirm_claimed_at
        >= timedelta(seconds=settings.PROVIDER_INFLIGHT_WINDOW_SECONDS)
    )


def operation_cancel_unapplied(*, operation_id: str, reason: str, actor: str) -> PaymentOperation:
    """Settle an unapplied confirm: cancel the PaymentIntent at the provider, then mark the
    payment failed from the provider's own answer (grade confirmed, never a person's word).

    A write to the provider, so the three phases: (1) under the locks, check the operation
    is an unknown payment and claim the cancel step (a concurrent second cancel is refused
    by the claim's unique constraint); (2) read back, and cancel only if the confirm is
    still unapplied; (3) apply what the provider answered. Refused — nothing changes in
    Verity — if the provider applied the payment after all or the cancel fails.
    """
    if not (reason or "").strip():
        raise DomainError(ErrorCode.REASON_REQUIRED, "A reason is required.", status=422)
    with transaction.atomic():
        purchase, op = _lock_or_404(operation_id)
        # An unknown payment, or one a person called succeeded that the provider shows
        # never applied (the acknowledged follow-up): the provider's record outranks them.
        # (A person's "failed" the provider cannot confirm is made final the same way.)
        contradicted = (
            op.outcome in (Outcome.SUCCEEDED, Outcome.FAILED) and op.grade == Grade.ACKNOWLEDGED
        )
        if (
            op.kind not in PAYMENT_KINDS
            or not op.provider_reference
            or not (op.outcome == Outcome.UNKNOWN or contradicted)
        ):
            raise DomainError(
                ErrorCode.NOT_CANCELLABLE,
                "Only an unknown payment with a provider reference can be cancelled here.",
                status=409,
                purchase=purchase.id,
                operation=op.id,
                owner=Owner.SUPPORT,
            )
        if _halted(operation_workflow(op.kind)):
            # A cancel is a write to the provider: it honours the halt like every dispatch
            # (a halt binds at claim time); the follow-up reads again later, a person tries
            # again later.
            raise DomainError(
                ErrorCode.WORKFLOW_HALTED,
                f"The {operation_workflow(op.kind)} "
                "workflow is halted: nothing is cancelled at the provider "
                "now.",
                status=503,
                retry=RetryAdvice.SAME_KEY,
                purchase=purchase.id,
                operation=op.id,
                owner=Owner.SUPPORT,
            )
        attempt = (
            op.provider_calls.filter(purpose=CallPurpose.DISPATCH, step=CallStep.CANCEL).count() + 1
        )
        try:
            with transaction.atomic():
                call = ProviderCall.objects.create(
                    operation=op,
                    purpose=CallPurpose.DISPATCH,
                    step=CallStep.CANCEL,
                    attempt=attempt,
                    key=(
                        op.provider_key(CallStep.CANCEL)
                        if attempt == 1
                        else f"{op.idempotency_key}.{attempt}:{CallStep.CANCEL}"
                    ),
                )
        except IntegrityError:
            raise DomainError(
                ErrorCode.CANCEL_IN_PROGRESS,
                "Another cancel of this payment is in progress.",
                status=409,
                purchase=purchase.id,
                operation=op.id,
                owner=Owner.SUPPORT,
            ) from None
    assert_outside_transaction()
    read = _read_back(op)
    if read.classification != Classification.OK or read.object is None:
        _record_call(call, CallResult(Classification.NOT_SENT, detail="read-back failed"))
        raise DomainError(
            ErrorCode.CANCEL_FAILED,
            "The provider could not be read; nothing was cancelled. Try again later.",
            status=502,
            purchase=op.purchase_id,
            operation=op.id,
            owner=Owner.SUPPORT,
        )
    unapplied = (
        shows_no_money_moved(read.object, kind=op.kind)
        if contradicted
        else read.object.confirm_unapplied
    )
    if not unapplied:
        _record_call(call, CallResult(Classification.REJECTED, detail="not unapplied"))
        operation_apply_observation(
            operation_id=op.id,
            obj=read.object,
            source=Verification.PROVIDER,
            cause="reconcile",
            actor=actor,
        )
        raise DomainError(
            ErrorCode.PROVIDER_APPLIED,
            f"The provider's record is now "
            f"{read.object.status}: the confirm was not left unapplied; nothing "
            "was cancelled.",
            status=409,
            purchase=op.purchase_id,
            operation=op.id,
            owner=Owner.SUPPORT,
        )
    result = payment_provider(provider_for(op)).cancel_payment_intent(
        key=call.key, intent_id=op.provider_reference
    )
    _record_call(call, result)
    if (
        result.classification != Classification.OK
        or result.object is None
        or not result.object.canceled
    ):
        raise DomainError(
            ErrorCode.CANCEL_FAILED,
            "The provider did not confirm the cancel; the payment stays unknown.",
            status=502,
            purchase=op.purchase_id,
            operation=op.id,
            owner=Owner.SUPPORT,
        )
    with transaction.atomic():
        purchase, locked = _lock_or_404(operation_id)
        outcome_apply_locked(
            purchase,
            locked,
            Outcome.FAILED,
            grade=Grade.CONFIRMED,
            verification=Verification.PROVIDER,
            cause="cancelled_unapplied",
            actor=actor,
            evidence={"reason": reason, **result.object.safe_fields()},
            reason=Reason.PROVIDER_CANCELED,
            obj=result.object,
        )
        operation_audit_write(
            actor=actor,
            action="operation_cancel_unapplied",
            op=locked,
            reason=reason,
            detail={"provider_status": result.object.status},
        )
    return PaymentOperation.objects.select_related("purchase").get(id=operation_id)


def _created_unanswered(op: PaymentOperation) -> bool:
    """A two-step card payment whose create was sent and never answered (its worker died
    meanwhile): the provider may hold its PaymentIntent, so it is swept to `unknown` and
    read back (`_created_unconfirmed`), not to `failed` beside a payable PaymentIntent."""
    return (
        not op.provider_reference
        and rail_evidence_for(op.rail) is None
        and op.provider_calls.filter(purpose=CallPurpose.DISPATCH, step=CallStep.CREATE)
        .exclude(
            classification__in=(
                Classification.DECLINED,
                Classification.REJECTED,
                Classification.NOT_SENT,
                Classification.RETRYABLE,
            )
        )
        .exists()
    )


def operations_sweep_dead_dispatches() -> int:
    """A dispatch with no recorded outcome past its lease: its worker died. Never resend:
    confirm claimed, or a create sent and never answered -> unknown (reconcile); confirm
    never claimed otherwise -> failed not_confirmed.

    A live worker keeps its lease: an x402 refund waiting for the signer's lock renews it
    between wait slices, so only a worker that stopped renewing is swept.
    Sweeping a worker that is alive after all is still safe: its next step is a
    compare-and-set on `dispatching` under this row lock, so it signs and sends nothing
    once swept (payments.services.dispatch._x402_refund_keep_claim)."""
    count = 0
    stale = PaymentOperation.objects.filter(
        outcome=Outcome.DISPATCHING, dispatch_deadline__lt=timezone.now()
    )
    for op_id, purchase_id in list(stale.values_list("id", "purchase_id")[:500]):
        with transaction.atomic():
            purchase = lock_purchase(purchase_id)
            op = lock_operation(op_id)
            if (
                op.outcome != Outcome.DISPATCHING
                or op.dispatch_deadline is None  # never matched the query's deadline__lt
                or op.dispatch_deadline >= timezone.now()
            ):
                continue
            never_confirmed = (
                op.kind in PAYMENT_KINDS
                and op.confirm_claimed_at is None
                and not _created_unanswered(op)
            )
            target = Outcome.FAILED if never_confirmed else Outcome.UNKNOWN
            outcome_apply_locked(
                purchase,
                op,
                target,
                grade=Grade.CONFIRMED if never_confirmed else Grade.NONE,
                verification=Verification.UNVERIFIED,
                cause="dead_dispatch",
                actor="sweeper",
                evidence={},
                reason=Reason.NOT_CONFIRMED if never_confirmed else "",
            )
            count += 1
    return count


def operations_verify_before_follow_up(*, purchase_id: str) -> None:
    """Before a follow-up money movement (`retry_of`, capture, void, refund): read back
    every money-moving operation of the purchase whose outcome is only a person's
    (acknowledged) and apply what the provider shows — an on-the-fly reconcile, as Kill
    Bill's janitor does. The follow-up's own checks then see the provider's truth.
    No transaction may be open (network I/O)."""
    # Refunds too: a refund a person called failed may have
    # been paid back all the same; read before another refund is asked. A refund finance
    # declined was never sent: nothing to read.
    ids = list(
        PaymentOperation.objects.filter(
            purchase_id=purchase_id,
            grade=Grade.ACKNOWLEDGED,
            outcome__in=[Outcome.SUCCEEDED, Outcome.FAILED],
            kind__in=[
                *PAYMENT_KINDS,
                OperationKind.CAPTURE,
                OperationKind.VOID,
                OperationKind.REFUND,
            ],
        )
        .exclude(reason=Reason.REFUND_DECLINED)
        .values_list("id", flat=True)
    )
    if not ids:
        return  # nothing only a person settled: no read needed
    assert_outside_transaction()
    for op_id in ids:
        try:
            operation_reconcile(operation_id=op_id, actor="follow-up-check")
        except DomainError:
            continue


def operation_replay(
    *,
    operation_id: str,
    actor: str,
    acting_client: ApiClient | None = None,
    acting_user: User | None = None,
) -> PaymentOperation:
    """Resend the last write with the same provider key: only where the provider dedupes
    keys (Stripe does, within its window; localstripe does not)."""
    op = PaymentOperation.objects.filter(id=operation_id).first()
    if op is None:
        raise DomainError(ErrorCode.NOT_FOUND, "No such operation.", status=404)
    if (acting_client is not None and op.requested_by_client_id == acting_client.id) or (
        acting_user is not None and op.requested_by_user_id == acting_user.id
    ):
        raise DomainError(
            ErrorCode.REPLAYER_IS_REQUESTER,
            "The requester cannot replay its own operation.",
            status=403,
            operation=op.id,
            purchase=op.purchase_id,
        )
    if not provider_for(op).dedupes_idempotency_keys():
        raise DomainError(
            ErrorCode.REPLAY_UNSUPPORTED,
            "This provider does not deduplicate "
            "idempotency keys, so a replay could charge twice. Reconcile "
            "instead.",
            status=409,
            retry=RetryAdvice.FORBIDDEN,
            owner=Owner.RECONCILIATION,
            operation=op.id,
            purchase=op.purchase_id,
        )
    if op.outcome != Outcome.UNKNOWN:
        raise DomainError(
            ErrorCode.NOT_REPLAYABLE,
            "Only an unknown operation can be replayed.",
            status=409,
            operation=op.id,
            purchase=op.purchase_id,
        )
    if op.created_at < timezone.now() - timedelta(hours=23):
        raise DomainError(
            ErrorCode.REPLAY_WINDOW_CLOSED,
            "The provider's idempotency window is over.",
            status=409,
            operation=op.id,
            purchase=op.purchase_id,
        )
    # With a deduplicating provider, the same key returns the original result: a read.
    return operation_reconcile(operation_id=op.id, actor=actor)
