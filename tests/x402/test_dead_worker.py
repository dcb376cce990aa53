"""Persist before settle: a process that dies after phase 1 (authorization stored, settle
claimed) and before the answer leaves an operation the sweep makes `unknown` — never
failed, never settled again — until the chain proves what happened."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from payments import services
from payments.models import PaymentOperation, ProviderCall, Purchase, X402Authorization
from payments.providers.x402 import parse_payment_signature
from payments.services.x402_settle import _phase1
from tests.x402.chain import sign

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_dead_before_settle_is_unknown_then_failed_only_when_the_chain_proves_it(
    agent, report, chain, settings
):
    settings.X402_MAX_TIMEOUT_SECONDS = 60
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    payer = chain.new_payer()
    header, auth = sign(agent.get(url).headers["PAYMENT-REQUIRED"], payer)
    # Phase 1 as the request runs it; the process then dies before calling the facilitator.
    op, call = _phase1(
        purchase=Purchase.objects.get(id=purchase["id"]),
        api_client=agent.client,
        signed=parse_payment_signature(header),
    )
    assert call is not None and op.outcome == "dispatching"
    assert X402Authorization.objects.filter(operation=op, nonce=auth["nonce"].lower()).exists()
    PaymentOperation.objects.filter(id=op.id).update(
        dispatch_deadline=timezone.now() - timedelta(seconds=1)
    )

    services.operations_sweep_dead_dispatches()
    swept = PaymentOperation.objects.get(id=op.id)
    still = services.operation_reconcile(operation_id=op.id, actor="test")
    chain.expire(int(auth["validBefore"]))
    proven = services.operation_reconcile(operation_id=op.id, actor="test")

    assert swept.outcome == "unknown"  # never failed on a guess
    assert still.outcome == "unknown"  # unused but still valid: no verdict
    assert (proven.outcome, proven.reason) == ("failed", "authorization_expired")
    assert chain.transfers(payer.address) == 0
    assert ProviderCall.objects.filter(operation=op, purpose="dispatch").count() == 1
