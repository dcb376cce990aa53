"""MCP `pay_purchase` where the provider dedupes keys: one provider round trip, its
operation created already claimed for its send in the transaction that creates it (as a
REST payment and an ACP complete are), never created pending and claimed in a second
transaction. The statements one tool call sends are counted beside its effects
(docs/performance.md#veritys-own-time-per-payment-sql-statements)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents import tools
from payments.enums import Outcome, PurchaseStatus
from payments.models import IdempotencyRecord, OperationTransition, PaymentOperation, ProviderCall
from tests.payments.one_call_helpers import provider_count

pytestmark = pytest.mark.django_db(transaction=True)

# The REST payment's figure in the same mode (tests/payments/test_payment_statements.py),
# the tool's two reads first (the purchase, whether it already has a payment) in place of
# the REST replay and purchase reads; it answers with the operation view its keyed request
# read after the send.
MCP_ONE_CALL_STATEMENTS = 26


def _pay(api_client, purchase_id):
    with CaptureQueriesContext(connection) as queries:
        result = tools.pay_purchase(
            api_client=api_client, purchase_id=purchase_id, payment_method="pm_card_visa"
        )
    return result, [q["sql"] for q in queries.captured_queries]


def _transactions(statements: list[str]) -> list[list[str]]:
    """The statements of each committed transaction, in order."""
    found, current = [], None
    for sql in statements:
        if sql == "BEGIN":
            current = []
        elif sql == "COMMIT":
            found.append(current)
            current = None
        elif current is not None:
            current.append(sql)
    return found


def _writes(transaction: list[str], table: str) -> bool:
    return any(
        sql.startswith((f'INSERT INTO "{table}"', f'UPDATE "{table}"')) for sql in transaction
    )


def test_a_one_call_payment_is_claimed_in_the_transaction_that_creates_it(
    api_client, new_purchase, one_call
):
    _pay(api_client, new_purchase().id)  # the first call of a process compiles and caches
    purchase = new_purchase()
    result, statements = _pay(api_client, purchase.id)

    assert result.refusal is None, result
    assert result.replayed is False
    op = PaymentOperation.objects.get(purchase=purchase)
    assert result.operation["id"] == op.id
    assert op.outcome == Outcome.SUCCEEDED
    purchase.refresh_from_db()
    assert purchase.status == PurchaseStatus.PAID
    assert provider_count(one_call, purchase) == (1, 1, 1)
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
    transactions = _transactions(statements)
    [creating] = [t for t in transactions if _writes(t, "payments_paymentoperation")][:1]
    assert _writes(creating, "payments_providercall"), "the claim is not in the creating one"
    claims = [
        sql
        for sql in statements
        if sql.startswith('UPDATE "payments_paymentoperation" SET "outcome" = \'dispatching\'')
    ]
    assert claims == [], claims
    assert len(transactions) == 2, [t[:2] for t in transactions]  # create+claim, the answer
    # The tool's payment is bound to its own server-derived key, as the REST key is.
    record = IdempotencyRecord.objects.get(api_client=api_client, resource_id=op.id)
    assert (record.route, record.state, record.response_status) == (
        "mcp.pay_purchase",
        IdempotencyRecord.State.DONE,
        201,
    )

    print("MCP one-call payment, statements:", len(statements))
    assert len(statements) <= MCP_ONE_CALL_STATEMENTS, len(statements)


def test_a_second_call_answers_with_the_same_payment(api_client, new_purchase, one_call):
    purchase = new_purchase()
    first, _ = _pay(api_client, purchase.id)
    again = tools.pay_purchase(
        api_client=api_client, purchase_id=purchase.id, payment_method="pm_card_mastercard"
    )
    assert again.refusal is None and again.replayed is True
    assert again.operation["id"] == first.operation["id"]
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1
    assert provider_count(one_call, purchase) == (1, 1, 1)


def test_a_lost_answer_to_the_one_call_send_is_one_charge(api_client, new_purchase, one_call):
    """The answer to the one send is dropped after the provider took it: the tool answers
    with the operation as the lost answer left it, a second call answers with the same
    operation, and reconciling it finds the one charge under the same key."""
    from agents.server import _ConfirmDrill
    from payments import services

    purchase = new_purchase()
    first = tools.pay_purchase(
        api_client=api_client,
        purchase_id=purchase.id,
        payment_method="pm_card_visa",
        before_dispatch=_ConfirmDrill("drop_response_after_send"),
    )
    assert first.refusal is None and first.replayed is False
    op = PaymentOperation.objects.get(purchase=purchase)
    assert first.operation["id"] == op.id
    assert ProviderCall.objects.filter(operation=op, purpose="dispatch", step="pay").exists()
    again = tools.pay_purchase(
        api_client=api_client, purchase_id=purchase.id, payment_method="pm_card_visa"
    )
    assert again.replayed is True and again.operation["id"] == op.id
    op.refresh_from_db()
    if not op.is_terminal:
        op = services.operation_reconcile(operation_id=op.id)
    pays = list(
        ProviderCall.objects.filter(operation=op, step="pay")
        .order_by("started_at")
        .values_list("purpose", "classification", "key")
    )
    print("lost answer:", first.operation["outcome"], "->", op.outcome, pays)
    assert [(p, c) for p, c, _ in pays][:1] == [("dispatch", "unknown")]
    assert ("replay", "ok") in [(p, c) for p, c, _ in pays]
    assert len({k for _, _, k in pays}) == 1  # asked again under the same key only
    assert op.outcome == Outcome.SUCCEEDED
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1
    assert provider_count(one_call, purchase) == (1, 1, 1)


def test_concurrent_calls_are_one_payment_sent_once(api_client, new_purchase, one_call):
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    purchase = new_purchase()

    def pay(_):
        try:
            return tools.pay_purchase(
                api_client=api_client, purchase_id=purchase.id, payment_method="pm_card_visa"
            )
        finally:
            connections.close_all()

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(pay, range(6)))
    assert all(a.refusal is None for a in answers), [a.refusal for a in answers]
    assert len({a.operation["id"] for a in answers}) == 1
    assert sum(not a.replayed for a in answers) == 1
    op = PaymentOperation.objects.get(purchase=purchase)
    assert op.outcome == Outcome.SUCCEEDED
    assert ProviderCall.objects.filter(operation=op, purpose="dispatch").count() == 1
    assert provider_count(one_call, purchase) == (1, 1, 1)
