"""A person's "failed" is refused while the chain shows
the payer's transfer broadcast but not mined (it may still land), so no retry can pay
twice. Counted as Transfer logs on the real chain."""

from __future__ import annotations

import pytest

from payments import services
from payments.enums import Outcome
from payments.models import PaymentOperation
from support.models import Resolution
from tests.x402.test_faults import _op, _pay, _send

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_persons_failed_is_refused_while_the_transfer_is_pending(
    agent, report, chain, django_user_model
):
    purchase, payer, header, _auth = _pay(agent, report, chain)
    chain.automine(False)  # broadcast, not mined
    assert _send(agent, purchase, header).status_code == 202
    op = _op(purchase)
    assert op.outcome == Outcome.AWAITING_PROVIDER
    resolver = django_user_model.objects.create(username="resolver-x402")

    with pytest.raises(services.DomainError) as err:
        services.operation_resolve_manual(
            operation_id=op.id,
            outcome="failed",
            reason="payer says it never went",
            actor="resolver-x402",
            acting_user=resolver,
        )

    assert err.value.code == "provider_processing"
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.AWAITING_PROVIDER
    assert Resolution.objects.filter(operation_id=op.id).count() == 0
    chain.mine()
    assert services.operation_reconcile(operation_id=op.id).outcome == Outcome.SUCCEEDED
    assert chain.transfers(payer.address) == 1
