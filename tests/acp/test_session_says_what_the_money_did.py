"""A checkout session says what the money did, as the other faces do.

- After a full refund the session's order is `refunded` (the word the order webhook sends),
  never `confirmed`.
- A person's "failed" the provider has not confirmed is not "no money moved, complete
  again" (REST says `failure_unconfirmed`): the session is in progress, and a complete
  reads the provider back first — it then answers the charge the provider shows.
- The buyer guards cannot be lifted over ACP (no field carries the buyer's code), so the
  refusal does not promise a code.

Real HTTP against the live server; money counted at localstripe; faults from the
fault-drill client only.
"""

import uuid

import pytest
from django.contrib.auth import get_user_model

from payments import services
from payments.enums import Grade, Outcome, PurchaseStatus, Rail
from payments.models import PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail
from tests.acp.agent import AcpAgent, new_email, valid
from tests.acp.tokens import issue_spt
from tests.factories import make_client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def refunding_agent(live_server, transactional_db):
    client, key = make_client(
        scopes=("acp",), limit=10_000_000, name="agent-platform-r", auto_refund_limit=100_000
    )
    return client, AcpAgent(live_server.url, key)


def _ready_session(agent, sku: str, quantity: int = 1) -> str:
    r = agent.create(sku, quantity)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_a_session_refunded_in_full_says_its_order_is_refunded(refunding_agent, tea, localstripe):
    client, agent = refunding_agent
    sid = _ready_session(agent, tea.sku)
    r = agent.complete(sid, issue_spt(1250), new_email())
    assert r.status_code == 200, r.text
    purchase = Purchase.objects.get(acp_session__id=sid)

    refund = services.refund_request(purchase_id=purchase.id, api_client=client)
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.SUCCEEDED
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.REFUNDED
    [pi] = localstripe.payment_intents_for(purchase.id)
    assert len(localstripe.refunds_for(pi["id"])) == 1

    session = valid("CheckoutSessionWithOrder", agent.get(f"checkout_sessions/{sid}").json())
    assert session["order"]["status"] == "refunded", session["order"]
    assert any("refunded" in m.get("content", "") for m in session["messages"])


def test_a_persons_unconfirmed_failed_on_a_charged_payment_is_not_no_money_moved(
    agent, tea, localstripe, read_drill
):
    email = new_email()
    sid = _ready_session(agent, tea.sku)
    provider = provider_for_rail(Rail.STRIPE)
    # The provider charges, its answer is lost: unknown.
    provider.arm_drill(key_prefix="*", step="confirm", mode=DrillMode.DROP_RESPONSE_AFTER_SEND)
    r = agent.complete(sid, issue_spt(1250), email)
    assert r.status_code == 202, r.text
    purchase = Purchase.objects.get(acp_session__id=sid)
    op = PaymentOperation.objects.get(purchase=purchase)
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    # A person calls it failed while the provider cannot be read.
    read_drill(op.provider_reference)
    person = get_user_model().objects.create(username=f"resolver-{uuid.uuid4().hex[:6]}")
    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome="failed",
        reason="buyer says declined",
        actor=person.username,
        acting_user=person,
    )
    assert (op.outcome, op.grade) == (Outcome.FAILED, Grade.ACKNOWLEDGED)

    session = valid("CheckoutSession", agent.get(f"checkout_sessions/{sid}").json())
    text = " ".join(m.get("content", "") for m in session["messages"])
    assert session["status"] == "complete_in_progress", session
    assert "no money moved" not in text.lower() and "may have been charged" in text

    # Completing again (the provider is readable now): read back first, then the truth.
    r = agent.complete(sid, issue_spt(1250), email)
    assert r.status_code == 200, r.text
    assert valid("CheckoutSessionWithOrder", r.json())["status"] == "completed"
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.SUCCEEDED


def test_the_buyer_guard_over_acp_promises_no_code_it_cannot_take(agent, tea, localstripe):
    email = new_email()
    first = _ready_session(agent, tea.sku, 2)
    assert agent.complete(first, issue_spt(2500), email).status_code == 200
    second = _ready_session(agent, tea.sku, 2)

    r = agent.complete(second, issue_spt(2500), email)

    error = valid("Error", r.json())
    assert (r.status_code, error["code"]) == (409, "probable_duplicate_purchase")
    assert "the code" not in error["message"] and "status page" not in error["message"]
    assert "cannot be completed" in error["message"]
    assert Purchase.objects.count() == 1
    assert (
        len(localstripe.succeeded_charges_for(Purchase.objects.get(acp_session__id=first).id)) == 1
    )
