"""The orchestrator against real payments at localstripe: effects exactly once, resume,
unknown never satisfies a dependency, policies (compensate / void / manual), at-most-once
e-mail, deliverables.

A session Celery worker may be running (other test packages start it): every outbox
message may be handled by it or by this process. Tests therefore fence with step halts
where they need a purchase to wait, call `settle()` and assert final states.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from payments import services as pay
from payments.enums import Outcome, PurchaseStatus
from payments.models import PaymentOperation, Product, Purchase
from recovery.halts import halt_clear, halt_set
from recovery.models import (
    CrmUpdate,
    EmailMessage,
    InventoryCommit,
    LedgerEntry,
    Order,
    RecoveryDecision,
    StepRun,
    StepState,
)
from recovery.orchestrator import (
    COMPLETED,
    NOT_READY,
    StepRetryLater,
    purchase_fulfil,
    step_resolve,
)
from recovery.selectors import compensation_needed_count, steps_for_purchase
from tests.outbox import settle
from tests.recovery.halt_fence import lift_halt_quietly
from tests.recovery.threads import run_concurrently

pytestmark = pytest.mark.django_db(transaction=True)


def _effects(purchase_id):
    return {
        "order": Order.objects.filter(purchase_id=purchase_id).count(),
        "inventory": InventoryCommit.objects.filter(purchase_id=purchase_id).count(),
        "ledger": LedgerEntry.objects.filter(purchase_id=purchase_id, entry_type="sale").count(),
        "email": EmailMessage.objects.filter(
            purchase_id=purchase_id, sent_at__isnull=False
        ).count(),
        "crm": CrmUpdate.objects.filter(purchase_id=purchase_id).count(),
    }


ONCE = {"order": 1, "inventory": 1, "ledger": 2, "email": 1, "crm": 1}  # ledger: two sides


def _fulfil_or_retry_later(purchase_id):
    """One delivery of RUN_STEPS: a run that meets another worker's lease asks to retry."""
    try:
        return purchase_fulfil(purchase_id=purchase_id)
    except StepRetryLater:
        return "retry_later"


def _status(purchase):
    return Purchase.objects.get(id=purchase.id).status


def _decisions(purchase):
    return list(
        RecoveryDecision.objects.filter(purchase_id=purchase.id).values_list("decision", flat=True)
    )


def _sell_out(purchase):
    """Another sale took the last unit between the quote and the inventory commit."""
    Product.objects.filter(sku=purchase.quote.items[0]["sku"]).update(stock=0)


def _paid_and_waiting_at(step, new_purchase, pay_now, **product):
    """A paid purchase whose steps wait at `step` (fence lifted without a kick)."""
    purchase = new_purchase(**product)
    halt_set(name=f"step:{step}", reason="test fence", actor="test")
    op = pay_now(purchase)
    settle()
    lift_halt_quietly(f"step:{step}")
    return purchase, op


def test_each_step_effect_happens_once_under_redelivery_and_concurrency(
    new_purchase, pay_now, localstripe
):
    purchase, op = _paid_and_waiting_at("order", new_purchase, pay_now, stock=10, quantity=2)
    assert op.outcome == Outcome.SUCCEEDED
    assert set(steps_for_purchase(purchase.id).values()) == {StepState.PENDING}

    # Four deliveries at once, then three redeliveries in a row.
    run_concurrently(lambda: _fulfil_or_retry_later(purchase.id), 4)
    assert [_fulfil_or_retry_later(purchase.id) for _ in range(3)] == [COMPLETED] * 3
    settle()

    assert _effects(purchase.id) == ONCE
    assert StepRun.objects.filter(purchase_id=purchase.id).count() == 5
    assert Product.objects.get(sku=purchase.quote.items[0]["sku"]).stock == 8
    ledger = LedgerEntry.objects.filter(purchase_id=purchase.id)
    assert sum(e.amount for e in ledger) == 0  # double entry balances
    assert ledger.get(account="provider_balance").amount == op.amount
    assert _status(purchase) == PurchaseStatus.COMPLETED
    assert _decisions(purchase) == ["completed_forward"]
    assert set(steps_for_purchase(purchase.id).values()) == {StepState.DONE}
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1  # never charges


def test_paid_purchase_completes_forward_through_the_outbox(new_purchase, pay_now):
    purchase = new_purchase()
    pay_now(purchase)  # the core writes RUN_STEPS; whoever drains it runs the steps

    settle()

    assert _effects(purchase.id) == ONCE
    assert _status(purchase) == PurchaseStatus.COMPLETED
    email = EmailMessage.objects.get(purchase_id=purchase.id)
    assert email.to == "buyer@example.com" and email.kind == "confirmation"


def test_resumes_from_the_first_incomplete_step(new_purchase, pay_now):
    purchase = new_purchase()
    halt_set(name="step:ledger", reason="ledger writer broken", actor="op1")
    pay_now(purchase)
    settle()

    assert steps_for_purchase(purchase.id) == {
        "order": "done",
        "inventory": "done",
        "ledger": "pending",
        "confirmation": "pending",
        "crm": "pending",
    }
    assert _effects(purchase.id)["email"] == 0  # later steps wait
    assert _status(purchase) == PurchaseStatus.FULFILLING

    halt_clear(name="step:ledger", actor="op1", reason="fixed")  # writes RUN_STEPS
    settle()

    assert _effects(purchase.id) == ONCE
    assert _status(purchase) == PurchaseStatus.COMPLETED
    runs = dict(StepRun.objects.filter(purchase_id=purchase.id).values_list("step", "attempts"))
    assert runs["order"] == 1 and runs["inventory"] == 1  # done steps were not re-run


def test_unknown_payment_produces_no_order_and_no_email(
    new_purchase, api_client, drill, localstripe
):
    purchase = new_purchase()
    op = pay.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, "drop_response_after_send")  # the provider applies it; the answer is lost
    op = pay.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    settle()

    assert purchase_fulfil(purchase_id=purchase.id) == NOT_READY
    assert _effects(purchase.id) == dict.fromkeys(ONCE, 0)
    assert not StepRun.objects.filter(purchase_id=purchase.id).exists()
    assert not EmailMessage.objects.filter(purchase_id=purchase.id).exists()

    # Evidence arrives (read-back): now the steps run, once; still one charge.
    pay.operation_reconcile(operation_id=op.id)
    settle()
    assert _effects(purchase.id) == ONCE
    assert _status(purchase) == PurchaseStatus.COMPLETED
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1


def test_inventory_failure_compensates_with_one_linked_refund(new_purchase, pay_now, localstripe):
    purchase = new_purchase(stock=1)
    _sell_out(purchase)  # the inventory commit will be refused
    halt_set(name="refunds", reason="hold compensation for a look", actor="op1")
    charge = pay_now(purchase)
    settle()

    # The policy decided to compensate, and the refunds halt holds the refund back.
    assert (
        StepRun.objects.get(purchase_id=purchase.id, step="inventory").state
        == StepState.COMPENSATED
    )
    assert not PaymentOperation.objects.filter(purchase_id=purchase.id, kind="refund").exists()
    assert compensation_needed_count() == 1

    halt_clear(name="refunds", actor="op1", reason="go ahead")
    # Redelivered and concurrent runs start one compensation between them.
    run_concurrently(lambda: _fulfil_or_retry_later(purchase.id), 3)
    purchase_fulfil(purchase_id=purchase.id)
    settle()  # DISPATCH, then OPERATION_SETTLED

    [refund] = PaymentOperation.objects.filter(purchase_id=purchase.id, kind="refund")
    assert refund.is_compensation and refund.parent_id == charge.id
    assert refund.idempotency_key != charge.idempotency_key  # its own key
    assert refund.outcome == Outcome.SUCCEEDED
    assert len(localstripe.refunds_for(charge.provider_reference)) == 1
    assert _status(purchase) == PurchaseStatus.REFUNDED
    assert compensation_needed_count() == 0
    assert Order.objects.filter(purchase_id=purchase.id).count() == 1  # no duplicate order
    # the money went back, so did the order; the customer is told once, never "confirmed"
    assert Order.objects.get(purchase_id=purchase.id).cancelled_at is not None
    assert InventoryCommit.objects.filter(purchase_id=purchase.id).count() == 0
    assert list(
        EmailMessage.objects.filter(purchase_id=purchase.id).values_list("kind", flat=True)
    ) == ["cancellation"]
    assert _decisions(purchase) == ["compensated"]
    refund_ledger = LedgerEntry.objects.filter(operation_id=refund.id)
    assert sorted(e.amount for e in refund_ledger) == [-charge.amount, charge.amount]


def test_authorization_is_voided_when_a_step_fails_before_capture(
    new_purchase, pay_now, localstripe
):
    purchase = new_purchase(stock=1)
    _sell_out(purchase)
    auth = pay_now(purchase, capture="manual")
    settle()

    [void] = PaymentOperation.objects.filter(purchase_id=purchase.id, kind="void")
    assert void.outcome == Outcome.SUCCEEDED and void.is_compensation
    [pi] = localstripe.payment_intents_for(purchase.id)
    assert pi["status"] == "canceled"
    assert localstripe.refunds_for(auth.provider_reference) == []
    assert _status(purchase) == PurchaseStatus.VOIDED
    assert _decisions(purchase) == ["compensated"]


def test_manual_policy_sends_the_purchase_to_review_without_moving_money(
    new_purchase, pay_now, localstripe
):
    purchase = new_purchase(stock=1, step_policy={"inventory": "manual"})
    _sell_out(purchase)
    charge = pay_now(purchase)
    settle()

    assert _status(purchase) == PurchaseStatus.MANUAL_REVIEW
    assert purchase_fulfil(purchase_id=purchase.id) == NOT_READY  # a person decides now
    assert StepRun.objects.get(purchase_id=purchase.id, step="inventory").state == StepState.MANUAL
    assert not PaymentOperation.objects.filter(purchase_id=purchase.id, kind="refund").exists()
    assert localstripe.refunds_for(charge.provider_reference) == []
    assert _decisions(purchase) == ["manual"]
    assert compensation_needed_count() == 1  # waits for a person


def test_confirmation_found_running_after_a_crash_is_unknown_and_not_resent(new_purchase, pay_now):
    purchase, _ = _paid_and_waiting_at("confirmation", new_purchase, pay_now)
    # What a worker killed mid-send leaves: the attempt recorded, the step running.
    EmailMessage.objects.create(
        purchase_id=purchase.id,
        kind="confirmation",
        to="buyer@example.com",
        subject="Order confirmed",
    )
    StepRun.objects.filter(purchase_id=purchase.id, step="confirmation").update(
        state=StepState.RUNNING, attempts=1, started_at=timezone.now() - timedelta(hours=1)
    )

    assert purchase_fulfil(purchase_id=purchase.id) == StepState.UNKNOWN
    assert purchase_fulfil(purchase_id=purchase.id) == NOT_READY

    assert EmailMessage.objects.get(purchase_id=purchase.id).sent_at is None  # not resent
    assert _status(purchase) == PurchaseStatus.MANUAL_REVIEW
    assert CrmUpdate.objects.filter(purchase_id=purchase.id).count() == 0
    assert compensation_needed_count() == 1

    # A person checked the mail log: it never left. Resend once, finish the purchase.
    step_resolve(
        purchase_id=purchase.id,
        step="confirmation",
        resolution="retry",
        actor="op2",
        reason="mail relay log shows no delivery",
    )
    settle()
    assert _status(purchase) == PurchaseStatus.COMPLETED
    assert _effects(purchase.id) == ONCE
    assert EmailMessage.objects.filter(purchase_id=purchase.id).count() == 1


def test_a_send_in_progress_is_left_to_its_worker(new_purchase, pay_now):
    purchase, _ = _paid_and_waiting_at("confirmation", new_purchase, pay_now)
    StepRun.objects.filter(purchase_id=purchase.id, step="confirmation").update(
        state=StepState.RUNNING, started_at=timezone.now()
    )

    with pytest.raises(StepRetryLater):  # the message backs off; the sender keeps it
        purchase_fulfil(purchase_id=purchase.id)

    assert StepRun.objects.get(purchase_id=purchase.id, step="confirmation").state == "running"
    assert not EmailMessage.objects.filter(purchase_id=purchase.id).exists()


def test_digital_goods_get_a_deliverable_kept_for_redelivery(new_purchase, pay_now):
    from recovery.selectors import deliverable_for

    purchase = new_purchase(kind="digital", stock=5)
    pay_now(purchase)
    settle()
    assert purchase_fulfil(purchase_id=purchase.id) == COMPLETED

    run = StepRun.objects.get(purchase_id=purchase.id, step="deliverable")
    assert run.external_reference.startswith("job_") and run.attempts == 1
    stored = deliverable_for(purchase.id)
    assert stored["result"]["licence_key"] and stored["expires_at"] > timezone.now()
    assert "deliverable" in steps_for_purchase(purchase.id)
    assert Product.objects.get(sku=purchase.quote.items[0]["sku"]).stock == 5  # not counted
    assert _status(purchase) == PurchaseStatus.COMPLETED
