"""A hosted facilitator. The SDK's own facilitator with authentication turned
on (its sandbox route plays the CDP facilitator's bearer requirement): Verity sends its
credential, checks /supported for the configured scheme and network before the first
settle, and `settlement_pending` answered as HTTP 500 keeps working."""
from __future__ import annotations

import os

import pytest

from payments import services
from payments.models import PaymentOperation, ProviderCall
from payments.providers.x402 import (
    FacilitatorClient,
    FacilitatorUnsupported,
    SettleKind,
    classify_settle,
)
from tests.x402.conftest import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "hosted-facilitator-jwt-0001"


@pytest.fixture
def hosted(chain):
    chain.facilitator_config(bearer=TOKEN)
    yield chain
    chain.facilitator_config(bearer="")


def _pay(agent, report, chain, *, slow_chain: bool = False):
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    payer = chain.new_payer()
    header, _ = sign(agent.get(url).headers["PAYMENT-REQUIRED"], payer)
    if slow_chain:
        chain.automine(False)  # broadcast, not mined: the facilitator answers pending
    return purchase, payer, agent.get(url, **{SIGNATURE: header})


def test_with_its_credential_verity_pays_through_an_authenticating_facilitator(
        agent, report, hosted, settings):
    settings.X402_FACILITATOR_AUTH_TOKEN = TOKEN

    purchase, payer, r = _pay(agent, report, hosted)

    assert r.status_code in (200, 202), r.content
    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    assert op.outcome == "succeeded"
    assert hosted.transfers(payer.address) == 1


def test_a_refused_credential_stores_nothing_and_moves_nothing(agent, report, hosted,
                                                               settings):
    settings.X402_FACILITATOR_AUTH_TOKEN = "not-the-token"

    purchase, payer, r = _pay(agent, report, hosted)

    assert r.status_code == 503 and r.json()["code"] == "facilitator_unsupported", r.content
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0
    assert hosted.transfers(payer.address) == 0


def test_pending_as_http_500_from_an_authenticating_facilitator_is_awaiting(
        agent, report, hosted, settings):
    settings.X402_FACILITATOR_AUTH_TOKEN = TOKEN
    hosted.facilitator_config(pending_status=500)

    purchase, payer, r = _pay(agent, report, hosted, slow_chain=True)

    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    assert r.status_code == 202 and op.outcome == "awaiting_provider", r.content
    call = ProviderCall.objects.get(operation=op, step="settle")
    assert call.http_status == 500 and call.error_code == "settlement_pending"
    hosted.mine()
    assert services.operation_reconcile(operation_id=op.id, actor="test").outcome == "succeeded"
    assert hosted.transfers(payer.address) == 1


def test_supported_must_list_the_configured_network(chain):
    client = FacilitatorClient(base_url=os.environ["X402_FACILITATOR_URL"], timeout=5)

    client.ensure_supported(scheme="exact", network=os.environ["X402_NETWORK"])
    with pytest.raises(FacilitatorUnsupported):
        client.ensure_supported(scheme="exact", network="eip155:8453")


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_credential_on_settle_is_not_sent(status):
    assert classify_settle(status, {"error": "unauthorized"}).kind == SettleKind.NOT_SENT
