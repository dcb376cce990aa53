"""One session, one purchase, one charge, in both payment modes: completes raced with one
key and with many, a complete raced by a payment on its purchase from the REST side, and a
complete after the purchase was paid there. Counted at localstripe over plain HTTP and in
raw rows; the loser leaves no purchase, hold, operation or event behind."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection

from payments import services
from payments.enums import Outcome
from payments.models import Hold, PaymentOperation, Purchase
from tests.acp.agent import complete_body, new_email
from tests.acp.tokens import issue_spt
from tests.events.event_judge import orphan_events, orphan_fanout, violations

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["two_step", "one_call"])
def mode(request, localstripe, settings):
    from tests.localstripe import one_call_off, one_call_on

    if request.param == "one_call":
        one_call_on(localstripe, settings)
        yield request.param
        one_call_off(localstripe)
    else:
        one_call_off(localstripe)
        yield request.param


def _paid(localstripe, purchase_id):
    return [
        pi
        for pi in localstripe.payment_intents_for(purchase_id)
        if pi["status"] in ("succeeded", "requires_capture")
    ]


def _no_leftovers(purchase_id: str) -> None:
    assert Purchase.objects.count() == 1, list(Purchase.objects.values("id", "status"))
    assert Hold.objects.exclude(operation__purchase_id=purchase_id).count() == 0
    assert orphan_events() == [] and orphan_fanout() == []
    assert violations(purchase_id) == []


def _settled(op_id: str) -> PaymentOperation:
    op = PaymentOperation.objects.get(id=op_id)
    for _ in range(3):
        if op.outcome in (Outcome.SUCCEEDED, Outcome.FAILED):
            return op
        if op.outcome == Outcome.PENDING:
            op = services.operation_dispatch(operation_id=op.id)
        else:
            op = services.operation_reconcile(operation_id=op.id)
    return op


def test_completes_raced_with_one_key_and_with_many_charge_once(
    mode, agent, tea, localstripe, send_at_once
):
    sid = agent.create(tea.sku, 1).json()["id"]
    email = new_email()
    token = issue_spt(1250)
    shared = str(uuid.uuid4())
    body = complete_body(token, email)
    sends = [
        (lambda: agent.post(f"checkout_sessions/{sid}/complete", body, key=shared))
        for _ in range(3)
    ] + [
        (
            lambda: agent.post(
                f"checkout_sessions/{sid}/complete",
                complete_body(issue_spt(1250), email),
                key=str(uuid.uuid4()),
            )
        )
        for _ in range(3)
    ]
    answers = send_at_once(sends)
    print(mode, [getattr(a, "status_code", a) for a in answers])
    assert not [a for a in answers if isinstance(a, Exception)], answers
    purchase = Purchase.objects.get(acp_session__id=sid)
    ops = list(PaymentOperation.objects.filter(purchase=purchase))
    assert len(ops) == 1, [(o.id, o.outcome) for o in ops]
    op = _settled(ops[0].id)
    assert op.outcome == Outcome.SUCCEEDED
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    assert len(_paid(localstripe, purchase.id)) == 1
    # The shared key: every answer that is not "still in flight" is the same answer.
    same = [a for a in answers[:3] if a.status_code != 409]
    assert same, [a.status_code for a in answers[:3]]
    first = same[0].json()
    for a in same[1:]:
        assert a.json() == first or a.headers.get("Idempotent-Replayed") == "true"
    for a in answers:
        assert a.status_code in (200, 201, 202, 409), (a.status_code, a.text[:300])
    # The shared key again, after the race: the answer its winner gave, unchanged.
    replay = agent.post(f"checkout_sessions/{sid}/complete", body, key=shared)
    assert (replay.status_code, replay.json()) == (same[0].status_code, first), (
        replay.status_code,
        same[0].status_code,
    )
    _no_leftovers(purchase.id)


def test_a_complete_raced_by_a_payment_from_the_rest_side_charges_once(
    mode,
    agent,
    tea,
    localstripe,
    platform,
    send_at_once,
):
    """After a decline: a new complete (another token) and a payment on the same purchase
    by the same platform (the REST side's service: payment_request's core) race."""
    sid = agent.create(tea.sku, 1).json()["id"]
    email = new_email()
    r = agent.complete(sid, issue_spt(1250, payment_method="pm_card_chargeCustomerFail"), email)
    assert r.status_code == 402, r.text
    purchase = Purchase.objects.get(acp_session__id=sid)
    failed = PaymentOperation.objects.get(purchase=purchase)

    def rest():
        op = services.payment_create(
            purchase_id=purchase.id,
            api_client=platform[0],
            payment_method="pm_card_visa",
            retry_of=failed.id,
        )
        return services.operation_dispatch(operation_id=op.id).outcome

    def acp():
        return agent.complete(sid, issue_spt(1250), email)

    answers = send_at_once([rest, acp])
    print(mode, [getattr(a, "status_code", getattr(a, "code", a)) for a in answers])
    for op in PaymentOperation.objects.filter(purchase=purchase):
        _settled(op.id)
    paid = _paid(localstripe, purchase.id)
    assert len(paid) == 1, [(pi["id"], pi["status"]) for pi in paid]
    assert (
        PaymentOperation.objects.filter(
            purchase=purchase, outcome=Outcome.SUCCEEDED, is_duplicate=False
        ).count()
        == 1
    )
    _no_leftovers(purchase.id)


def test_a_complete_after_the_purchase_was_paid_elsewhere_charges_nothing(
    mode,
    agent,
    tea,
    localstripe,
    platform,
):
    sid = agent.create(tea.sku, 1).json()["id"]
    email = new_email()
    r = agent.complete(sid, issue_spt(1250, payment_method="pm_card_chargeCustomerFail"), email)
    assert r.status_code == 402, r.text
    purchase = Purchase.objects.get(acp_session__id=sid)
    failed = PaymentOperation.objects.get(purchase=purchase)
    op = services.payment_create(
        purchase_id=purchase.id,
        api_client=platform[0],
        payment_method="pm_card_visa",
        retry_of=failed.id,
    )
    op = _settled(services.operation_dispatch(operation_id=op.id).id)
    assert op.outcome == Outcome.SUCCEEDED, (
        op.reason,
        op.grade,
        list(op.provider_calls.values("step", "http_status", "classification")),
    )
    before = len(localstripe.payment_intents_for(purchase.id))
    again = agent.complete(sid, issue_spt(1250), email)
    print(mode, again.status_code, again.text[:300])
    assert len(localstripe.payment_intents_for(purchase.id)) == before
    assert len(_paid(localstripe, purchase.id)) == 1
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 2
    assert again.status_code in (200, 201, 202, 409), again.text[:300]
    if again.status_code in (200, 201, 202):
        assert again.json()["status"] in ("completed", "complete_in_progress"), again.text[:300]
    _no_leftovers(purchase.id)


def test_a_complete_refused_at_the_limit_leaves_no_purchase_and_no_event(
    mode, live_server, tea, localstripe
):
    """The platform's spending limit does not cover the session: the complete's purchase
    was opened and its events collected in the same change before the refusal (one-call:
    at the claim; two-step: before the insert). Nothing of it is left: no purchase, no
    operation, no hold, no event, no fan-out; the session is still payable; the same key
    answers the stored refusal; a new key, once the limit allows it, pays once."""
    from payments.client_cache import api_client_cache_clear
    from tests.acp.agent import AcpAgent
    from tests.factories import make_client

    client, key = make_client(scopes=("acp",), limit=1000, name="tight-platform")
    tight = AcpAgent(live_server.url, key)
    sid = tight.create(tea.sku, 1).json()["id"]
    email = new_email()
    idem = str(uuid.uuid4())
    body = complete_body(issue_spt(1250), email)
    r = tight.post(f"checkout_sessions/{sid}/complete", body, key=idem)
    print(mode, r.status_code, r.text[:200])
    assert r.status_code in (400, 402, 409, 422), r.text[:300]
    assert not Purchase.objects.exists()
    assert not PaymentOperation.objects.exists() and not Hold.objects.exists()
    from events.models import Event, PurchaseEventCounter

    assert not Event.objects.exists() and not PurchaseEventCounter.objects.exists()
    assert orphan_fanout() == []
    assert localstripe.list("payment_intents", limit=100) is not None
    assert not [
        pi
        for pi in localstripe.list("payment_intents")
        if (pi.get("metadata") or {}).get("customer_reference") == f"acp:{email}"
    ]
    again = tight.post(f"checkout_sessions/{sid}/complete", body, key=idem)
    assert (again.status_code, again.json()) == (r.status_code, r.json())

    client.spending_limit = 10_000_000
    client.save()
    api_client_cache_clear()
    paid = tight.post(
        f"checkout_sessions/{sid}/complete",
        complete_body(issue_spt(1250), email),
        key=str(uuid.uuid4()),
    )
    assert paid.status_code in (200, 201, 202), paid.text[:300]
    purchase = Purchase.objects.get(acp_session__id=sid)
    op = _settled(PaymentOperation.objects.get(purchase=purchase).id)
    assert op.outcome == Outcome.SUCCEEDED
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    _no_leftovers(purchase.id)


def test_a_complete_retried_while_the_first_is_at_the_provider_charges_once(agent, tea, one_call):
    """One-call: the provider holds the first complete's request (1.5 s); meanwhile the
    agent retries with the same key and with a new key. One PaymentIntent, one charge;
    the same key never creates a second operation."""
    one_call.idempotency(hold_seconds=1.5)
    sid = agent.create(tea.sku, 1).json()["id"]
    email = new_email()
    idem = str(uuid.uuid4())
    body = complete_body(issue_spt(1250), email)
    results: dict[str, object] = {}

    def first():
        results["first"] = agent.post(f"checkout_sessions/{sid}/complete", body, key=idem)
        connection.close()

    t = threading.Thread(target=first)
    t.start()
    import time

    from tests.waiting import wait_for

    wait_for(lambda: PaymentOperation.objects.exists(), timeout=10, interval=0.02)
    time.sleep(0.2)
    same = agent.post(f"checkout_sessions/{sid}/complete", body, key=idem)
    other = agent.post(
        f"checkout_sessions/{sid}/complete",
        complete_body(issue_spt(1250), email),
        key=str(uuid.uuid4()),
    )
    t.join(30)
    one_call.idempotency(hold_seconds=0)
    print(
        "first:",
        results["first"].status_code,
        "same:",
        same.status_code,
        "other:",
        other.status_code,
    )
    assert same.status_code in (409, 200, 201, 202), same.text[:300]
    assert other.status_code in (200, 201, 202), other.text[:300]
    purchase = Purchase.objects.get(acp_session__id=sid)
    ops = list(PaymentOperation.objects.filter(purchase=purchase))
    assert len(ops) == 1
    op = _settled(ops[0].id)
    assert op.outcome == Outcome.SUCCEEDED
    assert len(one_call.payment_intents_for(purchase.id)) == 1
    assert len(_paid(one_call, purchase.id)) == 1
    _no_leftovers(purchase.id)
