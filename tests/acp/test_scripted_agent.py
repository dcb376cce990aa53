"""A scripted ACP agent on the real stack (live server, Celery worker, localstripe).

create -> update -> complete, and the answer to complete is lost; then the agent does what
agents do: retries with the same key, with a new key, starts a second session for the
same basket. Whatever it does: exactly one charge at localstripe, one order, and the
session tells the truth at each step. The same with the provider down during complete.
"""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone

from payments import services
from payments.models import PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from recovery.models import Order, OutboxMessage
from tests.acp.agent import complete_body, new_email, valid
from tests.acp.tokens import issue_spt, spt_state
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _acp_intents(localstripe) -> list[dict]:
    """Every PaymentIntent any ACP purchase made, counted at the provider by metadata."""
    ours = set(Purchase.objects.values_list("id", flat=True))
    return [
        pi
        for pi in localstripe.list("payment_intents")
        if (pi.get("metadata") or {}).get("purchase_id") in ours
    ]


def _one_charge_one_order(localstripe, purchase_id: str, purchases: int = 1) -> None:
    intents = _acp_intents(localstripe)
    assert [
        (pi["metadata"]["purchase_id"], pi["status"])
        for pi in intents
        if pi["status"] in ("succeeded", "requires_capture")
    ] == [(purchase_id, "succeeded")]
    wait_for(lambda: Order.objects.filter(purchase_id=purchase_id).exists(), timeout=30)
    wait_for(
        lambda: (
            not OutboxMessage.objects.filter(
                processed_at__isnull=True, available_at__lte=timezone.now()
            ).exists()
        ),
        timeout=30,
    )
    assert Order.objects.count() == 1
    assert Purchase.objects.count() == purchases


def _session(agent, session_id: str) -> dict:
    r = agent.get(f"checkout_sessions/{session_id}")
    assert r.status_code == 200, r.text
    return valid("CheckoutSession", r.json())


def test_lost_answer_to_complete_then_retries_make_one_charge_and_one_order(
    agent, tea, localstripe, celery_worker
):
    email = new_email()
    r = agent.create(tea.sku, 1)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    r = agent.post(
        f"checkout_sessions/{sid}",
        {
            "line_items": [{"id": tea.sku, "quantity": 2}],
            "fulfillment_details": {
                "name": "Ada",
                "email": email,
                "address": {
                    "name": "Ada",
                    "line_one": "1 Main St",
                    "city": "Springfield",
                    "state": "IL",
                    "country": "US",
                    "postal_code": "62701",
                },
            },
        },
    )
    assert r.status_code == 200 and r.json()["status"] == "ready_for_payment", r.text

    # The provider applies the confirm but its answer is lost (the fault drill on the
    # next confirm, whatever its operation); the agent itself gives up waiting at once.
    from payments.enums import Rail
    from payments.services import provider_for_rail

    provider_for_rail(Rail.STRIPE).arm_drill(
        key_prefix="*", step="confirm", mode=DrillMode.DROP_RESPONSE_AFTER_SEND
    )
    token, key = issue_spt(2500), str(uuid.uuid4())
    body = complete_body(token, email)
    assert agent.post(f"checkout_sessions/{sid}/complete", body, key=key, timeout=0.01) is None

    # 1. Same key: the truth is "in progress" (it did charge; Verity does not know yet).
    r = agent.post_until_not_in_flight(f"checkout_sessions/{sid}/complete", body, key=key)
    assert r.status_code == 202, r.text
    assert valid("CheckoutSession", r.json())["status"] == "complete_in_progress"
    assert int(r.headers["Retry-After"]) >= 1
    purchase = Purchase.objects.get(acp_session__id=sid)
    op = PaymentOperation.objects.get(purchase=purchase)
    assert op.outcome == "unknown"
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1  # it did charge
    assert _session(agent, sid)["status"] == "complete_in_progress"

    # 2. New key, new token: the session's current state, never a second payment.
    token2 = issue_spt(2500)
    r = agent.post(
        f"checkout_sessions/{sid}/complete", complete_body(token2, email), key=str(uuid.uuid4())
    )
    assert r.status_code == 202 and r.json()["status"] == "complete_in_progress", r.text
    assert spt_state(token2)["deactivated_reason"] is None  # never presented to Stripe
    # 3. Same key, another body: refused; the body is not looked at.
    r = agent.post(f"checkout_sessions/{sid}/complete", complete_body(token2, email), key=key)
    assert (r.status_code, valid("Error", r.json())["code"]) == (422, "idempotency_conflict")

    # 4. A second session for the same basket: the buyer has an unresolved purchase.
    other = agent.create(tea.sku, 2).json()
    r = agent.complete(other["id"], issue_spt(2500), email)
    assert (r.status_code, valid("Error", r.json())["code"]) == (
        409,
        "customer_has_unresolved_purchase",
    )
    assert _session(agent, other["id"])["status"] == "ready_for_payment"
    assert PaymentOperation.objects.count() == 1 and Order.objects.count() == 0

    # Reconciliation reads the provider's record: the charge happened.
    assert services.operation_reconcile(operation_id=op.id, actor="test").outcome == "succeeded"
    view = _session(agent, sid)
    assert view["status"] == "completed"
    assert valid("CheckoutSessionWithOrder", view)["order"]["id"] == purchase.id
    # 5. The agent, following answers again: the same key is the answer that key got
    #    (RFC §6.3: stored, "in progress, retrieve the session"); a new key answers the
    #    session's state, completed; no new charge either way.
    r = agent.post(f"checkout_sessions/{sid}/complete", body, key=key)
    assert (r.status_code, r.headers.get("Idempotent-Replayed")) == (202, "true")
    assert valid("CheckoutSession", r.json())["status"] == "complete_in_progress"
    r = agent.post(
        f"checkout_sessions/{sid}/complete", complete_body(token2, email), key=str(uuid.uuid4())
    )
    assert r.status_code == 200 and r.json()["order"]["id"] == purchase.id
    # 6. The second session again: now a probable duplicate of the paid purchase.
    r = agent.complete(other["id"], issue_spt(2500), email)
    assert (r.status_code, r.json()["code"]) == (409, "probable_duplicate_purchase")
    r = agent.post(f"checkout_sessions/{sid}/cancel", {})
    assert r.status_code == 405

    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1
    _one_charge_one_order(localstripe, purchase.id)


def test_provider_down_during_complete_then_retries_make_one_charge_and_one_order(
    agent, tea, localstripe, celery_worker
):
    from payments.enums import Rail
    from payments.services import provider_for_rail

    email = new_email()
    sid = agent.create(tea.sku, 2).json()["id"]
    # The provider cannot be reached at all: every create attempt of this complete (the
    # first send and Verity's resends of a request that provably never left) times out.
    provider = provider_for_rail(Rail.STRIPE)
    provider.arm_drill(key_prefix="*", step="create", mode=DrillMode.TIMEOUT_BEFORE_SEND, times=20)
    token, key = issue_spt(2500), str(uuid.uuid4())
    body = complete_body(token, email)
    try:
        r = agent.post(f"checkout_sessions/{sid}/complete", body, key=key)
    finally:
        provider.drill_client.disarm_all()
    # Nothing left: a service_unavailable Error (never "completed", never a charge).
    assert r.status_code == 503, r.text
    assert valid("Error", r.json())["type"] == "service_unavailable"
    assert int(r.headers["Retry-After"]) >= 1
    purchase = Purchase.objects.get(acp_session__id=sid)
    assert localstripe.payment_intents_for(purchase.id) == []
    assert spt_state(token)["deactivated_reason"] is None
    view = _session(agent, sid)
    assert view["status"] == "ready_for_payment"
    # A 5xx is not stored against the key (RFC §6.5): the same key is processed afresh.
    # A second session for the same basket meanwhile: no money moved on the first (its
    # payment provably failed), so the second may buy...
    other = agent.create(tea.sku, 2).json()
    r = agent.complete(other["id"], issue_spt(2500), email)
    assert r.status_code == 200, r.text
    bought = valid("CheckoutSessionWithOrder", r.json())["order"]["id"]
    # ...and then the first session, retried with its key (and with a new one) once the
    # provider is back, is not charged again: the buyer has that basket already.
    for again in (key, str(uuid.uuid4())):
        r = agent.post(f"checkout_sessions/{sid}/complete", body, key=again)
        assert (r.status_code, valid("Error", r.json())["code"]) == (
            409,
            "probable_duplicate_purchase",
        )
    assert spt_state(token)["deactivated_reason"] is None
    assert _session(agent, other["id"])["status"] == "completed"
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1
    _one_charge_one_order(localstripe, bought, purchases=2)


def test_provider_down_then_back_pays_the_same_session_once(agent, tea, localstripe, celery_worker):
    from payments.enums import Rail
    from payments.services import provider_for_rail

    email = new_email()
    sid = agent.create(tea.sku, 1).json()["id"]
    provider = provider_for_rail(Rail.STRIPE)
    provider.arm_drill(key_prefix="*", step="create", mode=DrillMode.TIMEOUT_BEFORE_SEND, times=20)
    token = issue_spt(1250)
    body = complete_body(token, email)
    try:
        r = agent.post(f"checkout_sessions/{sid}/complete", body)
    finally:
        provider.drill_client.disarm_all()
    assert r.status_code == 503, r.text
    # The provider is back; the agent completes again (new key, the unused token).
    r = agent.post(f"checkout_sessions/{sid}/complete", body)
    assert r.status_code == 200, r.text
    purchase_id = valid("CheckoutSessionWithOrder", r.json())["order"]["id"]
    r = agent.post(f"checkout_sessions/{sid}/complete", complete_body(issue_spt(1250), email))
    assert r.status_code == 200 and r.json()["order"]["id"] == purchase_id
    _one_charge_one_order(localstripe, purchase_id)


def test_parallel_completes_with_fresh_keys_and_tokens_make_one_payment(agent, tea, localstripe):
    from concurrent.futures import ThreadPoolExecutor

    email = new_email()
    sid = agent.create(tea.sku).json()["id"]
    tokens = [issue_spt(1250) for _ in range(6)]
    with ThreadPoolExecutor(6) as pool:
        answers = list(
            pool.map(
                lambda t: agent.post(f"checkout_sessions/{sid}/complete", complete_body(t, email)),
                tokens,
            )
        )
    # One request paid; the others waited for the session and answered its state.
    assert {r.status_code for r in answers} <= {200, 202}, [r.text for r in answers]
    purchase = Purchase.objects.get(acp_session__id=sid)
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert sum(spt_state(t)["deactivated_reason"] == "consumed" for t in tokens) == 1
    assert _session(agent, sid)["status"] == "completed"


def test_answer_to_complete_lost_by_the_fault_proxy_then_retries_make_one_charge(
    agent, platform, tea, localstripe, celery_worker, live_server
):
    """The fault proxy in front of Verity: complete reaches Verity, which charges and
    records it, and the proxy resets the connection instead of passing the answer back.
    The agent retries with the same key, with a new key and token, and opens a second
    session for the same basket: one charge at localstripe, one order, and the session
    says `completed` at each step."""
    from urllib.parse import urlparse

    import requests

    from bench.fault_proxy import FaultProxy
    from tests.acp.agent import AcpAgent

    email = new_email()
    sid = agent.create(tea.sku, 2).json()["id"]
    token, key = issue_spt(2500), str(uuid.uuid4())
    body = complete_body(token, email)
    proxy = FaultProxy(urlparse(live_server.url).port, seed=33)
    proxy.up()
    proxy.drop_answers(1.0)
    try:
        # A fresh connection (the proxy decides per connection, at its first answer).
        lossy = AcpAgent(proxy.base, platform[1])
        with pytest.raises(requests.exceptions.ConnectionError):
            lossy.post(f"checkout_sessions/{sid}/complete", body, key=key)
        assert proxy.dropped == 1
    finally:
        proxy.down()

    # Verity did it: the session already says so, before any retry.
    purchase = Purchase.objects.get(acp_session__id=sid)
    assert _session(agent, sid)["status"] == "completed"
    assert [pi["status"] for pi in localstripe.payment_intents_for(purchase.id)] == ["succeeded"]
    # 1. Same key: the stored answer, marked as a replay.
    r = agent.post(f"checkout_sessions/{sid}/complete", body, key=key)
    assert (r.status_code, r.headers.get("Idempotent-Replayed")) == (200, "true"), r.text
    assert valid("CheckoutSessionWithOrder", r.json())["order"]["id"] == purchase.id
    # 2. New key, new token: the session's state; the token is never presented.
    token2 = issue_spt(2500)
    r = agent.post(
        f"checkout_sessions/{sid}/complete", complete_body(token2, email), key=str(uuid.uuid4())
    )
    assert r.status_code == 200 and r.json()["order"]["id"] == purchase.id, r.text
    assert spt_state(token2)["deactivated_reason"] is None
    # 3. A second session for the same basket: refused, nothing charged.
    other = agent.create(tea.sku, 2).json()
    r = agent.complete(other["id"], token2, email)
    assert (r.status_code, valid("Error", r.json())["code"]) == (409, "probable_duplicate_purchase")
    assert _session(agent, other["id"])["status"] == "ready_for_payment"
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1
    _one_charge_one_order(localstripe, purchase.id)
