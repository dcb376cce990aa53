"""Console actions: each checks the role, calls the owning app's service and writes its
console audit row (actor, IP, reason, before, after) in the same transaction.

The owning services (payments, recovery.halts, webhooks) may write their own domain
audit row too; the console row adds what only the console knows (the request's IP and
the before/after snapshot a person saw). Actions that call the provider
(reconcile, replay, dispatch after approval) do that network I/O outside any
transaction, as every provider call in Verity does, and audit in their own
transaction right after.
"""

from __future__ import annotations

import logging
import secrets
import unicodedata
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core import signing
from django.core.exceptions import ObjectDoesNotExist
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import services as audit_services
from audit.actions import AuditAction
from events import selectors as event_selectors
from events import services as event_services
from payments.enums import Outcome
from payments.errors import DomainError
from payments.models import PaymentOperation, Purchase
from payments.money import format_money
from payments.services import (
    operation_cancel_unapplied,
    operation_dispatch,
    operation_overturn_review,
    operation_reconcile,
    operation_replay,
    operation_resolve_manual,
    operations_verify_before_follow_up,
    purchase_cancel,
    refund_approve,
    refund_decline,
    refund_request,
    void_create,
)
from payments.services.external import external_operation_review
from recovery import halts
from recovery import services as recovery_services
from recovery.models import WorkflowHalt
from support.access import Action, require
from support.models import (
    AuditEntry,
    FormSubmission,
    Incident,
    IncidentItem,
    IncidentOutcome,
    IncidentStatus,
    LoginFailure,
    Note,
)
from webhooks import services as webhook_services
from webhooks.models import ProviderEvent

log = logging.getLogger(__name__)

LOGIN_FAILURE_WINDOW_SECONDS = 15 * 60
LOGIN_FAILURES_PER_IP = 20
LOGIN_FAILURES_PER_USERNAME = 5


@dataclass
class ConsoleError(Exception):
    """A refusal shown to the console user (never a stack trace)."""

    code: str
    message: str
    status: int = 409

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


# -------------------------------------------------------------- one-time form tokens
# A console form that moves money makes its effect once
# (docs/console.md#one-submission-per-form): the page carries a token minted when it was rendered;
# the action consumes it
# in the transaction that makes the effect. A double click, a resent POST or two tabs of
# the same page are one submission: the later ones are shown the first one's result.

FORM_TOKEN_SALT = "console-form-once"
FORM_TOKEN_MAX_AGE_SECONDS = 12 * 3600


class FormAlreadySubmitted(ConsoleError):
    """This form's effect was made already (shown as information, not as a refusal)."""

    def __init__(self, message: str) -> None:
        super().__init__("already_submitted", message, 200)


def form_token_mint(user) -> str:
    """A one-time token for one rendering of a form, signed and bound to `user`: nothing
    is stored until it is used (a page view writes nothing)."""
    return signing.dumps({"n": secrets.token_urlsafe(18), "u": user.pk}, salt=FORM_TOKEN_SALT)


def _form_token_present(token: str | None) -> None:
    """A form whose page always carries its one-time token came without it."""
    if not token:
        raise ConsoleError(
            "form_token_missing",
            "This form came without its one-time token: reload the page and submit it again.",
            400,
        )


def _form_nonce(token: str | None, user) -> str | None:
    if not token:
        return None
    try:
        data = signing.loads(token, salt=FORM_TOKEN_SALT, max_age=FORM_TOKEN_MAX_AGE_SECONDS)
    except signing.SignatureExpired:
        raise ConsoleError(
            "form_expired", "This form is too old: reload the page and submit it again.", 409
        ) from None
    except signing.BadSignature:
        raise ConsoleError(
            "form_token_invalid",
            "This form's one-time token is not valid: reload the page and submit it again.",
            400,
        ) from None
    if data.get("u") != user.pk:
        raise ConsoleError(
            "form_token_invalid",
            "This form was rendered for another user: reload the page and submit it again.",
            400,
        )
    return str(data["n"])[:64]


def _first_result(row: FormSubmission) -> str:
    if row.result_type == "operation":
        op = PaymentOperation.objects.filter(pk=row.result_id).first()
        if op is not None:
            amount = format_money(op.amount, op.currency)
            return (
                f"This form was already submitted: {op.kind} {op.pk} of {amount} is "
                f"{op.outcome.replace('_', ' ')}. Nothing new was requested."
            )
    if row.result_type == "purchase":
        purchase = Purchase.objects.filter(pk=row.result_id).first()
        if purchase is not None:
            return (
                f"This form was already submitted: purchase {purchase.pk} is "
                f"{purchase.status.replace('_', ' ')}. Nothing new was done."
            )
    return (
        "This form was already submitted (its result is on its way); nothing new was "
        "done. Reload the page to see it."
    )


def _form_claim(nonce: str | None, *, user, action: str, target_id: str) -> None:
    """Inside the transaction that makes the effect: the form's nonce, once. A concurrent
    second submission waits on the unique index until the first commits, then is refused
    with the first one's result (FormAlreadySubmitted); if the first rolled back, the
    second goes ahead."""
    if nonce is None:
        return
    try:
        with transaction.atomic():
            FormSubmission.objects.create(
                nonce=nonce, user=user, action=action, target_id=target_id
            )
    except IntegrityError:
        raise FormAlreadySubmitted(_first_result(FormSubmission.objects.get(nonce=nonce))) from None


def _form_result(nonce: str | None, changed) -> None:
    """What the form made, for a later submission of it to show."""
    if nonce is None or changed is None:
        return
    FormSubmission.objects.filter(nonce=nonce).update(
        result_type="purchase" if isinstance(changed, Purchase) else "operation",
        result_id=changed.pk,
    )


def _form_release(nonce: str | None) -> None:
    """The action was refused before any effect: the same form may be corrected and sent
    again."""
    if nonce is not None:
        FormSubmission.objects.filter(nonce=nonce, result_id="").delete()


def _reason_required(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise ConsoleError("reason_required", "A reason is required.", 422)
    return reason[:2000]


def _op_snapshot(op: PaymentOperation | None) -> dict:
    if op is None:
        return {}
    return {
        "outcome": op.outcome,
        "stage": op.stage,
        "grade": op.grade,
        "verification": op.verification,
        "reason": op.reason,
        "next_action_owner": op.next_action_owner,
    }


def _purchase_snapshot(purchase: Purchase | None) -> dict:
    return {"status": purchase.status} if purchase is not None else {}


def _reload_op(operation_id: str) -> PaymentOperation:
    return PaymentOperation.objects.get(pk=operation_id)


def audit_write(
    *,
    user,
    action: str,
    target_type: str,
    target_id: str,
    reason: str,
    purchase_id: str = "",
    ip: str | None = None,
    before: dict | None = None,
    after: dict | None = None,
    detail: dict | None = None,
) -> AuditEntry:
    """Append one audit row. Must run inside the caller's transaction (same commit as
    the change it records)."""
    return audit_services.audit_write(
        actor=user.get_username(),
        action=action,
        target_type=target_type,
        target_id=target_id,
        purchase_id=purchase_id,
        reason=reason,
        ip=ip,
        before=before,
        after=after,
        detail=detail,
    )


@contextmanager
def _core_refusals_audited(
    *,
    user,
    ip: str | None,
    action: str,
    target_type: str,
    target_id: str,
    reason: str,
    purchase_id: str,
):
    """A refusal from the core (DomainError) is audited as `<action>.refused`, with the
    IP, and shown to the console as a ConsoleError."""
    try:
        yield
    except DomainError as e:
        _audit_refusal(
            user=user,
            action=action,
            target_type=target_type,
            target_id=target_id,
            reason=reason,
            purchase_id=purchase_id,
            ip=ip,
            code=e.code,
        )
        raise ConsoleError(e.code, e.message, e.status) from e


def _audit_refusal(
    *,
    user,
    action: str,
    target_type: str,
    target_id: str,
    reason: str,
    purchase_id: str,
    ip: str | None,
    code: str,
) -> None:
    # A refused manual action is still a console action worth knowing about (e.g. a
    # requester trying to resolve their own operation).
    with transaction.atomic():
        audit_write(
            user=user,
            action=f"{action}.refused",
            target_type=target_type,
            target_id=target_id,
            reason=reason or "(none)",
            purchase_id=purchase_id,
            ip=ip,
            detail={"code": code},
        )


# ------------------------------------------------------------------------- notes


def note_add(*, purchase_id: str, user, body: str, ip: str | None = None) -> Note:
    require(user, Action.ADD_NOTE)
    body = _reason_required(body)
    with transaction.atomic():
        purchase = Purchase.objects.filter(pk=purchase_id).first()
        if purchase is None:
            raise ConsoleError("not_found", "No such purchase.", 404)
        note = Note.objects.create(purchase_id=purchase_id, author=user, body=body)
        audit_write(
            user=user,
            action=AuditAction.CONSOLE_NOTE_ADD,
            target_type="purchase",
            target_id=purchase_id,
            purchase_id=purchase_id,
            reason=body,
            ip=ip,
            after={"note": note.pk},
        )
    return note


# ------------------------------------------------- operation and purchase actions


def _op_or_404(operation_id: str) -> PaymentOperation:
    op = PaymentOperation.objects.filter(pk=operation_id).first()
    if op is None:
        raise ConsoleError("not_found", "No such operation.", 404)
    return op


def _snapshot(obj: Any) -> dict:
    if isinstance(obj, Purchase):
        return _purchase_snapshot(obj)
    return _op_snapshot(obj)


def _snapshot_with_purchase(obj: Any) -> dict:
    """An operation's snapshot and its purchase's status (what a resolution also moves)."""
    if isinstance(obj, Purchase):
        return _purchase_snapshot(obj)
    return {**_op_snapshot(obj), **_purchase_snapshot(Purchase.objects.get(pk=obj.purchase_id))}


def _console_action_begin(
    *, user, permission: Action, reason: str, form_token: str | None
) -> tuple[str, str | None]:
    """Check the role, ask for a reason, read the form's one-time token: the reason and
    the form's nonce (support.services.form_token_mint)."""
    require(user, permission)
    reason = _reason_required(reason)
    return reason, _form_nonce(form_token, user)


@dataclass
class _ConsoleAction:
    """One console action on an operation or a purchase, under way: who acts and why, on
    what, what it was before, and how its audit row shows what it changed. The audit row
    names what changed: the operation the action created or changed, else the purchase.
    The form's effect is made once: its nonce is claimed with the change."""

    user: Any
    ip: str | None
    action: str
    reason: str
    nonce: str | None
    operation_id: str
    purchase_id: str
    was: dict
    snapshot: Callable[[Any], dict] = _snapshot
    after: Callable[[Any], dict] | None = None

    @property
    def target_id(self) -> str:
        return self.operation_id or self.purchase_id

    def refusals_audited(self):
        """A refusal from the core is audited as `<action>.refused` and shown as a
        ConsoleError."""
        return _core_refusals_audited(
            user=self.user,
            ip=self.ip,
            action=self.action,
            target_type="operation" if self.operation_id else "purchase",
            target_id=self.target_id,
            reason=self.reason,
            purchase_id=self.purchase_id,
        )

    def claim_form(self) -> None:
        _form_claim(self.nonce, user=self.user, action=self.action, target_id=self.target_id)

    def record(self, changed) -> None:
        """The console audit row (actor, IP, reason, before, after) and the form's result,
        in the transaction of the change."""
        audit_write(
            user=self.user,
            action=self.action,
            target_type="purchase" if isinstance(changed, Purchase) else "operation",
            target_id=changed.pk,
            purchase_id=self.purchase_id,
            reason=self.reason,
            ip=self.ip,
            before=self.was,
            after=self.after(changed) if self.after else self.snapshot(changed),
        )
        _form_result(self.nonce, changed)


def _on_operation(
    *,
    user,
    ip: str | None,
    action: str,
    reason: str,
    nonce: str | None,
    operation_id: str,
    requester_refused: tuple[str, str] | None = None,
    snapshot: Callable[[Any], dict] = _snapshot,
    before: Callable[[Any], dict] | None = None,
    after: Callable[[Any], dict] | None = None,
) -> _ConsoleAction:
    """The operation acted on (404 if gone), snapshotted. `requester_refused` (code,
    message): the person who requested it may not take this action."""
    target = _op_or_404(operation_id)
    if requester_refused and target.requested_by_user_id == user.pk:
        # Checked here as well as in the core so the refusal is audited with the IP.
        code, message = requester_refused
        _audit_refusal(
            user=user,
            action=action,
            target_type="operation",
            target_id=operation_id,
            reason=reason,
            purchase_id=target.purchase_id,
            ip=ip,
            code=code,
        )
        raise ConsoleError(code, message, 403)
    return _ConsoleAction(
        user=user,
        ip=ip,
        action=action,
        reason=reason,
        nonce=nonce,
        operation_id=operation_id,
        purchase_id=target.purchase_id,
        was=before(target) if before else snapshot(target),
        snapshot=snapshot,
        after=after,
    )


def _on_purchase(
    *,
    user,
    ip: str | None,
    action: str,
    reason: str,
    nonce: str | None,
    purchase_id: str,
    after: Callable[[Any], dict] | None = None,
) -> _ConsoleAction:
    """The purchase acted on (404 if gone), snapshotted."""
    target = Purchase.objects.filter(pk=purchase_id).first()
    if target is None:
        raise ConsoleError("not_found", "No such purchase.", 404)
    return _ConsoleAction(
        user=user,
        ip=ip,
        action=action,
        reason=reason,
        nonce=nonce,
        operation_id="",
        purchase_id=purchase_id,
        was=_snapshot(target),
        after=after,
    )


def _operation_decided_by_user(
    *,
    user,
    ip: str | None,
    permission: Action,
    action: str,
    reason: str,
    operation_id: str,
    act: Callable[[str], object],
    form_token: str | None = None,
    requester_refused: tuple[str, str] | None = None,
    before: Callable[[Any], dict] | None = None,
    after: Callable[[Any], dict] | None = None,
) -> PaymentOperation:
    """A person's decision on an operation: the core's change (`act(reason)`) and the
    console row commit in one transaction here."""
    reason, nonce = _console_action_begin(
        user=user, permission=permission, reason=reason, form_token=form_token
    )
    acting = _on_operation(
        user=user,
        ip=ip,
        action=action,
        reason=reason,
        nonce=nonce,
        operation_id=operation_id,
        requester_refused=requester_refused,
        before=before,
        after=after,
    )
    with acting.refusals_audited(), transaction.atomic():
        acting.claim_form()
        act(reason)
        changed = _reload_op(operation_id)
        acting.record(changed)
    return changed


def _operation_sent_by_user(
    *,
    user,
    ip: str | None,
    permission: Action,
    action: str,
    reason: str,
    operation_id: str,
    act: Callable[[str], object],
    form_token: str | None = None,
    snapshot: Callable[[Any], dict] = _snapshot,
) -> PaymentOperation:
    """An action whose core calls the provider (`act(reason)`, network I/O): it runs
    outside any transaction, the console row commits after it. The form is claimed just
    before the call and released if the action is refused."""
    reason, nonce = _console_action_begin(
        user=user, permission=permission, reason=reason, form_token=form_token
    )
    acting = _on_operation(
        user=user,
        ip=ip,
        action=action,
        reason=reason,
        nonce=nonce,
        operation_id=operation_id,
        snapshot=snapshot,
    )
    with acting.refusals_audited():
        with transaction.atomic():
            acting.claim_form()
        try:
            act(reason)  # network I/O: outside any transaction
        except DomainError:
            _form_release(nonce)
            raise
        with transaction.atomic():
            changed = _reload_op(operation_id)
            acting.record(changed)
    return changed


def _purchase_changed_by_user(
    *,
    user,
    ip: str | None,
    permission: Action,
    action: str,
    reason: str,
    purchase_id: str,
    act: Callable[[str], Any],
    form_token: str | None = None,
) -> Any:
    """A person's change to a purchase: the core's change (`act(reason)`, which answers
    the purchase or the operation it created) and the console row commit in one
    transaction here."""
    reason, nonce = _console_action_begin(
        user=user, permission=permission, reason=reason, form_token=form_token
    )
    acting = _on_purchase(
        user=user, ip=ip, action=action, reason=reason, nonce=nonce, purchase_id=purchase_id
    )
    with acting.refusals_audited(), transaction.atomic():
        acting.claim_form()
        changed = act(reason)
        acting.record(changed)
    return changed


def _follow_up_by_user(
    *,
    user,
    ip: str | None,
    permission: Action,
    action: str,
    reason: str,
    purchase_id: str,
    act: Callable[[str], PaymentOperation],
    form_token: str | None = None,
    after: Callable[[Any], dict] | None = None,
) -> PaymentOperation:
    """A new money movement on a purchase (a refund, a void): every payment of it only a
    person settled is read back from the provider first (network, outside any
    transaction), then the core creates the operation (`act(reason)`) and the console row
    commits with it."""
    reason, nonce = _console_action_begin(
        user=user, permission=permission, reason=reason, form_token=form_token
    )
    acting = _on_purchase(
        user=user,
        ip=ip,
        action=action,
        reason=reason,
        nonce=nonce,
        purchase_id=purchase_id,
        after=after,
    )
    with acting.refusals_audited():
        operations_verify_before_follow_up(purchase_id=purchase_id)
        with transaction.atomic():
            acting.claim_form()
            changed = act(reason)
            acting.record(changed)
    return changed


def _dispatch_after_commit(op: PaymentOperation, what: str) -> PaymentOperation:
    # The provider call happens after commit, outside any transaction; if this process
    # dies here the pending operation is picked up like any queued one.
    try:
        return operation_dispatch(operation_id=op.pk)
    except DomainError as e:
        log.warning("%s dispatch refused: op=%s code=%s", what, op.pk, e.code)
        return _reload_op(op.pk)


def operation_reconcile_by_user(
    *, operation_id: str, user, reason: str, ip: str | None = None
) -> PaymentOperation:
    """Read the provider back now (read-only at the provider)."""
    return _operation_sent_by_user(
        user=user,
        ip=ip,
        permission=Action.RECONCILE,
        action=AuditAction.CONSOLE_RECONCILE,
        reason=reason,
        operation_id=operation_id,
        act=lambda reason: operation_reconcile(
            operation_id=operation_id, actor=user.get_username()
        ),
    )


def operation_resolve_by_user(
    *,
    operation_id: str,
    outcome: str,
    user,
    reason: str,
    ip: str | None = None,
    form_token: str | None = None,
) -> PaymentOperation:
    """Manual resolution (grade acknowledged, verification manual); never by the person
    or client that requested the operation (the core refuses `resolver_is_requester`).
    The core reads the provider back first (outside any transaction), then records the
    console row inside its resolving transaction: the row commits with the resolution."""

    reason, nonce = _console_action_begin(
        user=user, permission=Action.RESOLVE, reason=reason, form_token=form_token
    )
    if outcome not in (Outcome.SUCCEEDED, Outcome.FAILED):
        raise ConsoleError("invalid_outcome", "Resolve as succeeded or failed.", 422)
    acting = _on_operation(
        user=user,
        ip=ip,
        action=AuditAction.CONSOLE_RESOLVE,
        reason=reason,
        nonce=nonce,
        operation_id=operation_id,
        requester_refused=(
            "resolver_is_requester",
            "The person who requested an operation cannot resolve it.",
        ),
        snapshot=_snapshot_with_purchase,
    )

    def record(resolved) -> None:  # inside the core's resolving transaction
        acting.claim_form()
        acting.record(_reload_op(operation_id))

    with acting.refusals_audited():
        operation_resolve_manual(
            operation_id=operation_id,
            outcome=outcome,
            reason=reason,
            actor=user.get_username(),
            acting_user=user,
            audit=False,
            bind=record,
        )
    return _reload_op(operation_id)


def operation_replay_by_user(
    *, operation_id: str, user, reason: str, ip: str | None = None, form_token: str | None = None
) -> PaymentOperation:
    """Resend with the same provider key (only where the provider dedupes keys)."""
    return _operation_sent_by_user(
        form_token=form_token,
        user=user,
        ip=ip,
        permission=Action.REPLAY,
        action=AuditAction.CONSOLE_REPLAY,
        reason=reason,
        operation_id=operation_id,
        act=lambda reason: operation_replay(
            operation_id=operation_id, actor=user.get_username(), acting_user=user
        ),
    )


def operation_cancel_unapplied_by_user(
    *, operation_id: str, user, reason: str, ip: str | None = None, form_token: str | None = None
) -> PaymentOperation:
    """ "Cancel at the provider and mark failed" for a confirm the provider never applied:
    a write (the provider call runs outside any transaction), audited with its reason,
    refused (and the refusal audited) if the provider applied it or the cancel fails."""
    return _operation_sent_by_user(
        form_token=form_token,
        user=user,
        ip=ip,
        permission=Action.RESOLVE,
        action=AuditAction.CONSOLE_CANCEL_UNAPPLIED,
        reason=reason,
        operation_id=operation_id,
        snapshot=_snapshot_with_purchase,
        act=lambda reason: operation_cancel_unapplied(
            operation_id=operation_id, reason=reason, actor=user.get_username()
        ),
    )


# ------------------------------------------------------------------------ refunds


def refund_request_by_user(
    *,
    purchase_id: str,
    user,
    reason: str,
    amount: int | None = None,
    ip: str | None = None,
    form_token: str | None = None,
) -> PaymentOperation:
    """A console refund starts awaiting_approval (docs/console.md#refund-approval)."""
    try:
        return _follow_up_by_user(
            form_token=form_token,
            user=user,
            ip=ip,
            permission=Action.REQUEST_REFUND,
            action=AuditAction.CONSOLE_REFUND_REQUEST,
            reason=reason,
            purchase_id=purchase_id,
            act=lambda reason: refund_request(
                purchase_id=purchase_id, amount=amount, acting_user=user
            ),
            after=lambda op: {**_op_snapshot(op), "amount": op.amount, "currency": op.currency},
        )
    except ConsoleError as e:
        refundable = getattr(e.__cause__, "extra", {}).get("refundable")
        if refundable is not None:
            # The core speaks minor units ("1500 usd"); people read major units.
            currency = Purchase.objects.get(pk=purchase_id).currency
            raise ConsoleError(
                e.code, f"Refundable now: {format_money(refundable, currency)}.", e.status
            ) from e.__cause__
        raise


def refund_request_confirmed_by_user(
    *,
    purchase_id: str,
    user,
    reason: str,
    amount: int,
    ip: str | None = None,
    form_token: str | None = None,
) -> PaymentOperation:
    """The refund page's confirm step (the amount echoed back): its page always carries a
    one-time token, so a submission without one is refused (it would move money twice if
    sent twice)."""
    require(user, Action.REQUEST_REFUND)
    _reason_required(reason)
    _form_token_present(form_token)
    return refund_request_by_user(
        purchase_id=purchase_id,
        user=user,
        reason=reason,
        amount=amount,
        ip=ip,
        form_token=form_token,
    )


def refund_approve_by_user(
    *, operation_id: str, user, reason: str, ip: str | None = None, form_token: str | None = None
) -> PaymentOperation:
    """Finance approves a refund someone else requested, then it is dispatched."""
    op = _operation_decided_by_user(
        form_token=form_token,
        user=user,
        ip=ip,
        permission=Action.APPROVE_REFUND,
        action=AuditAction.CONSOLE_REFUND_APPROVE,
        reason=reason,
        operation_id=operation_id,
        requester_refused=(
            "approver_is_requester",
            "The person who requested a refund cannot approve it.",
        ),
        act=lambda reason: refund_approve(
            operation_id=operation_id, acting_user=user, reason=reason, audit=False
        ),
    )
    return _dispatch_after_commit(op, "refund after approval")


def refund_decline_by_user(
    *, operation_id: str, user, reason: str, ip: str | None = None, form_token: str | None = None
) -> PaymentOperation:
    """Finance declines a refund awaiting approval: nothing goes to the provider, and the
    refundable amount is free again. Any finance user may decline (the requester too: a
    decline moves no money)."""
    return _operation_decided_by_user(
        form_token=form_token,
        user=user,
        ip=ip,
        permission=Action.APPROVE_REFUND,
        action=AuditAction.CONSOLE_REFUND_DECLINE,
        reason=reason,
        operation_id=operation_id,
        act=lambda reason: refund_decline(
            operation_id=operation_id, reason=reason, actor=user.get_username(), acting_user=user
        ),
    )


def overturn_review_by_user(
    *, operation_id: str, user, reason: str, ip: str | None = None, form_token: str | None = None
) -> PaymentOperation:
    """Close a "manual resolution overturned" queue item after checking what followed."""
    return _operation_decided_by_user(
        form_token=form_token,
        user=user,
        ip=ip,
        permission=Action.RESOLVE,
        action=AuditAction.CONSOLE_OVERTURN_REVIEW,
        reason=reason,
        operation_id=operation_id,
        act=lambda reason: operation_overturn_review(
            operation_id=operation_id, actor=user.get_username(), reason=reason
        ),
    )


def void_by_user(
    *, purchase_id: str, user, reason: str, ip: str | None = None, form_token: str | None = None
) -> PaymentOperation:
    """An operator voids an authorization, also after fulfilment started (the API refuses
    that with `fulfilment_started`): the decision is recorded, the void is sent, and when
    the provider confirms it the purchase is `voided` and the order cancelled."""
    op = _follow_up_by_user(
        form_token=form_token,
        user=user,
        ip=ip,
        permission=Action.RESOLVE,
        action=AuditAction.CONSOLE_VOID,
        reason=reason,
        purchase_id=purchase_id,
        act=lambda reason: void_create(
            purchase_id=purchase_id, acting_user=user, after_fulfilment=True
        ),
    )
    return _dispatch_after_commit(op, "void")


def purchase_cancel_by_user(
    *, purchase_id: str, user, reason: str, ip: str | None = None, form_token: str | None = None
) -> Purchase:
    """Support cancels a purchase before any payment was claimed."""
    return _purchase_changed_by_user(
        form_token=form_token,
        user=user,
        ip=ip,
        permission=Action.REQUEST_REFUND,
        action=AuditAction.CONSOLE_CANCEL,
        reason=reason,
        purchase_id=purchase_id,
        act=lambda reason: purchase_cancel(
            purchase_id=purchase_id, acting_user=user, reason=reason
        ),
    )


# ------------------------------------------------------------- queue decisions


class StepDecision:
    """What a person decides for a step in the compensation queue."""

    RETRY = "retry"  # complete forward: run the step again (its cause is fixed)
    DONE = "done"  # mark handled: the step was done by hand outside Verity


def step_decide_by_user(
    *, purchase_id: str, step: str, decision: str, user, reason: str, ip: str | None = None
):
    """Complete a compensation-queue step forward or mark it handled. recovery's
    step_resolve writes the one audit row (with this IP) and resumes the purchase in the
    same transaction. Compensating instead is a refund request (finance approves)."""
    require(user, Action.DECIDE_STEP)
    reason = _reason_required(reason)
    if decision not in (StepDecision.RETRY, StepDecision.DONE):
        raise ConsoleError("invalid_decision", "Run the step again or mark it handled.", 422)
    try:
        return recovery_services.step_resolve(
            purchase_id=purchase_id,
            step=step,
            resolution=decision,
            actor=user.get_username(),
            reason=reason,
            ip=ip,
        )
    except ObjectDoesNotExist as e:
        raise ConsoleError("not_found", f"No step {step} on this purchase.", 404) from e
    except ValueError as e:
        raise ConsoleError("step_not_waiting", str(e), 409) from e


def discrepancy_explain_by_user(
    *, discrepancy_id: int, user, reason: str, ip: str | None = None
) -> bool:
    """Finance acknowledges a settlement discrepancy with its explanation and closes it
    (one audit row, written by recovery in the same transaction)."""
    require(user, Action.SETTLE_DISCREPANCY)
    reason = _reason_required(reason)
    try:
        closed = recovery_services.discrepancy_resolve(
            discrepancy_id=discrepancy_id, actor=user.get_username(), reason=reason, ip=ip
        )
    except ObjectDoesNotExist as e:
        raise ConsoleError("not_found", "No such discrepancy.", 404) from e
    if not closed:
        raise ConsoleError("already_closed", "Someone closed this discrepancy meanwhile.", 409)
    return closed


def outbox_retry_by_user(*, message_id: int, user, reason: str, ip: str | None = None):
    """An operator makes a stuck outbox row due now, after fixing its cause."""
    require(user, Action.RETRY_OUTBOX)
    reason = _reason_required(reason)
    try:
        return recovery_services.outbox_retry_now(
            message_id=message_id, actor=user.get_username(), reason=reason, ip=ip
        )
    except recovery_services.OutboxRetryRefused as e:
        raise ConsoleError("outbox_retry_refused", str(e), 409) from e


# -------------------------------------------------------------------------- halts


def halt_names() -> list[str]:
    return list(halts.valid_halt_names())


def _halt_change_by_user(
    *,
    name: str,
    user,
    reason: str,
    ip: str | None,
    action: str,
    halted: bool,
    change: Callable[[str], Any],
):
    """Set or clear a workflow halt with the console's one (richer) audit row, so
    recovery's own row is off (`audit=False` in `change`)."""
    require(user, Action.HALT)
    reason = _reason_required(reason)
    if name not in halt_names():
        raise ConsoleError("unknown_halt", f"Unknown workflow {name!r}.", 422)
    with transaction.atomic():
        before = {"halted": WorkflowHalt.objects.filter(name=name).exists()}
        try:
            result = change(reason)
        except ValueError as e:  # recovery.halts.HaltError
            raise ConsoleError("halt_refused", str(e), 422) from e
        audit_write(
            user=user,
            action=action,
            target_type="workflow_halt",
            target_id=name,
            reason=reason,
            ip=ip,
            before=before,
            after={"halted": halted},
        )
    return result


def halt_set_by_user(*, name: str, user, reason: str, ip: str | None = None) -> WorkflowHalt:
    return _halt_change_by_user(
        name=name,
        user=user,
        reason=reason,
        ip=ip,
        action=AuditAction.CONSOLE_HALT_SET,
        halted=True,
        change=lambda reason: halts.halt_set(
            name=name, reason=reason, actor=user.get_username(), audit=False
        ),
    )


def halt_clear_by_user(*, name: str, user, reason: str, ip: str | None = None) -> bool:
    return _halt_change_by_user(
        name=name,
        user=user,
        reason=reason,
        ip=ip,
        action=AuditAction.CONSOLE_HALT_CLEAR,
        halted=False,
        change=lambda reason: halts.halt_clear(
            name=name, actor=user.get_username(), reason=reason, audit=False
        ),
    )


# ------------------------------------------------------------ quarantine triage


def event_triage_by_user(*, event_pk: int, decision: str, user, reason: str, ip: str | None = None):
    """Release a quarantined event for processing again, or dismiss it."""
    require(user, Action.TRIAGE_QUARANTINE)
    reason = _reason_required(reason)
    if decision not in ("release", "dismiss"):
        raise ConsoleError("invalid_decision", "Release or dismiss.", 422)
    event = ProviderEvent.objects.filter(pk=event_pk).first()
    if event is None:
        raise ConsoleError("not_found", "No such event.", 404)
    fn = getattr(webhook_services, f"event_quarantine_{decision}")
    try:
        # webhooks.services locks the event, changes it and writes the audit row (with
        # this request's IP, before and after) in one transaction.
        return fn(event_id=event_pk, acting_user=user, reason=reason, ip=ip)
    except DomainError as e:
        raise ConsoleError(e.code, e.message, e.status) from e


# ------------------------------------------------------------------ login limits


def login_username_key(username: str) -> str:
    """The username as the login form authenticates it (stripped, NFKC — Django's
    UsernameField), casefolded: `"olga "`, `" olga"` and fullwidth `ｏlga` are one name
    for the lockout, so variants do not each get fresh tries."""
    return unicodedata.normalize("NFKC", (username or "").strip()).casefold()[:150]


def login_failure_record(*, ip: str | None, username: str) -> None:
    LoginFailure.objects.create(ip=ip or None, username=login_username_key(username))
    # Keep the table small: rows older than a day no longer count for anything.
    LoginFailure.objects.filter(created_at__lt=timezone.now() - timedelta(days=1)).delete()


def login_lockout_seconds(*, ip: str | None, username: str) -> int:
    """0 when a login may be tried; else how long until the oldest counted failure leaves
    the window (the lockout message and Retry-After say so)."""
    now = timezone.now()
    since = now - timedelta(seconds=LOGIN_FAILURE_WINDOW_SECONDS)
    recent = LoginFailure.objects.filter(created_at__gte=since)
    key = login_username_key(username)
    waits = []
    for rows, limit in (
        (recent.filter(ip=ip) if ip else None, LOGIN_FAILURES_PER_IP),
        (recent.filter(username=key) if key else None, LOGIN_FAILURES_PER_USERNAME),
    ):
        if rows is None:
            continue
        times = list(rows.order_by("-created_at").values_list("created_at", flat=True)[:limit])
        if len(times) >= limit:
            # The limit-th most recent failure must leave the window before a try counts.
            waits.append((times[-1] - since).total_seconds())
    return max(1, int(max(waits)) + 1) if waits else 0


def login_is_throttled(*, ip: str | None, username: str) -> bool:
    return login_lockout_seconds(ip=ip, username=username) > 0


# --------------------------------------------------------------------- incidents


def _incident_locked(incident_id) -> Incident:
    incident = Incident.objects.select_for_update().filter(pk=incident_id).first()
    if incident is None:
        raise ConsoleError("not_found", "No such incident.", 404)
    return incident


def _incident_open_or_refuse(incident) -> None:
    if incident.status != IncidentStatus.OPEN:
        raise ConsoleError("incident_closed", "This incident is closed.", 409)


def incident_open(*, user, title: str, reason: str, ip: str | None = None):
    """Open an incident; `reason` is its summary (what is happening, what is affected)."""
    require(user, Action.MANAGE_INCIDENTS)
    summary = _reason_required(reason)
    title = (title or "").strip()[:200]
    if not title:
        raise ConsoleError("title_required", "An incident needs a title.", 422)
    with transaction.atomic():
        incident = Incident.objects.create(title=title, summary=summary, opened_by=user)
        audit_write(
            user=user,
            action=AuditAction.INCIDENT_OPEN,
            target_type="incident",
            target_id=str(incident.pk),
            reason=summary,
            ip=ip,
            after={"status": incident.status, "title": title},
        )
    return incident


def incident_attach(*, incident_id: int, ref: str, user, reason: str, ip: str | None = None):
    """Attach a purchase (`pur_…`) or an operation (`op_…`, attaches its purchase too)."""
    require(user, Action.MANAGE_INCIDENTS)
    reason = _reason_required(reason)
    ref = (ref or "").strip()
    with transaction.atomic():
        incident = _incident_locked(incident_id)
        _incident_open_or_refuse(incident)
        operation_id = ""
        if ref.startswith("op_"):
            op = PaymentOperation.objects.filter(pk=ref).first()
            if op is None:
                raise ConsoleError("not_found", f"No operation {ref}.", 404)
            purchase_id, operation_id = op.purchase_id, op.pk
        elif Purchase.objects.filter(pk=ref).exists():
            purchase_id = ref
        else:
            raise ConsoleError(
                "not_found", "Give a purchase id (pur_…) or an operation id (op_…).", 404
            )
        item, created = IncidentItem.objects.get_or_create(
            incident=incident,
            purchase_id=purchase_id,
            operation_id=operation_id,
            defaults={"attached_by": user},
        )
        if not created:
            raise ConsoleError("already_attached", f"{ref} is already attached.", 409)
        audit_write(
            user=user,
            action=AuditAction.INCIDENT_ATTACH,
            target_type="incident",
            target_id=str(incident.pk),
            purchase_id=purchase_id,
            reason=reason,
            ip=ip,
            after={"purchase": purchase_id, "operation": operation_id},
        )
    return item


def incident_halt(*, incident_id: int, name: str, user, reason: str, ip: str | None = None):
    """Pause a workflow from the incident (recovery.halts.halt_set) and remember it there.

    Needs both MANAGE_INCIDENTS and HALT. One audit row (the incident's); recovery's own
    row is suppressed with audit=False."""
    require(user, Action.MANAGE_INCIDENTS)
    require(user, Action.HALT)
    reason = _reason_required(reason)
    if name not in halt_names():
        raise ConsoleError("unknown_halt", f"Unknown workflow {name!r}.", 422)
    with transaction.atomic():
        incident = _incident_locked(incident_id)
        _incident_open_or_refuse(incident)
        before = {"halted": WorkflowHalt.objects.filter(name=name).exists()}
        try:
            halt = halts.halt_set(
                name=name,
                reason=f"incident {incident.pk}: {reason}",
                actor=user.get_username(),
                audit=False,
            )
        except halts.HaltError as e:
            raise ConsoleError("halt_refused", str(e), 422) from e
        if name not in incident.halts:
            incident.halts = [*incident.halts, name]
            incident.save(update_fields=["halts"])
        audit_write(
            user=user,
            action=AuditAction.INCIDENT_HALT_SET,
            target_type="incident",
            target_id=str(incident.pk),
            reason=reason,
            ip=ip,
            before=before,
            after={"halted": True},
            detail={"halt": name},
        )
    return halt


def incident_close(
    *, incident_id: int, outcomes: dict[str, str], user, reason: str, ip: str | None = None
):
    """Close with the final outcome of every attached purchase and a short review
    (`reason`). Refused while a halt set from this incident is still on: resume it (or
    decide to keep it, from the Halts page, under its own audit row) first."""
    require(user, Action.MANAGE_INCIDENTS)
    review = _reason_required(reason)
    with transaction.atomic():
        incident = _incident_locked(incident_id)
        _incident_open_or_refuse(incident)
        still_on = sorted(
            WorkflowHalt.objects.filter(name__in=incident.halts).values_list("name", flat=True)
        )
        if still_on:
            raise ConsoleError(
                "halts_still_on",
                "Halts set from this incident are still on: "
                f"{', '.join(still_on)}. Resume them first.",
                409,
            )
        items = list(incident.items.select_for_update().order_by("id"))
        valid = set(IncidentOutcome.values)
        final: dict[str, str] = {}
        for item in items:
            outcome = (outcomes or {}).get(item.purchase_id, "")
            if outcome not in valid:
                raise ConsoleError(
                    "outcome_required",
                    "Record the final outcome (completed "
                    f"forward, compensated or manual) for {item.purchase_id}.",
                    422,
                )
            final[item.purchase_id] = outcome
        for item in items:
            item.final_outcome = final[item.purchase_id]
            item.save(update_fields=["final_outcome"])
        for purchase_id, outcome in final.items():
            # One row per purchase too, so each purchase's timeline shows how it ended.
            audit_write(
                user=user,
                action=AuditAction.INCIDENT_OUTCOME,
                target_type="incident",
                target_id=str(incident.pk),
                purchase_id=purchase_id,
                reason=review,
                ip=ip,
                after={"final_outcome": outcome},
            )
        incident.status = IncidentStatus.CLOSED
        incident.closed_by = user
        incident.closed_at = timezone.now()
        incident.review = review
        incident.save(update_fields=["status", "closed_by", "closed_at", "review"])
        audit_write(
            user=user,
            action=AuditAction.INCIDENT_CLOSE,
            target_type="incident",
            target_id=str(incident.pk),
            reason=review,
            ip=ip,
            before={"status": IncidentStatus.OPEN},
            after={"status": IncidentStatus.CLOSED, "outcomes": final},
        )
    return incident


# ------------------------------------------------ operations made outside Verity


def external_review_by_user(
    *, operation_id: str, user, reason: str, ip: str | None = None
) -> PaymentOperation:
    """Finance reviews a refund/capture/cancel made at the provider, not by Verity."""
    return _operation_decided_by_user(
        user=user,
        ip=ip,
        permission=Action.REVIEW_EXTERNAL,
        action=AuditAction.CONSOLE_EXTERNAL_REVIEW,
        reason=reason,
        operation_id=operation_id,
        act=lambda reason: external_operation_review(
            operation_id=operation_id, acting_user=user, reason=reason
        ),
        before=lambda op: {"reviewed_at": None},
        after=lambda op: {"reviewed_by": op.reviewed_by},
    )


# ------------------------------------------------------------ storefront webhooks


def webhook_endpoint_enable_by_user(
    *, endpoint_id: str, enabled: bool, user, reason: str, ip: str | None = None
):
    """Turn a storefront's webhook endpoint on or off (its audit row is written by
    events.services in the same transaction)."""
    require(user, Action.MANAGE_WEBHOOKS)
    reason = _reason_required(reason)
    endpoint = event_selectors.endpoint_get(endpoint_id)
    if endpoint is None:
        raise ConsoleError("not_found", "No such webhook endpoint.", 404)
    return event_services.endpoint_update(
        endpoint=endpoint, enabled=enabled, reason=reason, actor=user.get_username()
    )


def webhook_delivery_resend_by_user(
    *, delivery_id: int, user, reason: str, ip: str | None = None
) -> None:
    require(user, Action.MANAGE_WEBHOOKS)
    reason = _reason_required(reason)
    delivery = event_selectors.delivery_get(delivery_id)
    if delivery is None:
        raise ConsoleError("not_found", "No such delivery.", 404)
    try:
        event_services.delivery_resend(delivery=delivery, actor=user.get_username(), reason=reason)
    except event_services.EndpointError as e:
        raise ConsoleError("resend_refused", str(e), 409) from None
