"""A one-call create the provider refuses before executing (a 4xx: an unknown payment
method), its answer lost on the way back. The provider keeps no answer under the key for a
refusal, so the re-send of the byte-identical request under the same key is refused the
same way, and that refusal is the provider's statement that nothing ran: `failed`
(`invalid_request`), as when the first send hears the refusal itself. Where even the
re-send's answer is lost and a person settles it `failed`, the follow-up read (no
PaymentIntent of the operation, past the in-flight window) confirms that word, so the buyer
can pay again."""

import time

import pytest

from payments import services
from payments.enums import CallStep, Grade, Outcome, Reason
from payments.models import PaymentOperation
from payments.providers.stripe import DrillMode

from .one_call_helpers import calls, provider_count, start

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_refused_one_call_create_whose_answer_was_lost(new_purchase, api_client, one_call, drill):
    purchase = new_purchase()
    op = start(purchase, api_client, method="pm_doesnotexist")
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY)
    op = services.operation_dispatch(operation_id=op.id)
    replays = calls(op, "replay")
    counts = provider_count(one_call, purchase)
    print("outcome:", op.outcome, op.reason, "replays:", replays, "provider:", counts)
    assert counts == (0, 0, 0)
    assert [(s, c) for s, _, c in replays] == [("pay", "rejected")]
    assert (op.outcome, op.grade, op.reason) == (
        Outcome.FAILED,
        Grade.CONFIRMED,
        Reason.INVALID_REQUEST,
    ), (
        f"a refused request (nothing charged, nothing stored under the key) left "
        f"{op.outcome}; re-sends {replays}; provider {counts}"
    )
    # The buyer pays this purchase with another card.
    retry = services.operation_dispatch(
        operation_id=start(purchase, api_client, method="pm_card_visa", retry_of=op.id).id
    )
    assert retry.outcome == Outcome.SUCCEEDED
    assert provider_count(one_call, purchase) == (1, 1, 1)


def test_a_person_can_free_such_a_purchase(
    new_purchase, api_client, one_call, drill, read_drill, settings
):
    """The re-send's answer lost too and the read unavailable: `unknown`. Support settles
    it failed by hand; once past the in-flight window the read-back (no PaymentIntent of
    this operation) confirms the person's word, and the buyer's retry goes through."""
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 1
    purchase = new_purchase()
    op = start(purchase, api_client, method="pm_doesnotexist")
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY, times=2)
    read_drill(times=1)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    services.operation_resolve_manual(
        operation_id=op.id,
        outcome=Outcome.FAILED,
        reason="card did not exist",
        actor="support:alice",
    )
    time.sleep(1.1)  # past the in-flight window of the last send
    op = PaymentOperation.objects.get(id=op.id)
    assert (op.outcome, op.grade) == (Outcome.FAILED, Grade.ACKNOWLEDGED)
    refused = []
    for _ in range(3):  # the buyer tries again, as told (retry: same_key)
        try:
            retry = start(purchase, api_client, method="pm_card_visa", retry_of=op.id)
            refused.append(services.operation_dispatch(operation_id=retry.id).outcome)
            break
        except services.DomainError as exc:
            refused.append((exc.code, exc.status))
            services.operation_reconcile(operation_id=op.id)  # the follow-up read-back
    op = PaymentOperation.objects.get(id=op.id)
    counts = provider_count(one_call, purchase)
    print("original:", op.outcome, op.grade, "retries:", refused, "provider:", counts)
    assert (op.outcome, op.grade) == (Outcome.FAILED, Grade.CONFIRMED)
    assert refused[-1] == Outcome.SUCCEEDED, (
        f"purchase stranded: original {op.outcome}/{op.grade}, retries {refused}, provider {counts}"
    )
    assert counts == (1, 1, 1)


def test_a_persons_failed_inside_the_in_flight_window_is_not_confirmed(
    new_purchase, api_client, one_call, drill, read_drill
):
    """Inside the in-flight window (60 s by default) a read that finds no PaymentIntent
    proves nothing yet: the person's word stays acknowledged."""
    purchase = new_purchase()
    op = start(purchase, api_client, method="pm_doesnotexist")
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY, times=2)
    read_drill(times=1)
    op = services.operation_dispatch(operation_id=op.id)
    services.operation_resolve_manual(
        operation_id=op.id,
        outcome=Outcome.FAILED,
        reason="card did not exist",
        actor="support:alice",
    )
    op = services.operation_reconcile(operation_id=op.id)
    assert (op.outcome, op.grade) == (Outcome.FAILED, Grade.ACKNOWLEDGED)
    assert provider_count(one_call, purchase) == (0, 0, 0)
