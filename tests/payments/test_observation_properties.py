"""Hypothesis state machine over provider observations (out of order, duplicated, foreign):
no terminal outcome regresses; unknown never becomes failed without a failed record."""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from payments import services
from payments.enums import Outcome, Verification
from payments.models import PaymentOperation
from payments.providers.stripe import StripeObject
from tests.factories import PurchaseFactory

STATUSES = [
    "requires_confirmation",
    "processing",
    "requires_action",
    "succeeded",
    "requires_payment_method+error",
    "canceled",
    "requires_capture",
]
FAILED_STATUSES = {"requires_payment_method+error", "canceled"}
TERMINAL = {Outcome.SUCCEEDED, Outcome.FAILED}


class ObservationMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        purchase = PurchaseFactory()
        self.op = PaymentOperation.objects.create(
            purchase=purchase,
            kind="charge",
            amount=purchase.amount,
            currency=purchase.currency,
            provider_reference="pi_prop_" + purchase.id[-8:],
            outcome=Outcome.UNKNOWN,
            confirm_claimed_at=purchase.created_at,
        )
        self.terminal = None
        self.saw_failed_record = False

    def _obj(self, status, foreign):
        error = status.endswith("+error")
        return StripeObject(
            object_type="payment_intent",
            id=self.op.provider_reference,
            status=status.split("+")[0],
            amount=self.op.amount + (1 if foreign else 0),
            currency=self.op.currency.upper(),
            metadata={"operation_id": self.op.id, "purchase_id": self.op.purchase_id},
            has_payment_error=error,
            failure_code="card_declined" if error else "",
        )

    def _outcome(self):
        return PaymentOperation.objects.values_list("outcome", flat=True).get(id=self.op.id)

    @rule(
        status=st.sampled_from(STATUSES),
        source=st.sampled_from([Verification.WEBHOOK, Verification.PROVIDER]),
    )
    def observe(self, status, source):
        services.operation_apply_observation(
            operation_id=self.op.id, obj=self._obj(status, False), source=source, cause="property"
        )
        self.saw_failed_record |= status in FAILED_STATUSES

    @rule(status=st.sampled_from(STATUSES))
    def observe_foreign_object(self, status):
        before = self._outcome()
        result = services.operation_apply_observation(
            operation_id=self.op.id,
            obj=self._obj(status, True),
            source=Verification.WEBHOOK,
            cause="property",
        )
        assert result == services.ApplyResult.MISMATCH and self._outcome() == before

    @invariant()
    def terminal_never_regresses(self):
        outcome = self._outcome()
        if self.terminal is not None:
            assert outcome == self.terminal, "a terminal outcome regressed or flipped"
        if outcome in TERMINAL:
            self.terminal = outcome

    @invariant()
    def failed_only_with_a_failed_record(self):
        if self._outcome() == Outcome.FAILED:
            assert self.saw_failed_record, "failed without a failed provider record"


@pytest.mark.django_db
def test_observation_state_machine():
    run_state_machine_as_test(
        ObservationMachine,
        settings=settings(
            max_examples=60,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
