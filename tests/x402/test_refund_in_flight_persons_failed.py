"""A person's "failed" on a refund
whose transfer back is broadcast but not mined is refused (`provider_processing`) and
changes nothing: the refund stays awaiting the chain, and once mined it is the chain's
"succeeded". (tests/x402/test_persons_failed_refund_awaiting_chain.py also accepts a run where the
word was taken and
its effects were contained; this one pins the refusal itself.) Real chain, automine off
is the chain's own control."""

from __future__ import annotations

import pytest

from payments import services
from payments.enums import Grade, Outcome
from payments.models import PaymentOperation
from tests.x402.test_persons_failed_refund_awaiting_chain import _approved
from tests.x402.test_refunds import _paid

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_persons_failed_on_a_refund_transfer_in_the_mempool_is_refused(
    agent, report, chain, people, settings
):
    settings.X402_REFUND_RECEIPT_TIMEOUT = 0.5
    resolver, requester, approver = people
    purchase, payer, _charge = _paid(agent, report, chain)
    refund = _approved(purchase, requester, approver)
    chain.automine(False)
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.AWAITING_PROVIDER  # broadcast, not mined

    with pytest.raises(services.DomainError) as refused:
        services.operation_resolve_manual(
            operation_id=refund.id,
            outcome="failed",
            reason="payer says nothing came back",
            actor="resolver",
            acting_user=resolver,
        )
    assert refused.value.code == "provider_processing"
    assert PaymentOperation.objects.get(pk=refund.pk).outcome == Outcome.AWAITING_PROVIDER

    chain.mine(3)
    chain.automine(True)
    services.operation_reconcile(operation_id=refund.id, actor="test")
    refund = PaymentOperation.objects.get(pk=refund.pk)
    assert (refund.outcome, refund.grade) == (Outcome.SUCCEEDED, Grade.CONFIRMED)
    assert chain.transfers_back(payer.address) == 1
