"""ACP's own rules as the RFC writes them (rfc.agentic_checkout.md §6), on the real stack
(live server, localstripe), judged on localstripe's record and the database's rows:

- a replay under the same key returns what the first request answered (§6.3), not the
  session's current state (the REST API keeps its documented "replay answers the current
  state");
- an answer that created nothing, a 5xx, is not stored against the key (§6.5): the same key
  is processed afresh once the provider is back, and still pays once;
- every refusal is an ACP Error object, never a 5xx, an oversized body included;
- a session that can no longer be paid does not say `ready_for_payment`.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from acp.models import CheckoutSession
from payments.models import IdempotencyRecord, PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from tests.acp.agent import complete_body, new_email, valid
from tests.acp.tokens import issue_spt

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_oversized_body_is_an_acp_error_and_creates_nothing(agent, tea):
    from django.conf import settings

    padding = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    r = agent.post(
        "checkout_sessions",
        {
            "line_items": [{"id": tea.sku, "quantity": 1}],
            "currency": "usd",
            "capabilities": {},
            "buyer": {"first_name": padding, "email": "a@example.com"},
        },
    )
    assert r.status_code == 413, r.text
    assert valid("Error", r.json())["type"] == "invalid_request"
    assert r.json()["code"] == "request_too_large"
    assert CheckoutSession.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0


def test_an_unknown_acp_path_is_an_acp_error(agent):
    for r in (agent.get("checkout_sessions/cs_x/orders"), agent.post("carts", {})):
        assert r.status_code == 404, r.text
        assert valid("Error", r.json())["code"] == "not_found"


def test_a_replay_returns_the_first_answer_not_the_current_state(agent, tea):
    key = str(uuid.uuid4())
    body = {"line_items": [{"id": tea.sku, "quantity": 1}], "currency": "usd", "capabilities": {}}
    first = agent.post("checkout_sessions", body, key=key)
    assert first.status_code == 201, first.text
    sid = first.json()["id"]
    r = agent.post(f"checkout_sessions/{sid}", {"line_items": [{"id": tea.sku, "quantity": 3}]})
    assert r.status_code == 200 and r.json()["totals"][-1]["amount"] == 3750, r.text

    again = agent.post("checkout_sessions", body, key=key)
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (201, "true")
    assert again.json() == first.json()  # what the first request answered, unchanged
    assert CheckoutSession.objects.count() == 1
    # The session itself says what it is now.
    assert agent.get(f"checkout_sessions/{sid}").json()["totals"][-1]["amount"] == 3750


def test_a_refusal_replayed_is_the_same_refusal(agent, tea, localstripe):
    """A payment the provider declined is answered 402; the same key again is that answer,
    and the provider saw one attempt."""
    sid = agent.create(tea.sku, 1).json()["id"]
    key = str(uuid.uuid4())
    body = complete_body(issue_spt(1250, payment_method="pm_card_chargeCustomerFail"), new_email())
    first = agent.post(f"checkout_sessions/{sid}/complete", body, key=key)
    assert first.status_code == 402, first.text
    again = agent.post(f"checkout_sessions/{sid}/complete", body, key=key)
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (402, "true")
    assert valid("Error", again.json()) == first.json()
    purchase = Purchase.objects.get(acp_session__id=sid)
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1


def test_a_5xx_is_not_stored_and_the_same_key_pays_once_the_provider_is_back(
    agent, tea, localstripe, celery_worker
):
    from payments.enums import Rail
    from payments.services import provider_for_rail

    sid = agent.create(tea.sku, 1).json()["id"]
    provider = provider_for_rail(Rail.STRIPE)
    provider.arm_drill(key_prefix="*", step="create", mode=DrillMode.TIMEOUT_BEFORE_SEND, times=20)
    key = str(uuid.uuid4())
    body = complete_body(issue_spt(1250), new_email())
    try:
        r = agent.post(f"checkout_sessions/{sid}/complete", body, key=key)
    finally:
        provider.drill_client.disarm_all()
    assert r.status_code == 503 and valid("Error", r.json())["type"] == "service_unavailable"
    purchase = Purchase.objects.get(acp_session__id=sid)
    assert localstripe.payment_intents_for(purchase.id) == []
    # Nothing is kept against the key for a 5xx.
    assert not IdempotencyRecord.objects.filter(key=key).exists()

    # The provider is back: the same key, the same body, processed afresh: it pays.
    r = agent.post(f"checkout_sessions/{sid}/complete", body, key=key)
    assert r.status_code == 200, r.text
    assert r.headers.get("Idempotent-Replayed") is None
    assert valid("CheckoutSessionWithOrder", r.json())["order"]["id"] == purchase.id
    # Once stored, the same key is that answer, and nothing is paid again.
    again = agent.post(f"checkout_sessions/{sid}/complete", body, key=key)
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (200, "true")
    assert [pi["status"] for pi in localstripe.payment_intents_for(purchase.id)] == ["succeeded"]
    assert PaymentOperation.objects.filter(purchase=purchase, outcome="succeeded").count() == 1


def _declined(agent, sid: str, email: str):
    r = agent.complete(sid, issue_spt(1250, payment_method="pm_card_chargeCustomerFail"), email)
    assert r.status_code == 402, r.text
    return r


def test_a_session_whose_price_ran_out_after_a_decline_is_expired_not_ready(
    agent, tea, localstripe
):
    sid = agent.create(tea.sku, 1).json()["id"]
    email = new_email()
    _declined(agent, sid, email)
    view = valid("CheckoutSession", agent.get(f"checkout_sessions/{sid}").json())
    assert view["status"] == "ready_for_payment"  # another token may be tried: it may
    purchase = Purchase.objects.get(acp_session__id=sid)
    purchase.quote.expires_at = timezone.now() - timedelta(seconds=1)
    purchase.quote.save(update_fields=["expires_at"])

    view = valid("CheckoutSession", agent.get(f"checkout_sessions/{sid}").json())
    assert view["status"] == "expired", view["status"]
    assert any("cannot be paid" in m.get("content", "") for m in view["messages"])
    # What the status says is what complete does: refused, nothing sent to the provider.
    r = agent.complete(sid, issue_spt(1250), email)
    assert r.status_code == 409 and valid("Error", r.json())["code"] == "quote_expired", r.text
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1


def test_a_session_out_of_payment_attempts_does_not_say_ready(agent, tea, localstripe, settings):
    settings.PAYMENT_ATTEMPTS_MAX = 2
    sid = agent.create(tea.sku, 1).json()["id"]
    email = new_email()
    assert "Complete again" in _declined(agent, sid, email).json()["message"]
    last = _declined(agent, sid, email).json()["message"]
    assert "Complete again" not in last and "last payment attempt" in last
    view = valid("CheckoutSession", agent.get(f"checkout_sessions/{sid}").json())
    assert view["status"] not in ("ready_for_payment", "not_ready_for_payment"), view
    assert view["status"] == "requires_escalation"
    r = agent.complete(sid, issue_spt(1250), email)
    assert (r.status_code, valid("Error", r.json())["code"]) == (
        409,
        "payment_attempts_exhausted",
    ), r.text
    purchase = Purchase.objects.get(acp_session__id=sid)
    assert len(localstripe.payment_intents_for(purchase.id)) == 2
