"""What a buyer may choose is bounded and checked before an
operation exists, a payment that cannot pay answers 402 with PAYMENT-REQUIRED (the x402
v2 HTTP transport) and the SDK's reason, the forwarded payload is exactly what was
checked, and another API client's ids never leak. Counted on the real chain."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import Group, User

from payments import services
from payments.models import PaymentOperation, ProviderCall, X402Authorization
from payments.providers.x402 import decode_header
from support.access import Role, ensure_groups
from tests.api.client import Api
from tests.factories import make_client
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, craft, sign

pytestmark = pytest.mark.django_db(transaction=True)

PRICE_ATOMIC = 1250 * 10**4


def _required(agent, report):
    purchase = agent.new_purchase(report.sku)
    r = agent.get(f"purchases/{purchase['id']}/deliverable")
    return purchase, r.headers["PAYMENT-REQUIRED"]


def _send(agent, purchase, header):
    return agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header})


def _nothing_happened(purchase, payer, chain):
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0
    assert ProviderCall.objects.filter(operation__purchase_id=purchase["id"]).count() == 0
    assert chain.transfers(payer.address) == 0


def _refused_402(r, error: str, code: str):
    assert r.status_code == 402, r.content
    assert decode_header(r.headers["PAYMENT-REQUIRED"])["error"] == error
    assert "PAYMENT-REQUIRED" in r.headers["Access-Control-Expose-Headers"]
    assert r.json()["code"] == code and r.json()["error"] == error


# -- item 2: validBefore bounded; a stored chain value never breaks a view ---------------
@pytest.mark.parametrize(
    "valid_before",
    [
        "days",  # ten days: far beyond maxTimeoutSeconds
        253402300800,  # year 10000
        2**63,  # beyond PostgreSQL's bigint
        2**256 - 1,  # uint256's largest
    ],
)
def test_a_valid_before_beyond_the_requirements_timeout_is_refused_402(
    agent, report, chain, valid_before
):
    purchase, required = _required(agent, report)
    payer = chain.new_payer()
    if valid_before == "days":
        valid_before = int(time.time()) + 10 * 86400
    header, _auth = craft(required, payer, validBefore=valid_before)

    r = _send(agent, purchase, header)

    _refused_402(
        r, "invalid_exact_evm_payload_authorization_valid_before", "authorization_expires_too_late"
    )
    _nothing_happened(purchase, payer, chain)
    assert agent.get(f"purchases/{purchase['id']}").status_code == 200


def test_a_valid_before_within_the_timeout_and_skew_is_accepted(agent, report, chain):
    purchase, required = _required(agent, report)
    payer = chain.new_payer()
    header, _auth = craft(required, payer, validBefore=int(time.time()) + 300 + 30)

    r = _send(agent, purchase, header)

    assert r.status_code in (200, 202), r.content
    assert chain.transfers(payer.address) == 1


def test_a_stored_valid_before_no_datetime_can_hold_never_breaks_a_view(
    agent, report, chain, client
):
    purchase, required = _required(agent, report)
    payer = chain.new_payer()
    header, _auth = sign(required, payer)
    assert _send(agent, purchase, header).status_code in (200, 202)
    settle_outbox()
    # A row stored before the bound existed (the buyer chose year 10000).
    X402Authorization.objects.filter(operation__purchase_id=purchase["id"]).update(
        valid_before=2**63 - 1
    )
    ensure_groups()
    user = User.objects.create_user(username="olga-vb", password="pw")
    user.groups.add(*Group.objects.filter(name=Role.OPERATOR))
    client.force_login(user)

    view = agent.get(f"purchases/{purchase['id']}")
    page = client.get(f"/console/purchases/{purchase['id']}/")
    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    status = client.get(f"/status/{op.purchase.status_token}/")

    assert view.status_code == 200, view.content
    assert view.json()["payment"]["x402"]["valid_before"] is None
    assert page.status_code == 200 and status.status_code == 200


# -- item 3: cheap checks before an operation and a settle ---------------------------------
def test_an_unfunded_payer_is_refused_before_any_operation_or_settle(agent, report, chain):
    purchase, required = _required(agent, report)
    payer = chain.new_payer(funds=PRICE_ATOMIC - 1)
    header, _auth = sign(required, payer)

    r = _send(agent, purchase, header)

    _refused_402(r, "invalid_exact_evm_insufficient_balance", "insufficient_balance")
    _nothing_happened(purchase, payer, chain)


def test_a_signature_by_someone_else_is_refused_before_any_operation_or_settle(
    agent, report, chain
):
    purchase, required = _required(agent, report)
    payer, stranger = chain.new_payer(), chain.new_payer()
    header, _auth = craft(required, payer, signer=stranger)

    r = _send(agent, purchase, header)

    _refused_402(r, "invalid_exact_evm_payload_signature", "authorization_invalid")
    _nothing_happened(purchase, payer, chain)


# -- item 5: only what was checked is forwarded; ids of other clients never leak ----------
def test_a_permit2_authorization_beside_the_eip3009_one_is_refused(agent, report, chain):
    purchase, required = _required(agent, report)
    payer = chain.new_payer()
    header, _auth = craft(
        required,
        payer,
        inner_extra={
            "permit2Authorization": {
                "from": payer.address,
                "permitted": {"token": chain.token.address, "amount": str(PRICE_ATOMIC)},
                "spender": payer.address,
                "nonce": "1",
                "deadline": "9999999999",
                "witness": {"to": payer.address, "validAfter": "0"},
            }
        },
    )

    r = _send(agent, purchase, header)

    assert r.status_code == 400 and r.json()["code"] == "payment_signature_invalid", r.content
    _nothing_happened(purchase, payer, chain)


def test_the_permit2_transfer_method_is_refused_402(agent, report, chain):
    purchase, required = _required(agent, report)
    payer = chain.new_payer()
    header, _auth = craft(required, payer, accepted_extra={"assetTransferMethod": "permit2"})

    r = _send(agent, purchase, header)

    _refused_402(r, "No matching payment requirements", "payment_requirements_mismatch")
    _nothing_happened(purchase, payer, chain)


def test_the_409s_never_show_another_api_clients_purchase_or_operation(agent, report, chain):
    purchase, required = _required(agent, report)
    payer = chain.new_payer()
    header, _auth = sign(required, payer, payment_id="client-a-payment-0000001")
    assert _send(agent, purchase, header).status_code in (200, 202)
    theirs = PaymentOperation.objects.get(purchase_id=purchase["id"])
    other_client, key = make_client(
        scopes=("purchases:read", "purchases:write"), limit=10_000_000, name="other"
    )
    other = Api(key, other_client)
    mine, _ = _required(other, report)

    same_auth = _send(other, mine, header)

    assert same_auth.status_code == 409, same_auth.content
    body = same_auth.content.decode()
    assert theirs.id not in body and purchase["id"] not in body
    assert same_auth.json()["operation"] is None
    assert chain.transfers(payer.address) == 1
    assert PaymentOperation.objects.filter(purchase_id=mine["id"]).count() == 0


def test_a_payment_identifier_belongs_to_its_api_client(agent, report, chain):
    """The `payment-identifier` extension is the buyer's idempotency key: like
    `Idempotency-Key` it names a payment among its own client's. Another client's payment
    with the same identifier is neither found, replayed nor refused: its own payment."""
    purchase, required = _required(agent, report)
    header, _ = sign(required, chain.new_payer(), payment_id="shared-payment-id-0001")
    assert _send(agent, purchase, header).status_code in (200, 202)
    theirs = PaymentOperation.objects.get(purchase_id=purchase["id"])
    other_client, key = make_client(
        scopes=("purchases:read", "purchases:write"), limit=10_000_000, name="other"
    )
    other = Api(key, other_client)
    mine, mine_required = _required(other, report)
    payer = chain.new_payer()
    same_id, _ = sign(mine_required, payer, payment_id="shared-payment-id-0001")

    r = _send(other, mine, same_id)

    assert r.status_code in (200, 202) and "Payment-Replayed" not in r.headers, r.content
    assert theirs.id not in r.content.decode() and purchase["id"] not in r.content.decode()
    op = PaymentOperation.objects.get(purchase_id=mine["id"])
    assert op.id != theirs.id and op.outcome == "succeeded"
    assert chain.transfers(payer.address) == 1
    assert (
        X402Authorization.objects.filter(payment_identifier="shared-payment-id-0001").count() == 2
    )
    # within its own client the identifier still names one payment (409 on another)
    again, again_required = _required(other, report)
    reused, _ = sign(again_required, chain.new_payer(), payment_id="shared-payment-id-0001")
    refused = _send(other, again, reused)
    assert refused.status_code == 409 and refused.json()["code"] == "payment_identifier_reused", (
        refused.content
    )


def test_the_log_search_starts_where_the_nonce_was_read_unused(agent, report, chain):
    purchase, required = _required(agent, report)
    payer = chain.new_payer()
    header, _auth = sign(required, payer)
    before = chain.w3.eth.block_number

    _send(agent, purchase, header)

    auth = X402Authorization.objects.get(operation__purchase_id=purchase["id"])
    assert auth.settle_answer["search_from_block"] == before
    mined = chain.w3.eth.get_transaction_receipt(auth.transaction_hash)["blockNumber"]
    assert before < mined


def test_a_facilitators_success_is_paid_by_the_receipt_read_at_once(agent, report, chain, settings):
    """On or off the local chain, the facilitator's word is not the proof: its "success"
    is followed at once by the chain's read-back, which finds THIS authorization's
    transfer."""
    for local in (True, False):
        settings.X402_LOCAL_CHAIN = local
        purchase, required = _required(agent, report)
        payer = chain.new_payer()
        header, _auth = sign(required, payer)

        r = _send(agent, purchase, header)

        op = PaymentOperation.objects.get(purchase_id=purchase["id"])
        assert r.status_code in (200, 202) and op.outcome == "succeeded", r.content
        assert chain.transfers(payer.address) == 1
        auth = X402Authorization.objects.get(pk=op.id)
        assert op.provider_reference == auth.proof_transaction == auth.transaction_hash
        assert chain.paid_in(op.provider_reference, payer.address, PRICE_ATOMIC)


# -- item 4: the RPC must serve X402_NETWORK's chain ---------------------------------------
def test_an_rpc_of_another_chain_refuses_payments_and_gives_no_verdict(
    agent, report, chain, settings
):
    purchase, required = _required(agent, report)
    payer = chain.new_payer()
    header, _auth = sign(required, payer)
    chain.automine(False)
    assert _send(agent, purchase, header).status_code == 202  # pending on the real chain
    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    settings.X402_NETWORK = "eip155:8453"  # misconfigured: the RPC serves 31337
    other, other_required = _required(agent, report)
    other_header, _ = craft(other_required, chain.new_payer())

    refused = _send(agent, other, other_header)
    read = services.operation_reconcile(operation_id=op.id, actor="test")

    assert refused.status_code == 503 and refused.json()["code"] == "chain_mismatch", (
        refused.content
    )
    assert PaymentOperation.objects.filter(purchase_id=other["id"]).count() == 0
    assert read.outcome == "awaiting_provider"  # no verdict from a chain it cannot trust
    chain.mine()


def test_the_first_402_is_payment_required_not_a_decline(agent, report, chain):
    purchase = agent.new_purchase(report.sku)

    r = agent.get(f"purchases/{purchase['id']}/deliverable")

    assert r.status_code == 402 and r.headers["PAYMENT-REQUIRED"], r.content
    body = r.json()
    assert (body["title"], body["code"]) == ("Payment required", "payment_required"), body
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0
