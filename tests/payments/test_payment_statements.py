"""What one REST payment costs in SQL statements (every statement Django sends, BEGIN,
COMMIT and savepoints included), counted in one process. A count, not a timing: it
keeps a later change from quietly adding round trips to every checkout
(docs/performance.md#veritys-own-time-per-payment-sql-statements). The payment's effects are
asserted beside it, so a cheaper payment is never a payment that skipped a rule."""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from payments.enums import Outcome, PurchaseStatus
from payments.models import Hold, OperationTransition, PaymentOperation, ProviderCall
from recovery.models import OutboxMessage

from .one_call_helpers import provider_count

pytestmark = pytest.mark.django_db(transaction=True)

# One-call mode (the provider dedupes keys): the ladder (3: the replay read, the purchase
# read, the key claimed); one transaction that creates the operation already claimed (12:
# the purchase and quote locked, then the checkout halt read with its payments, the
# operation, its ProviderCall, the client's lock, the hold inserted with the limit's sum,
# the purchase moved, its event's view in 2, then events, outbox, history and the key's
# binding in one statement, BEGIN/COMMIT); the answer applied (10: both locks, the sibling
# payments' success read with the operation's, the operation, hold and purchase moved, the
# view in 2, then events, outbox, history, the call's answer and the key's completion in
# one statement, BEGIN/COMMIT); the operation read for the answer (1).
ONE_CALL_STATEMENTS = 26
# Two-step mode (create, store the id, confirm): two provider calls and their claims.
TWO_STEP_STATEMENTS = 47


def _pay(api, purchase_id: str):
    with CaptureQueriesContext(connection) as queries:
        answer = api.post(
            f"/api/v1/purchases/{purchase_id}/payments",
            {"payment_method": "pm_card_visa", "capture": "automatic"},
            format="json",
            HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
        )
    return answer, len(queries.captured_queries)


def _paid_once(purchase, localstripe) -> PaymentOperation:
    op = PaymentOperation.objects.get(purchase=purchase)
    assert op.outcome == Outcome.SUCCEEDED
    purchase.refresh_from_db()
    assert purchase.status == PurchaseStatus.PAID
    assert provider_count(localstripe, purchase) == (1, 1, 1)
    assert Hold.objects.filter(operation=op, state="consumed").count() == 1
    assert OutboxMessage.objects.filter(dedupe_key=f"steps:{purchase.id}").exists()
    assert OutboxMessage.objects.filter(dedupe_key=f"settled:{op.id}").exists()
    return op


def test_a_one_call_payment_stays_within_its_statements(api, new_purchase, one_call):
    _pay(api, new_purchase().id)  # the first request of a process compiles and caches
    purchase = new_purchase()
    answer, statements = _pay(api, purchase.id)
    assert answer.status_code == 201, answer.content
    op = _paid_once(purchase, one_call)
    assert list(
        ProviderCall.objects.filter(operation=op).values_list("step", "purpose", "http_status")
    ) == [("pay", "dispatch", 200)]
    assert list(
        OperationTransition.objects.filter(operation=op)
        .order_by("id")
        .values_list("source", "target", "cause")
    ) == [
        ("", "pending", "operation_created"),
        ("pending", "dispatching", "claim:pay"),
        ("dispatching", "succeeded", "pay_answer"),
    ]
    print("one-call payment, statements:", statements)
    assert statements <= ONE_CALL_STATEMENTS, statements


def test_a_two_step_payment_stays_within_its_statements(api, new_purchase, localstripe):
    _pay(api, new_purchase().id)
    purchase = new_purchase()
    answer, statements = _pay(api, purchase.id)
    assert answer.status_code == 201, answer.content
    op = _paid_once(purchase, localstripe)
    assert list(
        ProviderCall.objects.filter(operation=op)
        .order_by("started_at")
        .values_list("step", flat=True)
    ) == ["create", "confirm"]
    print("two-step payment, statements:", statements)
    assert statements <= TWO_STEP_STATEMENTS, statements
