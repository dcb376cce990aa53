"""An effect is created only by the request that still holds its key at that moment.

A refund request reads back a person's word first (`operations_verify_before_follow_up`).
When that read-back outlives the Idempotency-Key lease, the client's retry takes the key
over and creates the refund. The stalled first request, once its read-back returns, must
not create a second one: its ownership is checked (a fencing token: the lease it was
granted) in the very transaction that would create the refund.

Real stack: the payment is charged at localstripe, its answer lost, a person resolves it
`succeeded` while the provider cannot be read (grade acknowledged); the slow read-back is
the fault-drill client's `read_slow`; the lease is shortened by settings. Refunds are
counted at localstripe and in the database, through REST and through the MCP tool.
"""

import threading
import time

import pytest
from django.db import connection

from agents import tools
from payments import services
from payments.enums import Grade, OperationKind, Outcome, Rail
from payments.models import IdempotencyRecord, PaymentOperation
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 1


@pytest.fixture
def persons_word(storefront, product, drill, read_drill, django_user_model):
    """A purchase whose payment succeeded at localstripe but which only a person settled
    (the answer was lost, the read-back at the resolution unreachable)."""
    purchase = storefront.new_purchase(product.sku)
    op = services.payment_create(
        purchase_id=purchase["id"], api_client=storefront.client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    read_drill(op.provider_reference)
    person = django_user_model.objects.create(username="resolver-fencing")
    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome="succeeded",
        reason="the buyer's bank shows it",
        actor="resolver-fencing",
        acting_user=person,
    )
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    return purchase, op


def _refund_by_rest(storefront, purchase_id, key):
    return storefront.post(f"purchases/{purchase_id}/refunds", {"amount": 1000}, key=key)


def _refund_by_mcp(storefront, purchase_id, key):
    return tools.request_refund(api_client=storefront.client, purchase_id=purchase_id, amount=1000)


@pytest.mark.parametrize("face", [_refund_by_rest, _refund_by_mcp], ids=["rest", "mcp"])
def test_a_request_whose_lease_ran_out_during_the_read_back_creates_no_second_refund(
    face, storefront, persons_word, settings, localstripe
):
    settings.IDEMPOTENCY_LEASE_SECONDS = LEASE
    purchase, payment = persons_word
    provider_for_rail(Rail.STRIPE).arm_drill(
        key_prefix=payment.provider_reference, step="read", mode=DrillMode.READ_SLOW, times=1
    )
    key = "refund-once"
    stalled: dict = {}

    def first_request():
        try:
            stalled["answer"] = face(storefront, purchase["id"], key)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            stalled["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=first_request)
    thread.start()
    # The first request is in its slow read-back; its lease runs out meanwhile.
    time.sleep(LEASE + 0.5)
    assert thread.is_alive()

    retry = face(storefront, purchase["id"], key)  # takes the key over, creates the refund
    thread.join(DrillMode.SLOW_READ_SECONDS + 30)
    assert not thread.is_alive()
    assert "error" not in stalled, stalled

    refunds = PaymentOperation.objects.filter(purchase_id=purchase["id"], kind=OperationKind.REFUND)
    assert refunds.count() == 1, list(refunds.values("id", "outcome", "amount"))
    assert len(localstripe.refunds_for(payment.provider_reference)) == 1
    [record] = IdempotencyRecord.objects.filter(
        resource_type="operation", resource_id=refunds.get().id
    )
    assert record.state == IdempotencyRecord.State.DONE
    # The retry answers the refund; the stalled request says it did nothing.
    if face is _refund_by_rest:
        assert retry.status_code == 201, retry.content
        assert stalled["answer"].status_code == 409, stalled["answer"].content
        assert stalled["answer"].json()["code"] == "request_in_progress"
    else:
        assert retry.refusal is None and retry.operation["id"] == refunds.get().id
        assert stalled["answer"].refusal.code == "request_in_progress"
