"""A step that fails under COMPENSATE after a compensated duplicate charge
refunds the purchase's OWN charge (a compensation belongs to the payment it returns).

Real stack: the duplicate comes from a charge whose answer was lost, a person's wrong
"failed" while the provider could not be read, and a retry that charged again; counted at
localstripe (refunds per PaymentIntent) and in the database.
"""

import pytest

from payments import services
from payments.enums import Outcome, PurchaseStatus
from payments.models import PaymentOperation, Product, Purchase
from recovery.halts import halt_set
from recovery.models import RecoveryDecision, StepRun, StepState
from recovery.orchestrator import purchase_fulfil
from tests.outbox import settle
from tests.payments.test_provider_outranks_people import _charged_twice
from tests.recovery.halt_fence import lift_halt_quietly

pytestmark = pytest.mark.django_db(transaction=True)


def _compensated_duplicate(new_purchase, api_client, drill, read_drill, resolver, localstripe):
    """Two charges at the provider on one purchase; the duplicate (the first, confirmed
    later) returned by its compensation; the steps fenced at `order`."""
    halt_set(name="step:order", reason="test fence", actor="test")

    def make():
        return new_purchase(stock=1)

    purchase, first, retry = _charged_twice(
        make, api_client, drill, read_drill, resolver, localstripe
    )
    services.operation_reconcile(operation_id=first.id)
    settle()
    first = PaymentOperation.objects.get(pk=first.pk)
    dup_refund = PaymentOperation.objects.get(parent=first, kind="refund")
    assert first.is_duplicate and dup_refund.is_compensation
    assert dup_refund.outcome == Outcome.SUCCEEDED
    assert [r["amount"] for r in localstripe.refunds_for(first.provider_reference)] == [
        first.amount
    ]
    return purchase, first, retry, dup_refund


def test_a_failed_step_after_a_compensated_duplicate_refunds_the_own_charge(
    new_purchase, api_client, drill, read_drill, resolver, localstripe
):
    purchase, first, retry, dup_refund = _compensated_duplicate(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )
    # the inventory commit will be refused: the step's policy compensates
    Product.objects.filter(sku=purchase.quote.items[0]["sku"]).update(stock=0)
    lift_halt_quietly("step:order")

    purchase_fulfil(purchase_id=purchase.id)
    settle()

    # the step is compensated by a refund of the purchase's own charge, not the duplicate's
    run = StepRun.objects.get(purchase_id=purchase.id, step="inventory")
    assert run.state == StepState.COMPENSATED
    own = PaymentOperation.objects.filter(parent=retry, kind="refund").first()
    assert own is not None, "the purchase's own charge was never refunded"
    assert run.compensation_operation_id == own.id != dup_refund.id
    assert own.is_compensation and own.amount == retry.amount
    assert own.outcome == Outcome.SUCCEEDED
    # at the provider: one refund of each charge, each of its own charge
    assert [r["amount"] for r in localstripe.refunds_for(retry.provider_reference)] == [
        retry.amount
    ]
    assert [r["amount"] for r in localstripe.refunds_for(first.provider_reference)] == [
        first.amount
    ]
    assert PaymentOperation.objects.filter(purchase=purchase, kind="refund").count() == 2
    # the decision is recorded and the purchase left `fulfilling`
    assert list(
        RecoveryDecision.objects.filter(purchase_id=purchase.id).values_list("decision", flat=True)
    ) == ["compensated"]
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.REFUNDED
