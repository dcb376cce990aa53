"""The x402 identities Verity keys on: the payment-identifier extension across API clients,
and one authorization offered to two purchases. Judged from DB rows and raw logs."""

from __future__ import annotations

import pytest

from payments.models import PaymentOperation, X402Authorization
from tests.api.client import Api
from tests.factories import make_client
from tests.outbox import settle_outbox
from tests.x402.chainside import PRICE_ATOMIC, charge, send, signed

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def stranger(db):
    client, key = make_client(
        scopes=("purchases:read", "purchases:write"), limit=10_000_000, name="another-tenant"
    )
    yield Api(key, client)
    settle_outbox()


def test_one_authorization_pays_one_of_two_purchases_across_clients(agent, stranger, report, chain):
    payer = chain.new_payer()
    first = agent.new_purchase(report.sku)
    second = stranger.new_purchase(report.sku)
    header, auth, _s = signed(agent, first, payer)
    assert send(agent, first, header).status_code in (200, 202)
    r = send(stranger, second, header)  # the very same PAYMENT-SIGNATURE on another purchase
    settle_outbox()

    assert r.status_code == 409, r.content
    assert not PaymentOperation.objects.filter(purchase_id=second["id"]).exists()
    assert charge(first).outcome == "succeeded"
    assert chain.received_from(payer.address) == PRICE_ATOMIC
    # The 409 names nothing of the other client's purchase or operation.
    assert first["id"] not in r.content.decode() and charge(first).id not in r.content.decode()
    assert X402Authorization.objects.filter(nonce=auth["nonce"].lower()).count() == 1


def test_a_nonce_spelled_in_capitals_is_the_same_authorization(agent, report, chain):
    """(payer, nonce) is unique in the database; the nonce's spelling must not make the same
    authorization a second operation on another purchase."""
    import json

    from payments.providers.x402 import decode_header, encode_header

    payer = chain.new_payer()
    first, second = agent.new_purchase(report.sku), agent.new_purchase(report.sku)
    header, auth, _s = signed(agent, first, payer)
    assert send(agent, first, header).status_code in (200, 202)
    doc = decode_header(header)
    doc["payload"]["authorization"]["nonce"] = "0x" + auth["nonce"][2:].upper()
    doc["accepted"] = decode_header(
        agent.get(f"purchases/{second['id']}/deliverable").headers["PAYMENT-REQUIRED"]
    )["accepts"][0]
    r = send(agent, second, encode_header(json.loads(json.dumps(doc))))
    settle_outbox()

    assert r.status_code in (402, 409), r.content
    assert (
        PaymentOperation.objects.filter(purchase_id=second["id"], outcome="succeeded").count() == 0
    )
    assert chain.received_from(payer.address) == PRICE_ATOMIC
