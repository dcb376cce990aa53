"""What one ACP complete costs in SQL statements (every statement Django sends, BEGIN,
COMMIT and savepoints included), counted in one process: the session's purchase opened
and paid in one keyed request. A count, not a timing: it keeps a later change from quietly
adding round trips to every agent checkout
(docs/performance.md#veritys-own-time-per-payment-sql-statements). The effects are asserted
beside it, so a cheaper complete is never one that skipped a rule."""

import uuid

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from acp.models import CheckoutSession
from acp.spec import API_VERSION
from events.models import Event
from payments.enums import Outcome, PurchaseStatus
from payments.models import Hold, OperationTransition, PaymentOperation
from recovery.models import OutboxMessage
from tests.payments.one_call_helpers import provider_count

from .agent import complete_body, new_email
from .tokens import issue_spt

pytestmark = pytest.mark.django_db(transaction=True)

# One-call mode: the session read and the ladder, one transaction that opens the purchase,
# creates its payment already claimed and binds the key (one purchase view for both
# events, its writes and the binding in one last statement), the answer applied (the
# call's answer recorded in its last statement), the session's answer and the key.
ONE_CALL_STATEMENTS = 48
# Two-step mode: create, store the id, confirm.
TWO_STEP_STATEMENTS = 70


def _post(client: Client, key: str, path: str, body: dict):
    return client.post(
        f"/acp/{path}",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
        HTTP_API_VERSION=API_VERSION,
        HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
    )


def _complete(platform, tea) -> tuple[str, int]:
    """A new session for one item, completed; (its id, the complete's statements)."""
    client = Client()
    created = _post(
        client,
        platform[1],
        "checkout_sessions",
        {
            "line_items": [{"id": tea.sku, "quantity": 1}],
            "currency": "usd",
            "capabilities": {"interventions": {"supported": []}},
        },
    )
    assert created.status_code == 201, created.content
    session_id = created.json()["id"]
    token = issue_spt(tea.price)
    with CaptureQueriesContext(connection) as queries:
        answer = _post(
            client,
            platform[1],
            f"checkout_sessions/{session_id}/complete",
            complete_body(token, new_email()),
        )
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "completed"
    return session_id, len(queries.captured_queries)


def _paid_once(session_id: str, localstripe) -> None:
    purchase = CheckoutSession.objects.get(pk=session_id).purchase
    assert purchase is not None and purchase.status == PurchaseStatus.PAID
    op = PaymentOperation.objects.get(purchase=purchase)
    assert op.outcome == Outcome.SUCCEEDED
    assert provider_count(localstripe, purchase) == (1, 1, 1)
    assert Hold.objects.filter(operation=op, state="consumed").count() == 1
    assert list(
        OperationTransition.objects.filter(purchase=purchase, operation=None)
        .order_by("id")
        .values_list("source", "target")
    ) == [
        ("", "awaiting_payment"),
        ("awaiting_payment", "payment_pending"),
        ("payment_pending", "paid"),
    ]
    # Every event of the purchase, numbered in order, each with its fan-out message; the
    # two written in the opening transaction carry the view that transaction left.
    events = list(Event.objects.filter(purchase_id=purchase.id).order_by("sequence"))
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert {e.data["purchase"]["status"] for e in events[:2]} == {"payment_pending"}
    for event in events:
        assert OutboxMessage.objects.filter(dedupe_key=f"event:{event.id}").exists()
    assert OutboxMessage.objects.filter(dedupe_key=f"steps:{purchase.id}").exists()


def test_a_one_call_complete_stays_within_its_statements(platform, tea, one_call):
    _complete(platform, tea)  # the first request of a process compiles and caches
    session_id, statements = _complete(platform, tea)
    _paid_once(session_id, one_call)
    print("one-call ACP complete, statements:", statements)
    assert statements <= ONE_CALL_STATEMENTS, statements


def test_a_two_step_complete_stays_within_its_statements(platform, tea, localstripe):
    _complete(platform, tea)
    session_id, statements = _complete(platform, tea)
    _paid_once(session_id, localstripe)
    print("two-step ACP complete, statements:", statements)
    assert statements <= TWO_STEP_STATEMENTS, statements
