"""Refunds on the x402 rail: a separate token transfer back to the payer, from the refund
signer (a separate refund account with a float, never pay_to), after an
operator's approval — counted on the real chain. There is no void: the transfer in is final."""

from __future__ import annotations

import pytest

from payments import services
from payments.models import PaymentOperation, ProviderCall, X402RefundTransfer
from payments.providers.x402 import DrillMode, get_refund_sender
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)

PRICE_ATOMIC = 1250 * 10**4  # the report's 12.50 USD in USDC's 6 decimals


def _paid(agent, report, chain):
    purchase = agent.new_purchase(report.sku)
    required = agent.get(f"purchases/{purchase['id']}/deliverable").headers["PAYMENT-REQUIRED"]
    payer = chain.new_payer()
    header, _auth = sign(required, payer)
    r = agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header})
    assert r.status_code in (200, 202), r.content
    charge = PaymentOperation.objects.get(purchase_id=purchase["id"], kind="charge")
    assert (charge.rail, charge.outcome) == ("x402", "succeeded")
    assert chain.transfers(payer.address) == 1
    return purchase, payer, charge


def _request(purchase, requester) -> PaymentOperation:
    refund = services.refund_request(purchase_id=purchase["id"], acting_user=requester)
    assert (refund.kind, refund.rail, refund.outcome) == ("refund", "x402", "awaiting_approval")
    return refund


def _sends(op) -> int:
    return ProviderCall.objects.filter(operation=op, purpose="dispatch", step="refund").count()


def test_an_approved_refund_is_exactly_one_transfer_back_on_chain(agent, report, chain, people):
    purchase, payer, charge = _paid(agent, report, chain)
    _, requester, approver = people
    refund = _request(purchase, requester)
    assert chain.transfers_back(payer.address) == 0  # nothing moves before approval
    with pytest.raises(services.DomainError) as err:
        services.refund_approve(operation_id=refund.id, acting_user=requester, reason="ok")
    assert err.value.code == "approver_is_requester"

    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")
    done = services.operation_dispatch(operation_id=refund.id)
    again = services.operation_dispatch(operation_id=refund.id)  # a second dispatch: no-op
    settle_outbox()

    assert (done.outcome, done.verification) == ("succeeded", "provider"), done.reason
    assert again.outcome == "succeeded"
    assert chain.transfers_back(payer.address) == 1
    assert chain.balance(payer.address) == 1_000 * 10**6  # all of it came back
    row = X402RefundTransfer.objects.get(operation=refund)
    assert row.to_address == payer.address and row.value == str(PRICE_ATOMIC)
    assert row.from_address == chain.refund_account and row.transaction_hash and row.block_number
    assert _sends(refund) == 1
    assert PaymentOperation.objects.get(id=refund.id).purchase.status == "refunded"
    view = agent.get(f"operations/{refund.id}").json()
    assert view["x402"]["transaction"] == row.transaction_hash
    assert view["x402"]["payer"] == payer.address and view["x402"]["valid_before"] is None
    # the read-back (receipt + Transfer log) says the same, and sends nothing
    seen = services.operation_read_canonical(operation_id=refund.id)
    assert (seen.object_type, seen.status, seen.id) == (
        "x402_transfer",
        "confirmed",
        row.transaction_hash,
    )
    assert chain.transfers_back(payer.address) == 1 and _sends(refund) == 1


def test_a_lost_answer_is_unknown_and_the_receipt_settles_it(agent, report, chain, people):
    purchase, payer, _charge = _paid(agent, report, chain)
    _, requester, approver = people
    refund = _request(purchase, requester)
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")
    get_refund_sender().arm_drill(to=payer.address, mode=DrillMode.DROP_ANSWER_AFTER_SEND)

    lost = services.operation_dispatch(operation_id=refund.id)

    assert lost.outcome == "unknown"
    assert X402RefundTransfer.objects.get(operation=refund).transaction_hash  # before send
    assert chain.transfers_back(payer.address) == 1  # it did leave
    settled = services.operation_reconcile(operation_id=refund.id, actor="test")
    assert (settled.outcome, settled.verification) == ("succeeded", "provider")
    assert services.operation_dispatch(operation_id=refund.id).outcome == "succeeded"
    settle_outbox()
    assert chain.transfers_back(payer.address) == 1 and _sends(refund) == 1


def test_a_transfer_back_not_yet_mined_waits_for_the_chain(agent, report, chain, people, settings):
    settings.X402_REFUND_RECEIPT_TIMEOUT = 0.5
    purchase, payer, _charge = _paid(agent, report, chain)
    _, requester, approver = people
    refund = _request(purchase, requester)
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")
    chain.automine(False)

    waiting = services.operation_dispatch(operation_id=refund.id)

    assert waiting.outcome == "awaiting_provider"
    assert chain.transfers_back(payer.address) == 0
    assert (
        services.operation_reconcile(operation_id=refund.id, actor="test").outcome
        == "awaiting_provider"
    )  # not mined: never failed, never sent again
    chain.mine()
    assert services.operation_reconcile(operation_id=refund.id, actor="test").outcome == "succeeded"
    settle_outbox()
    assert chain.transfers_back(payer.address) == 1 and _sends(refund) == 1


def test_a_declined_refund_moves_nothing(agent, report, chain, people):
    purchase, payer, _charge = _paid(agent, report, chain)
    _, requester, _approver = people
    refund = _request(purchase, requester)

    declined = services.refund_decline(
        operation_id=refund.id, reason="not returned", actor="finance-ok"
    )
    services.operation_dispatch(operation_id=refund.id)
    settle_outbox()

    assert (declined.outcome, declined.reason) == ("failed", "refund_declined")
    assert chain.transfers_back(payer.address) == 0
    assert not X402RefundTransfer.objects.filter(operation=refund).exists()
    assert _sends(refund) == 0


def test_the_api_request_waits_for_approval_and_there_is_no_void(report, chain, shop, agent):
    purchase, payer, _charge = _paid(shop, report, chain)
    # another client's purchase is not found, and nothing is stored
    assert agent.post(f"purchases/{purchase['id']}/refunds", {}).status_code in (403, 404)

    r = shop.post(f"purchases/{purchase['id']}/refunds", {})

    assert r.status_code in (201, 202), r.content
    refund = PaymentOperation.objects.get(purchase_id=purchase["id"], kind="refund")
    assert (refund.rail, refund.outcome) == ("x402", "awaiting_approval")  # no allowance
    assert r.json()["rail"] == "x402" and r.json()["outcome"] == "awaiting_approval"
    with pytest.raises(services.DomainError) as err:
        services.void_create(purchase_id=purchase["id"])
    assert (err.value.code, err.value.status) == ("x402_has_no_void", 409)
    settle_outbox()
    assert chain.transfers_back(payer.address) == 0
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 2


def test_without_a_refund_signer_the_refund_is_refused_and_nothing_is_stored(
    agent, report, chain, people, settings
):
    purchase, payer, _charge = _paid(agent, report, chain)
    settings.X402_REFUND_PRIVATE_KEY = ""

    with pytest.raises(services.DomainError) as err:
        services.refund_request(purchase_id=purchase["id"], acting_user=people.requester)

    assert (err.value.code, err.value.status) == ("x402_refund_signer_missing", 409)
    assert not PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="refund").exists()
    assert chain.transfers_back(payer.address) == 0
