"""A person's "failed" on an x402 REFUND whose transfer back is
broadcast but not mined.

The rule of on x402 ("a person's 'failed' is refused while the transfer is
pending or broadcast-not-mined: it may still land") is applied to payments only
(`op.kind in PAYMENT_KINDS` in `operation_resolve_manual`). A refund's transfer back in
the mempool is accepted as `failed` (acknowledged); the refundable room is freed; a second
refund of the same amount is approved and sent; the first is mined meanwhile: the payer is
paid back twice (no read-back of the person's "failed" refund comes first either:
`operations_verify_before_follow_up` reads payments, captures and voids only). Counted as Transfer
logs on the real chain (automine off is the chain's own
control)."""

from __future__ import annotations

import pytest

from payments import services
from payments.models import PaymentOperation
from tests.outbox import settle_outbox
from tests.x402.test_refunds import _paid

pytestmark = pytest.mark.django_db(transaction=True)


def _approved(purchase, requester, approver):
    refund = services.refund_request(purchase_id=purchase["id"], acting_user=requester)
    return services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")


def test_a_refund_transfer_in_the_mempool_is_not_settled_failed_by_a_person(
    agent, report, chain, people, settings
):
    settings.X402_REFUND_RECEIPT_TIMEOUT = 0.5
    resolver, requester, approver = people
    _paid(agent, report, chain)  # another buyer's payment: the signer holds more than one
    purchase, payer, charge = _paid(agent, report, chain)
    first = _approved(purchase, requester, approver)
    chain.automine(False)
    first = services.operation_dispatch(operation_id=first.id)
    assert first.outcome == "awaiting_provider"  # broadcast, not mined
    assert chain.transfers_back(payer.address) == 0

    try:
        services.operation_resolve_manual(
            operation_id=first.id,
            outcome="failed",
            reason="payer says nothing came back",
            actor="resolver",
            acting_user=resolver,
        )
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

    ops = list(
        PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="refund").values_list(
            "amount", "outcome", "grade"
        )
    )
    assert chain.transfers_back(payer.address) == 1, f"the payer was paid back twice: {ops}"


def test_a_duplicates_compensation_in_the_mempool_called_failed_is_not_sent_again(
    agent, report, chain, people, settings
):
    """The same gap, with no person asking again: the compensation of an x402 duplicate
    is broadcast, not mined; a person calls it "failed" (accepted: refund kinds are not
    guarded); the compensation's failed follow-up (`recovery.orchestrator`,
    `_duplicate_settled(op.parent)`) makes a NEW compensation for the room the person's
    word freed, and sends it. Both land: the duplicate is returned twice."""
    from payments.providers.x402 import DrillMode, get_facilitator
    from tests.x402.chain import SIGNATURE, sign

    settings.X402_REFUND_RECEIPT_TIMEOUT = 0.5
    resolver, _requester, _approver = people
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    required = agent.get(url).headers["PAYMENT-REQUIRED"]
    payer = chain.new_payer()
    chain.automine(False)
    header, auth = sign(required, payer, payment_id="dup-0001-abcdef-one")
    get_facilitator().arm_drill(
        payer=payer.address, nonce=auth["nonce"], mode=DrillMode.DROP_ANSWER_AFTER_SEND
    )
    agent.get(url, **{SIGNATURE: header})
    [first] = PaymentOperation.objects.filter(purchase_id=purchase["id"])
    services.operation_resolve_manual(
        operation_id=first.id,
        outcome="failed",
        reason="payer says nothing left",
        actor="resolver",
        acting_user=resolver,
    )
    # the given, built explicitly as tests/payments/test_provider_outranks_people.py
    # `_charged_twice` does (a retry of a person's "failed" now waits for the chain): while
    # the agent pays again, the first failure reads as if the chain had confirmed it
    wrong_word = PaymentOperation.objects.filter(id=first.id)
    grade = wrong_word.values_list("grade", "verification").get()
    wrong_word.update(grade="confirmed", verification="provider")
    other, _auth2 = sign(required, payer, payment_id="dup-0002-abcdef-two")
    agent.get(url, **{SIGNATURE: other})
    wrong_word.update(grade=grade[0], verification=grade[1])
    chain.mine(3)
    chain.automine(True)
    second = PaymentOperation.objects.exclude(pk=first.pk).get(
        purchase_id=purchase["id"], kind="charge"
    )
    services.operation_reconcile(operation_id=second.id, actor="test")
    services.operation_reconcile(operation_id=first.id, actor="test")
    assert chain.transfers(payer.address) == 2  # paid twice: the given
    [comp] = PaymentOperation.objects.filter(parent=first, kind="refund")

    # the compensation's transfer back is broadcast, not mined
    chain.automine(False)
    comp = services.operation_dispatch(operation_id=comp.id)
    assert comp.outcome == "awaiting_provider"
    try:
        services.operation_resolve_manual(
            operation_id=comp.id,
            outcome="failed",
            reason="payer says nothing came back",
            actor="resolver",
            acting_user=resolver,
        )
    except services.DomainError:
        pass  # refused (provider_processing): the correct answer
    settle_outbox()
    chain.mine(3)
    chain.automine(True)
    for op in PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="refund"):
        try:
            services.operation_reconcile(operation_id=op.id, actor="test")
        except services.DomainError:
            pass
    settle_outbox()

    ops = list(
        PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="refund").values_list(
            "amount", "outcome", "grade", "is_compensation"
        )
    )
    assert chain.transfers_back(payer.address) == 1, f"the duplicate came back twice: {ops}"
