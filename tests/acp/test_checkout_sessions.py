"""The five ACP endpoints on the real stack (live server, localstripe): shapes, headers,
idempotency, repricing, cancel, and a shared payment token charged once."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from acp.models import CheckoutSession
from acp.spec import SPEC_PATH
from payments.models import PaymentOperation, Purchase, PurchaseChannel
from tests.acp.agent import new_email, valid
from tests.acp.tokens import issue_spt, spt_state
from tests.factories import ProductFactory, make_client

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_spec_copy_under_tests_is_the_one_verity_serves():
    here = Path(__file__).with_name("openapi.agentic_checkout.yaml")
    assert here.read_text() == SPEC_PATH.read_text()
    assert "Patches:" in here.read_text().splitlines()[3]


def test_create_update_complete_charges_the_shared_token_once(agent, tea, localstripe):
    r = agent.create(tea.sku, 1, **{"Request-Id": "req_abc"})
    assert r.status_code == 201, r.text
    assert r.headers["Request-Id"] == "req_abc" and r.headers["Idempotency-Key"]
    session = valid("CheckoutSession", r.json())
    assert session["status"] == "ready_for_payment"
    assert {t["type"]: t["amount"] for t in session["totals"]}["total"] == 1250

    # Update reprices from the catalogue (the price moved meanwhile).
    tea.price = 1300
    tea.save()
    r = agent.post(
        f"checkout_sessions/{session['id']}", {"line_items": [{"id": tea.sku, "quantity": 2}]}
    )
    assert r.status_code == 200, r.text
    session = valid("CheckoutSession", r.json())
    assert {t["type"]: t["amount"] for t in session["totals"]}["total"] == 2600

    token = issue_spt(2600)
    r = agent.complete(session["id"], token, new_email())
    assert r.status_code == 200, r.text
    done = valid("CheckoutSessionWithOrder", r.json())
    assert done["status"] == "completed"
    purchase = Purchase.objects.get(pk=done["order"]["id"])
    assert (purchase.channel, purchase.amount) == (PurchaseChannel.ACP, 2600)
    intents = localstripe.payment_intents_for(purchase.id)
    assert [(pi["status"], pi["amount"], pi["shared_payment_granted_token"]) for pi in intents] == [
        ("succeeded", 2600, token)
    ]
    assert spt_state(token)["deactivated_reason"] == "consumed"

    r = agent.get(f"checkout_sessions/{session['id']}")
    assert (r.status_code, valid("CheckoutSession", r.json())["status"]) == (200, "completed")
    # After payment, cancel is 405 (refunds stay with people and the REST API).
    r = agent.post(f"checkout_sessions/{session['id']}/cancel", {})
    assert r.status_code == 405 and valid("Error", r.json())["code"] == "not_cancelable"
    # Update after payment is refused too; nothing moved.
    r = agent.post(
        f"checkout_sessions/{session['id']}", {"line_items": [{"id": tea.sku, "quantity": 5}]}
    )
    assert r.status_code == 409 and valid("Error", r.json())["type"] == "invalid_request"
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1


def test_headers_scope_and_strict_bodies(agent, live_server, tea, platform):
    import requests

    base = f"{live_server.url}/acp/checkout_sessions"
    body = {"line_items": [{"id": tea.sku}], "currency": "usd", "capabilities": {}}
    # No credentials / the REST scheme's key without the acp scope.
    r = requests.post(
        base, json=body, headers={"API-Version": "2026-04-17", "Idempotency-Key": "k1"}
    )
    assert r.status_code == 401 and valid("Error", r.json())["code"] == "unauthenticated"
    _, rest_key = make_client(scopes=("purchases:write",), name="rest-only")
    r = requests.post(
        base,
        json=body,
        headers={
            "Authorization": f"Bearer {rest_key}",
            "API-Version": "2026-04-17",
            "Idempotency-Key": "k1",
        },
    )
    assert r.status_code == 403 and valid("Error", r.json())["code"] == "forbidden_scope"
    # API-Version required and checked.
    r = requests.post(
        base, json=body, headers={"Authorization": f"Bearer {platform[1]}", "Idempotency-Key": "k1"}
    )
    assert (r.status_code, valid("Error", r.json())["code"]) == (400, "missing_api_version")
    r = requests.post(
        base,
        json=body,
        headers={
            "Authorization": f"Bearer {platform[1]}",
            "API-Version": "2025-09-29",
            "Idempotency-Key": "k1",
        },
    )
    assert (r.status_code, r.json()["code"]) == (400, "unsupported_api_version")
    # Idempotency-Key required on every POST.
    r = agent.post("checkout_sessions", body, key=None)
    assert (r.status_code, valid("Error", r.json())["code"]) == (400, "idempotency_key_required")
    # Unknown fields are refused by name, at any depth, before anything is created.
    r = agent.post("checkout_sessions", {**body, "tip": 500})
    assert (r.status_code, r.json()["code"], r.json()["param"]) == (400, "unknown_field", "$.tip")
    r = agent.post("checkout_sessions", {**body, "line_items": [{"id": tea.sku, "price": 1}]})
    assert (r.status_code, r.json()["param"]) == (400, "$.line_items[0].price")
    assert CheckoutSession.objects.count() == 0
    # Replay: the same session, marked; another body with the key: 422.
    key = str(uuid.uuid4())
    first = agent.post("checkout_sessions", body, key=key)
    again = agent.post("checkout_sessions", body, key=key)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    r = agent.post("checkout_sessions", {**body, "currency": "eur"}, key=key)
    assert (r.status_code, valid("Error", r.json())["code"]) == (422, "idempotency_conflict")
    assert CheckoutSession.objects.count() == 1
    # Another client cannot see it.
    other = make_client(scopes=("acp",), name="other-platform")[1]
    r = requests.get(
        f"{base}/{first.json()['id']}",
        headers={"Authorization": f"Bearer {other}", "API-Version": "2026-04-17"},
    )
    assert (r.status_code, r.json()["code"]) == (404, "not_found")


def test_items_that_cannot_be_sold_are_messages_and_block_complete(agent, tea):
    gone = ProductFactory(sku=f"GONE-{uuid.uuid4().hex[:4]}", stock=0)
    r = agent.post(
        "checkout_sessions",
        {
            "line_items": [
                {"id": tea.sku, "quantity": 1},
                {"id": gone.sku, "quantity": 1},
                {"id": "NO-SUCH", "quantity": 1},
            ],
            "currency": "usd",
            "capabilities": {},
        },
    )
    assert r.status_code == 201, r.text
    session = valid("CheckoutSession", r.json())
    assert session["status"] == "not_ready_for_payment"
    assert [(m["code"], m["param"]) for m in session["messages"]] == [
        ("out_of_stock", "$.line_items[1]"),
        ("not_found", "$.line_items[2]"),
    ]
    r = agent.complete(session["id"], issue_spt(5000), new_email())
    assert (r.status_code, valid("Error", r.json())["code"]) == (409, "session_not_ready")
    assert Purchase.objects.count() == 0
    # Dropping the bad items makes it ready.
    r = agent.post(
        f"checkout_sessions/{session['id']}", {"line_items": [{"id": tea.sku, "quantity": 1}]}
    )
    assert r.json()["status"] == "ready_for_payment" and r.json()["messages"] == []


def test_cancel_before_payment_then_405(agent, tea):
    session = agent.create(tea.sku).json()
    r = agent.post(
        f"checkout_sessions/{session['id']}/cancel",
        {"intent_trace": {"reason_code": "price_sensitivity"}},
    )
    assert r.status_code == 200 and valid("CheckoutSession", r.json())["status"] == "canceled"
    r = agent.post(f"checkout_sessions/{session['id']}/cancel", {})
    assert (r.status_code, valid("Error", r.json())["code"]) == (405, "not_cancelable")
    r = agent.complete(session["id"], issue_spt(1250), new_email())
    assert r.status_code == 409 and Purchase.objects.count() == 0


@pytest.mark.parametrize("problem", ["other_amount", "expired", "reused"])
def test_a_shared_token_used_twice_expired_or_for_another_amount_is_refused(
    agent, tea, localstripe, problem
):
    session = agent.create(tea.sku).json()
    if problem == "other_amount":
        token = issue_spt(1000)  # issued for less than the session's 1250
    elif problem == "expired":
        token = issue_spt(1250, expires_in=-1)
    else:
        other = agent.create(tea.sku).json()
        token = issue_spt(1250)
        assert agent.complete(other["id"], token, new_email()).status_code == 200
    email = new_email()
    r = agent.complete(session["id"], token, email)
    assert r.status_code == 400, r.text
    err = valid("Error", r.json())
    assert (err["type"], err["code"], err["param"]) == (
        "invalid_request",
        "payment_declined",
        "$.payment_data",
    )
    purchase = Purchase.objects.get(acp_session__id=session["id"])
    assert localstripe.payment_intents_for(purchase.id) == []  # nothing was even created
    r = agent.get(f"checkout_sessions/{session['id']}")
    view = valid("CheckoutSession", r.json())
    assert view["status"] == "ready_for_payment"
    assert [m["code"] for m in view["messages"]] == ["payment_declined"]
    # A fresh token (new key) pays, once.
    r = agent.complete(session["id"], issue_spt(1250), email)
    assert r.status_code == 200, r.text
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1


def test_a_long_currency_or_a_nul_is_a_400_not_a_500(agent, tea):
    """Found by the schemathesis chain: currency "usdx" reached the 3-character column."""
    for body, param in (
        ({"line_items": [{"id": tea.sku}], "currency": "usdx", "capabilities": {}}, "$.currency"),
        (
            {"line_items": [{"id": "TEA\x00"}], "currency": "usd", "capabilities": {}},
            "$.line_items[0].id",
        ),
    ):
        r = agent.post("checkout_sessions", body)
        assert (r.status_code, valid("Error", r.json())["param"]) == (400, param), r.text
    assert CheckoutSession.objects.count() == 0


def test_a_platform_with_a_signing_secret_must_sign_its_requests(agent, platform, tea):
    import datetime

    from acp.models import AgentPlatform
    from acp.views import request_signature

    secret = AgentPlatform.objects.create(
        api_client=platform[0], signing_secret_salt="a-salt"
    ).current_signing_secret()
    body = {"line_items": [{"id": tea.sku, "quantity": 1}], "currency": "usd", "capabilities": {}}
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    r = agent.post("checkout_sessions", body)
    assert (r.status_code, valid("Error", r.json())["code"]) == (401, "invalid_signature")
    signed = {"Timestamp": now, "Signature": request_signature(secret, now, body)}
    r = agent.post("checkout_sessions", {**body, "currency": "USD"}, **signed)  # tampered
    assert (r.status_code, r.json()["code"]) == (401, "invalid_signature")
    stale = "2026-01-01T00:00:00Z"
    r = agent.post(
        "checkout_sessions",
        body,
        Timestamp=stale,
        Signature=request_signature(secret, stale, body),
    )
    assert (r.status_code, r.json()["param"]) == (401, "Timestamp")
    assert CheckoutSession.objects.count() == 0
    r = agent.post("checkout_sessions", body, **signed)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert agent.get(f"checkout_sessions/{sid}").status_code == 401
    r = agent.get(
        f"checkout_sessions/{sid}",
        Timestamp=now,
        Signature=request_signature(secret, now, None),
    )
    assert r.status_code == 200 and r.json()["id"] == sid


def test_the_rfc_instrument_form_of_payment_data_pays_too(agent, tea, localstripe):
    session = agent.create(tea.sku).json()
    token = issue_spt(1250)
    r = agent.post(
        f"checkout_sessions/{session['id']}/complete",
        {
            "buyer": {"email": new_email()},
            "payment_data": {
                "handler_id": "stripe_spt",
                "instrument": {"type": "card", "credential": {"type": "spt", "token": token}},
            },
        },
    )
    assert r.status_code == 200, r.text
    order = valid("CheckoutSessionWithOrder", r.json())["order"]
    assert [
        pi["shared_payment_granted_token"] for pi in localstripe.succeeded_charges_for(order["id"])
    ] == [token]
    # An unknown handler is refused before anything happens.
    other = agent.create(tea.sku).json()
    r = agent.post(
        f"checkout_sessions/{other['id']}/complete",
        {
            "buyer": {"email": new_email()},
            "payment_data": {
                "handler_id": "card_tokenized",
                "instrument": {
                    "type": "card",
                    "credential": {"type": "spt", "token": issue_spt(1250)},
                },
            },
        },
    )
    assert (r.status_code, r.json()["param"]) == (400, "$.payment_data.handler_id")
