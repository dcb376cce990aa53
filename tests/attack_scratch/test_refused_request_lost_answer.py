"""A one-call create the provider refuses before executing (a 4xx: an unknown payment
method), its answer lost on the way back. The provider keeps no answer under the key for a
refusal, so the re-send under the same key is refused the same way: nothing was charged
and nothing can be. Where the first answer arrives the payment is `failed`
(`invalid_request`) at once; where it was lost, does the re-send's refusal settle it?"""
import pytest

from payments import services
from payments.enums import CallStep, Outcome
from payments.models import PaymentOperation
from payments.providers.stripe import DrillMode

from .helpers import calls, provider_count, start

pytestmark = pytest.mark.django_db(transaction=True)


STRANDED = ("CONFIRMED: a re-send refused 4xx (not idempotency_error) is not taken as the "
            "provider's statement that nothing ran under the key: the payment stays unknown")


@pytest.mark.xfail(strict=True, reason=STRANDED)
def test_a_refused_one_call_create_whose_answer_was_lost(new_purchase, api_client, one_call,
                                                         drill):
    purchase = new_purchase()
    op = start(purchase, api_client, method="pm_doesnotexist")
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY)
    op = services.operation_dispatch(operation_id=op.id)
    replays = calls(op, "replay")
    # Asked again on the schedule: the same refusal each time.
    for _ in range(2):
        op = services.operation_reconcile(operation_id=op.id)
    counts = provider_count(one_call, purchase)
    print("outcome:", op.outcome, op.reason, "replays:", calls(op, "replay"),
          "provider:", counts)
    assert counts == (0, 0, 0)
    # The buyer may pay this purchase with another card only once the first is settled.
    retry = None
    if op.outcome == Outcome.FAILED:
        retry = services.operation_dispatch(operation_id=start(
            purchase, api_client, method="pm_card_visa", retry_of=op.id).id).outcome
    assert op.outcome == Outcome.FAILED, (
        f"a refused request (nothing charged, nothing stored under the key) left "
        f"{op.outcome}; re-sends {replays} then {calls(op, 'replay')}; provider {counts}")
    assert retry == Outcome.SUCCEEDED


@pytest.mark.xfail(strict=True, reason="CONFIRMED: a person's failed on a one-call payment the "
                   "provider has no record of stays acknowledged; every retry answers "
                   "original_unverified")
def test_a_person_cannot_free_such_a_purchase(new_purchase, api_client, one_call, drill):
    """What support can do with it: settle it failed by hand, then the buyer retries."""
    purchase = new_purchase()
    op = start(purchase, api_client, method="pm_doesnotexist")
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY)
    op = services.operation_dispatch(operation_id=op.id)
    if op.outcome != Outcome.UNKNOWN:
        pytest.skip(f"settled {op.outcome} by itself")
    services.operation_resolve_manual(operation_id=op.id, outcome=Outcome.FAILED,
                                      reason="card did not exist", actor="support:alice")
    op = PaymentOperation.objects.get(id=op.id)
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
    print("original:", op.outcome, op.grade, "retries:", refused,
          "provider:", provider_count(one_call, purchase))
    assert refused[-1] == Outcome.SUCCEEDED, (
        f"purchase stranded: original {op.outcome}/{op.grade}, retries {refused}, "
        f"provider {provider_count(one_call, purchase)}")
