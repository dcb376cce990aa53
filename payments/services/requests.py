"""Keyed money requests: one function per intent, each the core's ladder (payments.keyed)
around one service, for every face (the REST API, the MCP tools, ACP checkout).

A face parses its input into these arguments, calls one of them and renders the `Keyed`
it gets back; it never claims, binds, completes or releases a key itself.

- `payment_request`: a payment (or the one deliberate retry of a failed one, `retry_of`:
  a person's word on the original is read back first);
- `follow_up_request`: capture, void or refund of the purchase's payment (a person's word
  on any of its operations is read back first);
- `checkout_complete`: the money part of an ACP complete — the session's purchase opened
  if it has none, and its payment — called by acp.services inside the keyed transaction
  that also writes the session.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from ..enums import OperationKind
from ..keyed import Created, Keyed, KeyedRequest, keyed_effect
from ..models import ApiClient, PaymentOperation, ProviderCall, Purchase, PurchaseChannel
from .common import change_batch
from .dispatch import payment_send_claimed
from .operations import (
    capture_create,
    payment_create_claimed,
    refund_request,
    void_create,
)
from .purchases import purchase_open
from .reconcile import operations_verify_before_follow_up


def _sender(op: PaymentOperation, call: ProviderCall | None) -> Callable[[], None] | None:
    """The send of an operation created claimed (None: it is pending, dispatch it)."""
    if call is None:
        return None
    return lambda: payment_send_claimed(op, call)


def payment_request(
    request: KeyedRequest,
    *,
    purchase_id: str,
    payment_method: str,
    capture_method: str = "automatic",
    retry_of: str | None = None,
    amount: int | None = None,
    currency: str | None = None,
    before_send: Callable[[PaymentOperation], None] | None = None,
) -> Keyed:
    """`before_send(op)`: called with the new operation in the transaction that creates
    it, before anything is sent (a test-mode fault drill arms itself on its key)."""

    def create(bind: Callable[[str, str], None]) -> Created:
        # The keyed transaction: where the rail pays in one call, the operation is created
        # claimed for its send, which the ladder makes right after commit. The key is
        # bound in the change's batch, so in its last statement: a binding refused (the
        # key taken over) rolls the whole transaction back.
        with transaction.atomic(), change_batch():
            op, call = payment_create_claimed(
                purchase_id=purchase_id,
                api_client=request.api_client,
                payment_method=payment_method,
                capture_method=capture_method,
                retry_of=retry_of,
                amount=amount,
                currency=currency,
            )
            if before_send is not None:
                before_send(op)
            bind("operation", op.id)
        return Created("operation", op.id, operation_id=op.id, send=_sender(op, call))

    # The original is read back first if only a person settled it
    # (docs/reliability.md#the-providers-record-outranks-a-person).
    verify = (
        (lambda: operations_verify_before_follow_up(purchase_id=purchase_id)) if retry_of else None
    )
    return keyed_effect(request, create=create, verify=verify, in_transaction=False)


def follow_up_request(
    request: KeyedRequest,
    *,
    purchase_id: str,
    kind: OperationKind,
    amount: int | None = None,
    currency: str | None = None,
) -> Keyed:
    """A new operation linked to the purchase's payment: capture, void or refund."""
    client = request.api_client

    def create() -> Created:
        if kind == OperationKind.CAPTURE:
            op = capture_create(purchase_id=purchase_id, api_client=client)
        elif kind == OperationKind.VOID:
            op = void_create(purchase_id=purchase_id, api_client=client)
        elif kind == OperationKind.REFUND:
            op = refund_request(
                purchase_id=purchase_id, amount=amount, api_client=client, currency=currency
            )
        else:
            raise ValueError(kind)
        return Created("operation", op.id, operation_id=op.id)

    # A follow-up on a payment only a person settled: read it back first.
    return keyed_effect(
        request,
        create=create,
        verify=lambda: operations_verify_before_follow_up(purchase_id=purchase_id),
    )


def checkout_complete(
    *,
    api_client: ApiClient,
    purchase_id: str | None,
    quote_id: str,
    quote_version: int,
    email: str,
    token: str,
    retry_of: str | None,
    on_purchase: Callable[[str], None],
) -> tuple[PaymentOperation, Callable[[], None] | None]:
    """Inside the keyed transaction: open the session's purchase if it has none (the buyer
    is the ACP customer, so the same guards — an unresolved purchase, the same basket
    again — apply across sessions as across REST purchases; `on_purchase(id)` lets the
    session record it), then its payment. A retry (`retry_of`, a session whose payment
    failed) asks the duplicate guard again in payment_create. Returns the payment and,
    when it was created claimed for its one send, that send (`Created.send`).

    One change batch around both (payments.services.common.change_batch): the purchase's
    first transition and the payment's are one history insert, and their storefront
    events carry the view this transaction leaves, built once. A refusal of either raises
    out of the caller's transaction, which rolls back whole."""
    with change_batch():
        return _checkout_complete_batched(
            api_client=api_client,
            purchase_id=purchase_id,
            quote_id=quote_id,
            quote_version=quote_version,
            email=email,
            token=token,
            retry_of=retry_of,
            on_purchase=on_purchase,
        )


def _checkout_complete_batched(
    *,
    api_client: ApiClient,
    purchase_id: str | None,
    quote_id: str,
    quote_version: int,
    email: str,
    token: str,
    retry_of: str | None,
    on_purchase: Callable[[str], None],
) -> tuple[PaymentOperation, Callable[[], None] | None]:
    if purchase_id is None:
        purchase = purchase_open(
            api_client=api_client,
            quote_id=quote_id,
            quote_version=quote_version,
            customer_reference=f"acp:{email.lower()}",
            customer_email=email,
            channel=PurchaseChannel.ACP,
        ).purchase
        on_purchase(purchase.id)
    else:
        purchase = Purchase.objects.get(pk=purchase_id)
    op, call = payment_create_claimed(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method=token,
        capture_method="automatic",
        retry_of=retry_of,
        amount=purchase.amount,
        currency=purchase.currency,
    )
    return op, _sender(op, call)


__all__ = ["checkout_complete", "follow_up_request", "payment_request"]
