"""A person settles a one-call payment `failed` while its first request is still running at
the provider (the key answers 409 in progress, the PaymentIntent not created yet): the
read by metadata finds nothing, so the person's word is accepted; a retry under another
key then charges, and the first request completes under its own key. Two charges for one
purchase. In the two-step flow the same moment is guarded by the stored PaymentIntent id
(read by id, cancelled before a person's failure)."""

import pytest

from payments import services
from payments.enums import Outcome
from payments.models import PaymentOperation

from .one_call_helpers import calls, provider_count, start, wait_intents

pytestmark = pytest.mark.django_db(transaction=True)


def test_person_failed_while_first_send_in_progress_then_retry(
    new_purchase, api_client, one_call, settings
):
    settings.STRIPE_READ_TIMEOUT = 0.5
    one_call.idempotency(hold_seconds=4)
    purchase = new_purchase()
    op = services.operation_dispatch(operation_id=start(purchase, api_client).id)
    assert op.outcome == Outcome.UNKNOWN
    assert [c for _, _, c in calls(op, "replay")] == ["unknown"]  # the 409
    one_call.idempotency(hold_seconds=0)
    # Support, seeing an unknown payment the provider "does not have", settles it failed.
    try:
        services.operation_resolve_manual(
            operation_id=op.id,
            outcome=Outcome.FAILED,
            reason="provider has no payment for it",
            actor="support:alice",
        )
        resolved = True
    except services.DomainError as exc:
        resolved = exc.code
    op = PaymentOperation.objects.get(id=op.id)
    retried = None
    if op.outcome == Outcome.FAILED:
        try:
            retry = start(purchase, api_client, method="pm_card_mastercard", retry_of=op.id)
            retried = services.operation_dispatch(operation_id=retry.id).outcome
        except services.DomainError as exc:
            retried = exc.code
    wait_intents(one_call, purchase, 2 if retried == Outcome.SUCCEEDED else 1)
    wait_intents(one_call, purchase, 9, timeout=4.5)  # let the held first request finish
    counts = provider_count(one_call, purchase)
    print(
        "resolved:",
        resolved,
        "original:",
        op.outcome,
        op.grade,
        "retry:",
        retried,
        "provider (intents, paid, charges):",
        counts,
    )
    assert counts[1] <= 1, (
        f"two paid PaymentIntents for one purchase: person's failed "
        f"accepted={resolved}, retry={retried}, provider={counts}"
    )
    # The provider's record outranks the person: the follow-up read-back overturns it,
    # unless the provider's own word (its webhook, a scheduled read-back) already did.
    try:
        op = services.operation_reconcile(operation_id=op.id)
    except services.DomainError as exc:
        assert exc.code == "already_settled", exc
        op = PaymentOperation.objects.get(id=op.id)
    purchase.refresh_from_db()
    print("after the read-back:", op.outcome, op.grade, "purchase:", purchase.status)
    assert counts == (1, 1, 1)
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, "confirmed")
