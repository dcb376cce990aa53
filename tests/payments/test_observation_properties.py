"""Property test over random sequences of provider observations (out of order, duplicated):
no terminal outcome regresses; unknown never becomes failed without a failed record."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from payments import services
from payments.enums import Outcome, Verification
from payments.models import PaymentOperation
from payments.providers.base import ProviderObject
from tests.factories import PurchaseFactory

STATUSES = ["requires_confirmation", "processing", "requires_action", "succeeded",
            "requires_payment_method+error", "canceled", "requires_capture"]
FAILED_STATUSES = {"requires_payment_method+error", "canceled"}
TERMINAL = {Outcome.SUCCEEDED, Outcome.FAILED}

observations = st.lists(
    st.tuples(st.sampled_from(STATUSES),
              st.sampled_from([Verification.WEBHOOK, Verification.PROVIDER]),
              st.booleans()),  # True = a foreign object (mismatching amount)
    min_size=1, max_size=12)


def _obj(op, status, foreign):
    error = status.endswith("+error")
    return ProviderObject(
        object_type="payment_intent", id=op.provider_reference, status=status.split("+")[0],
        amount=op.amount + (1 if foreign else 0), currency=op.currency.upper(),
        metadata={"operation_id": op.id, "purchase_id": op.purchase_id},
        has_payment_error=error, failure_code="card_declined" if error else "")


@pytest.mark.django_db
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(seq=observations)
def test_observation_sequences_never_regress(seq):
    purchase = PurchaseFactory()
    op = PaymentOperation.objects.create(
        purchase=purchase, kind="charge", amount=purchase.amount, currency=purchase.currency,
        provider_reference="pi_prop_" + purchase.id[-8:], outcome=Outcome.UNKNOWN,
        confirm_claimed_at=purchase.created_at)
    seen_terminal = None
    seen_failed_record = False
    for status, source, foreign in seq:
        before = PaymentOperation.objects.get(id=op.id).outcome
        result = services.operation_apply_observation(operation_id=op.id,
                                                      obj=_obj(op, status, foreign),
                                                      source=source, cause="property")
        after = PaymentOperation.objects.get(id=op.id).outcome
        if foreign:
            assert result == services.ApplyResult.MISMATCH and after == before
        elif status in FAILED_STATUSES:
            seen_failed_record = True
        if seen_terminal is not None:
            assert after == seen_terminal, "a terminal outcome regressed or flipped"
        if after in TERMINAL:
            seen_terminal = after
        if after == Outcome.FAILED:
            assert seen_failed_record, "failed without a failed provider record"
