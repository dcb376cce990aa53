"""What the agent reads (MCP) after a person's unverified "failed".

REST words follow the grade ("Our team resolved this payment as failed (the provider has
not confirmed it)"), but the MCP guidance of the same operation says "This payment failed
and no money moved; you may call retry_failed_payment once for it" while the provider's
own (readable) record shows the charge succeeded. Real MCP client and server, localstripe,
faults only through the fault-drill HTTP client.
"""

import pytest

from payments import services
from payments.enums import Outcome, Rail
from payments.models import ApiClient
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail
from tests.agents.test_tools import run_agent

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_agent_is_not_told_no_money_moved_on_a_persons_unverified_failed(
    agent_key, product, drill, read_drill, django_user_model, localstripe
):
    client = ApiClient.objects.get(name="agent")
    resolver = django_user_model.objects.create(username="words-resolver")
    quote = services.quote_create(
        api_client=client, items=[{"sku": product.sku, "quantity": 1}], currency="usd"
    )
    purchase = services.purchase_create(
        api_client=client,
        quote_id=quote.id,
        quote_version=quote.version,
        customer_reference="cust-words",
        customer_email="buyer@example.com",
    )
    pay = services.payment_create(
        purchase_id=purchase.id, api_client=client, payment_method="pm_card_visa"
    )
    drill(pay, DrillMode.DROP_RESPONSE_AFTER_SEND)
    pay = services.operation_dispatch(operation_id=pay.id)
    assert pay.outcome == Outcome.UNKNOWN
    read_drill("*", times=10)
    services.operation_resolve_manual(
        operation_id=pay.id,
        outcome="failed",
        reason="buyer says declined",
        actor="resolver",
        acting_user=resolver,
    )
    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1  # the provider's record

    async def script(client, call):
        return (
            await call("get_operation", operation_id=pay.id),
            await call("get_purchase", purchase_id=purchase.id),
        )

    (op_view, purchase_view), _ = run_agent(agent_key, script)
    for view in (op_view, purchase_view):
        text = str(view.get("instruction", "")).casefold()
        assert "no money moved" not in text, view["instruction"]
