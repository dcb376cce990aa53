"""An ACP complete whose provider answer is lost at every drill point, in both payment
modes; the agent retries the same key and then a new key, with the provider's signed
webhook in between. One PaymentIntent at most, charged at most once, the payment settled
as the provider says, the same key answering what it first answered, the purchase's
events gapless. Counted at localstripe over plain HTTP."""

from __future__ import annotations

import uuid

import pytest

from payments import services
from payments.enums import CallStep, Outcome, Rail
from payments.models import PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from tests.acp.agent import complete_body, new_email
from tests.acp.tokens import issue_spt
from tests.events.event_judge import event_rows, orphan_fanout, violations
from tests.localstripe import provider_object
from tests.outbox import settle_outbox
from tests.webhooks.events import event_for, post

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_acp_lost_complete"


@pytest.fixture(params=["two_step", "one_call"])
def pay_mode(request, localstripe, settings):
    from tests.localstripe import one_call_off, one_call_on

    if request.param == "one_call":
        one_call_on(localstripe, settings)
        yield request.param
        one_call_off(localstripe)
    else:
        one_call_off(localstripe)
        yield request.param


@pytest.mark.parametrize(
    "drill_mode",
    [
        DrillMode.DROP_RESPONSE_AFTER_SEND,
        DrillMode.RESET_AFTER_WRITE,
        DrillMode.HTTP_500,
        DrillMode.HTTP_409,
        DrillMode.TIMEOUT_BEFORE_SEND,
    ],
)
def test_a_lost_complete_answer_beside_the_webhook_settles_once(
    drill_mode, pay_mode, agent, tea, localstripe, client, settings, read_drill
):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_ACCOUNT = ""
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    sid = agent.create(tea.sku, 1).json()["id"]
    email = new_email()
    body = complete_body(issue_spt(1250), email)
    idem = str(uuid.uuid4())
    provider = services.provider_for_rail(Rail.STRIPE)
    step = CallStep.PAY if pay_mode == "one_call" else "confirm"
    provider.arm_drill(key_prefix="*", step=step, mode=drill_mode, times=2)
    read_drill(times=1)
    try:
        first = agent.post(f"checkout_sessions/{sid}/complete", body, key=idem)
    finally:
        provider.drill_client.disarm_all()
    purchase = Purchase.objects.get(acp_session__id=sid)
    op = PaymentOperation.objects.get(purchase=purchase)
    print(pay_mode, drill_mode, "first:", first.status_code, op.outcome)
    for pi in localstripe.payment_intents_for(purchase.id):
        obj = provider_object("payment_intents", pi["id"])
        if obj["status"] == "succeeded":
            assert (
                post(client, event_for(obj, "payment_intent.succeeded"), secret=SECRET).status_code
                == 200
            )
    settle_outbox()
    same = agent.post(f"checkout_sessions/{sid}/complete", body, key=idem)
    if first.status_code < 500:
        assert same.status_code == first.status_code, (same.status_code, first.status_code)
    other = agent.post(
        f"checkout_sessions/{sid}/complete",
        complete_body(issue_spt(1250), email),
        key=str(uuid.uuid4()),
    )
    for _ in range(4):
        for o in PaymentOperation.objects.filter(purchase=purchase):
            if o.outcome == Outcome.PENDING:
                services.operation_dispatch(operation_id=o.id)
            elif o.outcome not in (Outcome.SUCCEEDED, Outcome.FAILED):
                services.operation_reconcile(operation_id=o.id)
    for o in PaymentOperation.objects.filter(purchase=purchase, outcome=Outcome.UNKNOWN):
        if o.escalated_at is not None:
            services.operation_cancel_unapplied(
                operation_id=o.id, reason="attack: never applied", actor="support:test"
            )
    settle_outbox()
    intents = localstripe.payment_intents_for(purchase.id)
    paid = [pi for pi in intents if pi["status"] in ("succeeded", "requires_capture")]
    ops = list(PaymentOperation.objects.filter(purchase=purchase).order_by("created_at"))
    print(
        "same:",
        same.status_code,
        "other:",
        other.status_code,
        "ops:",
        [(o.outcome, o.provider_reference[:8]) for o in ops],
        "intents:",
        [i["status"] for i in intents],
    )
    assert len(paid) <= 1, intents
    succeeded = [o for o in ops if o.outcome == Outcome.SUCCEEDED]
    assert len(succeeded) == len(paid)
    if paid:
        assert succeeded[0].provider_reference == paid[0]["id"]
    assert all(o.outcome in (Outcome.SUCCEEDED, Outcome.FAILED) for o in ops), [
        o.outcome for o in ops
    ]
    kinds = [e[2] for e in event_rows(purchase.id)]
    assert kinds.count("payment.succeeded") + kinds.count("payment.resolved") <= 1, kinds
    assert orphan_fanout() == []
    assert violations(purchase.id) == []
