"""Issue 30 part C (h9): a person's "failed" on an x402 REFUND whose transfer back is
broadcast but not mined.

The rule of issue 30 #10 on x402 ("a person's 'failed' is refused while the transfer is
pending or broadcast-not-mined: it may still land") is applied to payments only
(`op.kind in PAYMENT_KINDS` in `operation_resolve_manual`). A refund's transfer back in
the mempool is accepted as `failed` (acknowledged); the refundable room is freed; a second
refund of the same amount is approved and sent; the first is mined meanwhile: the payer is
paid back twice (no read-back of the person's "failed" refund comes first either:
`operations_verify_before_follow_up` reads payments, captures and voids only). Counted as Transfer logs on the real chain (automine off is the chain's own
control)."""
from __future__ import annotations

import pytest

from payments import services
from payments.models import PaymentOperation
from tests.x402.conftest import agent, chain, report  # noqa: F401 (fixtures)
from tests.x402.conftest import settle_outbox
from tests.x402.test_refunds import _paid

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def people(django_user_model):
    return (django_user_model.objects.create(username="h9-support"),
            django_user_model.objects.create(username="h9-finance"),
            django_user_model.objects.create(username="h9-resolver"))


def _approved(purchase, requester, approver):
    refund = services.refund_request(purchase_id=purchase["id"], acting_user=requester)
    return services.refund_approve(operation_id=refund.id, acting_user=approver,
                                   reason="returned")


def test_a_refund_transfer_in_the_mempool_is_not_settled_failed_by_a_person(
        agent, report, chain, people, settings):
    settings.X402_REFUND_RECEIPT_TIMEOUT = 0.5
    requester, approver, resolver = people
    _paid(agent, report, chain)  # another buyer's payment: the signer holds more than one
    purchase, payer, charge = _paid(agent, report, chain)
    first = _approved(purchase, requester, approver)
    chain.automine(False)
    first = services.operation_dispatch(operation_id=first.id)
    assert first.outcome == "awaiting_provider"  # broadcast, not mined
    assert chain.transfers_back(payer.address) == 0

    try:
        services.operation_resolve_manual(operation_id=first.id, outcome="failed",
                                          reason="payer says nothing came back",
                                          actor="h9-resolver", acting_user=resolver)
    except services.DomainError as err:
        assert err.code == "provider_processing"  # the correct answer

    # the transfer back is mined; the payer's support asks again for the refund
    chain.mine()
    chain.automine(True)
    try:
        again = _approved(purchase, requester, approver)
        services.operation_dispatch(operation_id=again.id)
    except services.DomainError:
        pass  # refused: also correct
    for op in PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="refund"):
        try:
            services.operation_reconcile(operation_id=op.id, actor="test")
        except services.DomainError:
            pass
    settle_outbox()

    ops = list(PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="refund")
               .values_list("amount", "outcome", "grade"))
    assert chain.transfers_back(payer.address) == 1, f"the payer was paid back twice: {ops}"
