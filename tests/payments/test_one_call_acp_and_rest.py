"""An ACP complete whose one-call answer was lost (the purchase's payment unknown), then a
second complete with another token and key, and a REST payment on the same purchase by
the same platform: no second PaymentIntent may be created."""

import pytest

from payments import services
from payments.enums import Outcome
from payments.models import PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from tests.acp.agent import new_email
from tests.acp.tokens import issue_spt, spt_state

from .one_call_helpers import provider_count

pytestmark = pytest.mark.django_db(transaction=True)


def test_acp_complete_unknown_then_rest_and_a_second_complete(
    acp_agent,
    tea,
    one_call,
    platform,  # noqa: F811
    read_drill,
):
    from payments.enums import Rail
    from payments.services import provider_for_rail

    provider = provider_for_rail(Rail.STRIPE)
    session = acp_agent.create(tea.sku, 1).json()
    provider.arm_drill(key_prefix="*", step="pay", mode=DrillMode.DROP_RESPONSE_AFTER_SEND, times=2)
    read_drill(times=1)
    try:
        token = issue_spt(1250)
        first = acp_agent.complete(session["id"], token, new_email())
    finally:
        provider.drill_client.disarm_all()
    op = PaymentOperation.objects.get()  # the test's only operation (tables emptied after each)
    purchase = Purchase.objects.get(id=op.purchase_id)
    assert op.outcome == Outcome.UNKNOWN, (first.status_code, first.text[:300])
    second = acp_agent.complete(session["id"], issue_spt(1250), new_email())
    try:
        services.payment_create(
            purchase_id=purchase.id, api_client=platform[0], payment_method="pm_card_visa"
        )
        rest = "accepted"
    except services.DomainError as exc:
        rest = exc.code
    op = services.operation_reconcile(operation_id=op.id)
    counts = provider_count(one_call, purchase)
    print(
        "first:",
        first.status_code,
        first.json().get("status"),
        "second:",
        second.status_code,
        second.json().get("status"),
        "rest:",
        rest,
        "final:",
        op.outcome,
        "ops:",
        PaymentOperation.objects.filter(purchase=purchase).count(),
        "provider:",
        counts,
        "token:",
        spt_state(token)["deactivated_reason"],
    )
    assert rest != "accepted"
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1
    assert counts == (1, 1, 1) and op.outcome == Outcome.SUCCEEDED
