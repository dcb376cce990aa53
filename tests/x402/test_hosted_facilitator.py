"""A hosted facilitator. The SDK's own facilitator with authentication turned
on (its sandbox route plays a static bearer token, or Coinbase's per-request CDP JWT):
Verity sends its credential, checks /supported for the configured scheme and network before
the first settle, and `settlement_pending` answered as HTTP 500 keeps working."""

from __future__ import annotations

import base64
import io
import logging
import os
import time

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from django.core.management import call_command

from payments import services
from payments.models import PaymentOperation, ProviderCall
from payments.providers.x402 import (
    FacilitatorClient,
    FacilitatorUnsupported,
    SettleKind,
    classify_settle,
)
from payments.providers.x402.auth import mint_cdp_jwt
from tests.x402.chain import SIGNATURE, sign

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
    agent, report, hosted, settings
):
    settings.X402_FACILITATOR_AUTH_TOKEN = TOKEN

    purchase, payer, r = _pay(agent, report, hosted)

    assert r.status_code in (200, 202), r.content
    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    assert op.outcome == "succeeded"
    assert hosted.transfers(payer.address) == 1


def test_a_refused_credential_stores_nothing_and_moves_nothing(agent, report, hosted, settings):
    settings.X402_FACILITATOR_AUTH_TOKEN = "not-the-token"

    purchase, payer, r = _pay(agent, report, hosted)

    assert r.status_code == 503 and r.json()["code"] == "facilitator_unsupported", r.content
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0
    assert hosted.transfers(payer.address) == 0


def test_pending_as_http_500_from_an_authenticating_facilitator_is_awaiting(
    agent, report, hosted, settings
):
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


# -- Coinbase's hosted (CDP) facilitator: a JWT minted per request ------------------------
# The local facilitator plays it (tools/x402_facilitator.py, `cdp_key`): it checks the
# JWT with PyJWT's decoder from the claim shape, never with Verity's minter.

KEY_ID = "organizations/local-org/apiKeys/local-key"
JWT_HEADER_START = base64.urlsafe_b64encode(b'{"alg"').decode()[:8]


def _ec_key():
    key = ec.generate_private_key(ec.SECP256R1())
    secret = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return key, secret


def _ed25519_key():
    key = ed25519.Ed25519PrivateKey.generate()
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return key, base64.b64encode(raw + public).decode()


def _public_pem(key) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


@pytest.fixture(params=["ES256", "EdDSA"])
def cdp_hosted(request, chain, settings):
    """The facilitator demands a CDP JWT from a fresh key; Verity holds the key's id and
    secret in its settings, as it would from the environment."""
    key, secret = _ec_key() if request.param == "ES256" else _ed25519_key()
    chain.facilitator_config(cdp_key={"id": KEY_ID, "public_key": _public_pem(key)})
    settings.X402_FACILITATOR_AUTH_TOKEN = ""
    settings.X402_FACILITATOR_API_KEY_ID = KEY_ID
    settings.X402_FACILITATOR_API_KEY_SECRET = secret
    yield chain, key, secret
    chain.facilitator_config(cdp_key=None)


def test_with_a_cdp_api_key_verity_pays_through_a_jwt_facilitator(
    agent, report, cdp_hosted, caplog
):
    chain, _, secret = cdp_hosted
    caplog.set_level(logging.DEBUG)

    for _ in range(2):  # every request carries its own JWT: the facilitator refuses a replay
        purchase, payer, r = _pay(agent, report, chain)

        assert r.status_code in (200, 202), r.content
        op = PaymentOperation.objects.get(purchase_id=purchase["id"])
        assert op.outcome == "succeeded"
        assert chain.transfers(payer.address) == 1
    # neither the key's secret nor a minted bearer JWT (its header: base64url of
    # {"alg": ...) is logged at DEBUG or stored anywhere in the database
    body = secret.splitlines()[1] if "\n" in secret else secret
    dump = io.StringIO()
    call_command("dumpdata", stdout=dump)
    for text in (caplog.text, dump.getvalue()):
        assert body not in text and JWT_HEADER_START not in text


def test_a_static_token_is_refused_by_a_jwt_facilitator_and_moves_nothing(
    agent, report, cdp_hosted, settings
):
    chain, _, _ = cdp_hosted
    settings.X402_FACILITATOR_API_KEY_ID = settings.X402_FACILITATOR_API_KEY_SECRET = ""
    settings.X402_FACILITATOR_AUTH_TOKEN = TOKEN
    # as in a new worker: a client built earlier with this token asked /supported of the
    # facilitator before it demanded a JWT, and would not ask again
    from payments.providers.x402 import get_facilitator

    get_facilitator()._supported.clear()

    purchase, payer, r = _pay(agent, report, chain)

    assert r.status_code == 503 and r.json()["code"] == "facilitator_unsupported", r.content
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0
    assert chain.transfers(payer.address) == 0


def test_an_unusable_api_key_secret_stores_nothing_and_is_never_answered(
    agent, report, chain, settings
):
    secret = base64.b64encode(b"not a key, 33 bytes of something.").decode()
    settings.X402_FACILITATOR_API_KEY_ID = KEY_ID
    settings.X402_FACILITATOR_API_KEY_SECRET = secret

    purchase, payer, r = _pay(agent, report, chain)

    assert r.status_code == 503 and r.json()["code"] == "facilitator_unsupported", r.content
    assert secret not in r.content.decode()
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0
    assert chain.transfers(payer.address) == 0


def test_the_jwt_facilitator_refuses_a_stale_replayed_or_misbound_jwt(cdp_hosted):
    chain, key, _ = cdp_hosted
    supported = f"{chain.facilitator.rstrip('/')}/supported"
    settle = f"{chain.facilitator.rstrip('/')}/settle"

    def get(token):
        r = requests.get(supported, headers={"Authorization": f"Bearer {token}"}, timeout=5)
        return r.status_code, r.json().get("reason")

    def mint(**kw):
        return mint_cdp_jwt(
            **{"key_id": KEY_ID, "key": key, "method": "GET", "url": supported, **kw}
        )

    fresh = mint()
    assert get(fresh) == (200, None)
    assert get(fresh) == (401, "jwt_replayed")
    assert get(mint(now=int(time.time()) - 121)) == (401, "jwt_expired")
    assert get(mint(url=settle)) == (401, "jwt_wrong_request")
    assert get(mint(method="POST")) == (401, "jwt_wrong_request")
    assert get(mint(lifetime=600)) == (401, "jwt_lifetime_too_long")
    assert get(mint(key_id="organizations/x/apiKeys/other")) == (401, "jwt_wrong_key")
    other, _ = _ec_key()
    assert get(mint(key=other))[0] == 401
