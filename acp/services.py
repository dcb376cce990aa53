"""ACP checkout-session writes: the only code that writes CheckoutSession rows. Each
keyed write goes through the core's ladder (payments.keyed.keyed_effect); the money
(purchase and payment) is written by payments.services, never here.

A session's keyed writes bind the key to the session (`RESOURCE`); `complete` names the
session's payment as the operation to dispatch, so a complete whose first request died is
resumed (its payment dispatched when still pending), never run again.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction
from django.utils import timezone

from payments import services
from payments.enums import Outcome
from payments.errors import DomainError, ErrorCode
from payments.keyed import Created, Keyed, KeyedRequest, keyed_effect
from payments.services.common import change_batch
from payments.services.requests import checkout_complete

from . import sessions
from .errors import AcpError
from .models import CheckoutSession
from .sessions import Status

RESOURCE = "acp_session"


def _locked(session_id: str) -> CheckoutSession:
    return CheckoutSession.objects.select_for_update().get(pk=session_id)


def _fresh(session_id: str) -> CheckoutSession:
    return CheckoutSession.objects.select_related("purchase__quote", "quote").get(pk=session_id)


def _session_payment(resource_type: str, session_id: str) -> str | None:
    """The operation a resumed complete dispatches: the session's latest payment."""
    if resource_type != RESOURCE:
        return None
    session = CheckoutSession.objects.select_related("purchase").get(pk=session_id)
    op = sessions.payment_op(session.purchase)
    return op.id if op is not None else None


def session_create(request: KeyedRequest, *, data: dict, answer=None) -> Keyed:
    def create() -> Created:
        session = CheckoutSession(
            api_client=request.api_client,
            currency=data["currency"].lower(),
            items=sessions.normalise_items(data["line_items"]),
            buyer=data.get("buyer"),
            fulfillment_details=data.get("fulfillment_details"),
        )
        sessions.reprice(session)
        session.save()
        return Created(RESOURCE, session.id)

    return keyed_effect(request, create=create, operation_for=_session_payment, answer=answer)


def session_update(request: KeyedRequest, *, session_id: str, data: dict, answer=None) -> Keyed:
    def create() -> Created:
        s = _locked(session_id)
        if s.purchase_id is not None or s.canceled_at is not None:
            raise AcpError(
                status=409,
                code=ErrorCode.SESSION_NOT_UPDATABLE,
                message="This session is "
                f"{sessions.session_status(_fresh(s.id))}; it can no "
                "longer be changed.",
            )
        if "line_items" in data:
            s.items = sessions.normalise_items(data["line_items"])
        if "buyer" in data:
            s.buyer = data["buyer"]
        if "fulfillment_details" in data:
            s.fulfillment_details = data["fulfillment_details"]
        if "selected_fulfillment_options" in data:
            s.selected_fulfillment_options = _selected_options(
                s, data["selected_fulfillment_options"]
            )
        # Every update reprices from the catalogue (prices and stock move).
        sessions.reprice(s)
        s.save()
        return Created(RESOURCE, s.id)

    return keyed_effect(request, create=create, operation_for=_session_payment, answer=answer)


def _selected_options(session: CheckoutSession, selected: list[dict]) -> list[dict]:
    offered = {
        o["id"]: o["type"]
        for o in sessions.fulfillment_options(sessions.products_for(session.items))
    }
    for index, option in enumerate(selected):
        if offered.get(option["option_id"]) != option["type"]:
            raise AcpError(
                status=400,
                code=ErrorCode.INVALID,
                param=f"$.selected_fulfillment_options[{index}]",
                message="No such fulfillment option for this session.",
            )
    return selected


def session_cancel(request: KeyedRequest, *, session_id: str, answer=None) -> Keyed:
    client = request.api_client

    def create() -> Created:
        s = _locked(session_id)
        status = sessions.session_status(_fresh(s.id))
        if status in (Status.COMPLETED, Status.IN_PROGRESS, Status.CANCELED, Status.EXPIRED):
            # After payment the refund path stays with people and the REST API.
            raise AcpError(
                status=405,
                code=ErrorCode.NOT_CANCELABLE,
                message=f"This session is {status}; it cannot be canceled.",
            )
        if s.purchase_id is not None:
            try:
                services.purchase_cancel(purchase_id=s.purchase_id, api_client=client)
            except DomainError as exc:
                raise AcpError(
                    status=405, code=ErrorCode.NOT_CANCELABLE, message=exc.message
                ) from None
        s.canceled_at = timezone.now()
        s.save()
        return Created(RESOURCE, s.id)

    return keyed_effect(request, create=create, operation_for=_session_payment, answer=answer)


def _requote_if_expired(session_id: str) -> None:
    """A quote lives 30 minutes; an agent may complete later. Reprice first: the same
    amount goes on; another amount is shown to the agent, never charged unseen."""
    with transaction.atomic():
        s = _locked(session_id)
        if s.purchase_id is not None:
            return  # its purchase carries its own (accepted) quote
        if s.quote is None or sessions.item_problems(s):
            raise AcpError(
                status=409,
                code=ErrorCode.SESSION_NOT_READY,
                message="This session is not ready for payment: see its messages.",
            )
        if s.quote.expires_at > timezone.now():
            return
        amount = s.quote.amount
        sessions.reprice(s)
        s.save()
    if s.quote is None or s.quote.amount != amount:
        raise AcpError(
            status=409,
            code=ErrorCode.PRICE_CHANGED,
            message="Prices or stock changed since this session was priced; "
            "retrieve it and review the new totals.",
        )


def session_complete(
    request: KeyedRequest, *, session_id: str, data: dict, token: str, answer=None
) -> Keyed:
    """The one money path of ACP: at most one purchase and one payment at a time per
    session. A session whose payment is queued, unknown or succeeded answers its current
    state to any further complete, whatever the key: never a second charge."""
    client = request.api_client

    def prepare() -> None:
        _requote_if_expired(session_id)
        # A payment only a person settled is read back before a new one is decided on
        # (as REST's retry_of does): the provider's record outranks a person's word.
        purchase_id = (
            CheckoutSession.objects.filter(pk=session_id)
            .values_list("purchase_id", flat=True)
            .first()
        )
        if purchase_id:
            services.operations_verify_before_follow_up(purchase_id=purchase_id)

    def create(bind: Callable[[str, str], None]) -> Created:
        # The keyed transaction, one change batch around all of it: the purchase's and the
        # payment's history, events and messages and the key's binding go in its last
        # statement (payments.services.common.change_batch); a binding refused rolls the
        # whole transaction back.
        with transaction.atomic(), change_batch():
            made = complete_locked()
            bind(made.resource_type, made.resource_id)
        return made

    def complete_locked() -> Created:
        s = _locked(session_id)
        if s.canceled_at is not None:
            raise AcpError(
                status=409,
                code=ErrorCode.SESSION_NOT_COMPLETABLE,
                message="This session was canceled.",
            )
        op = sessions.payment_op(s.purchase)
        if op is not None and (op.outcome != Outcome.FAILED or sessions.failure_unconfirmed(op)):
            # Queued, sent, unknown or succeeded — or a person's "failed" the provider
            # could not confirm (read back just before): this complete is not a new
            # payment, whatever its key; it answers the session's current state.
            return Created(RESOURCE, s.id, operation_id=op.id, created=False)
        buyer = data.get("buyer") or s.buyer or {}
        email = (buyer.get("email") or "").strip()
        if not email:
            raise AcpError(
                status=400,
                code=ErrorCode.MISSING,
                param="$.buyer.email",
                message="The buyer's email is required to complete.",
            )
        if data.get("buyer"):
            s.buyer = data["buyer"]
        if s.purchase_id is None and s.quote is None:
            raise AcpError(
                status=409,
                code=ErrorCode.SESSION_NOT_READY,
                message="This session is not ready for payment: see its messages.",
            )

        def attach(purchase_id: str) -> None:
            s.purchase_id = purchase_id

        new, send = checkout_complete(
            api_client=client,
            purchase_id=s.purchase_id,
            quote_id=s.quote_id or "",  # read only when the session has no purchase yet
            quote_version=s.quote.version if s.quote is not None else 0,
            email=email,
            token=token,
            retry_of=op.id if op else None,
            on_purchase=attach,
        )
        s.save()
        return Created(RESOURCE, s.id, operation_id=new.id, send=send)

    return keyed_effect(
        request,
        create=create,
        verify=prepare,
        in_transaction=False,
        operation_for=_session_payment,
        answer=answer,
    )


__all__ = ["RESOURCE", "session_cancel", "session_complete", "session_create", "session_update"]
