"""A scripted agent over MCP stdio against the live server and localstripe.

The agent pays, the answer is lost (a fault drill armed inside the server process drops
the provider's response to confirm after the provider applied it), and the agent then
does what careless agents do: pays three more times, opens another purchase for the same
customer — then follows `next_tool` until there is nothing left to do. The money moved
exactly once and exactly one order exists.
"""

from __future__ import annotations

import anyio
import pytest
from mcp import Client

from payments.enums import PAYMENT_KINDS
from payments.models import PaymentOperation, Purchase
from recovery.models import Order
from tests.agents.mcp_host import Transcript, stdio_server_params
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FOLLOWABLE = {"reconcile_operation", "get_operation", "get_purchase"}


def test_lost_answer_then_careless_retries_charge_once_and_make_one_order(
    celery_worker, localstripe, product, agent_key
):
    transcript = Transcript()
    seen: dict = {}

    async def agent() -> None:
        params = stdio_server_params(
            agent_key, VERITY_DRILL_NEXT_CONFIRM="drop_response_after_send"
        )
        async with Client(params, read_timeout_seconds=60) as client:
            call = transcript.call
            catalogue = await call(client, "list_products")
            assert product.sku in [p["sku"] for p in catalogue["products"]]

            quote = (await call(client, "get_quote", items=[{"sku": product.sku, "quantity": 1}]))[
                "quote"
            ]
            created = await call(
                client,
                "create_purchase",
                quote_id=quote["id"],
                quote_version=quote["version"],
                customer_reference="cust-mcp",
            )
            purchase_id = created["purchase"]["id"]
            assert created["next_tool"]["name"] == "pay_purchase"
            seen["purchase"] = purchase_id

            # 1. Pay; the provider charges but its answer is lost on the way back.
            first = await call(
                client, "pay_purchase", purchase_id=purchase_id, payment_method="pm_card_visa"
            )
            op = first["operation"]
            assert op["outcome"] == "unknown"
            assert op["next_action"]["retry"] == "forbidden"
            assert "Do not call pay_purchase" in first["instruction"]
            assert first["next_tool"] == {
                "name": "reconcile_operation",
                "arguments": {"operation_id": op["id"]},
                "wait_seconds": 0,
                "needs": [],
            }
            seen["operation"] = op["id"]

            # 2. The careless agent pays again, three times (even with another card).
            for method in ("pm_card_visa", "pm_card_visa", "pm_card_mastercard"):
                again = await call(
                    client, "pay_purchase", purchase_id=purchase_id, payment_method=method
                )
                assert again["replayed"] is True
                assert again["operation"]["id"] == op["id"]
                assert again["operation"]["outcome"] == "unknown"
                assert again["note"] == (
                    "This purchase already has a payment; no new payment was made."
                )
                assert "Do not call pay_purchase" in again["instruction"]

            # 3. ... and opens another purchase for the same customer: with a fresh quote it
            # is refused and pointed at the unresolved one; with the same quote it is the
            # same purchase.
            quote2 = (await call(client, "get_quote", items=[{"sku": product.sku, "quantity": 1}]))[
                "quote"
            ]
            other = await call(
                client,
                "create_purchase",
                quote_id=quote2["id"],
                quote_version=quote2["version"],
                customer_reference="cust-mcp",
            )
            assert other["refusal"]["code"] == "customer_has_unresolved_purchase"
            assert other["purchase"]["id"] == purchase_id
            assert other["next_tool"]["name"] == "reconcile_operation"
            same = await call(
                client,
                "create_purchase",
                quote_id=quote["id"],
                quote_version=quote["version"],
                customer_reference="cust-mcp",
            )
            assert same["replayed"] is True and same["purchase"]["id"] == purchase_id
            assert same["refusal"] is None and "no new purchase" in same["note"]

            # 4. Follow next_tool until nothing is left (waits compressed for the test).
            step = other
            for _ in range(40):
                next_tool = step["next_tool"]
                if next_tool is None:
                    break
                assert next_tool["name"] in FOLLOWABLE, transcript
                assert not next_tool["needs"], transcript
                await anyio.sleep(min(next_tool["wait_seconds"], 0.25))
                step = await call(client, next_tool["name"], **next_tool["arguments"])
            seen["last"] = step

    anyio.run(agent)
    purchase_id = seen["purchase"]
    # The order is made by the recovery orchestrator on the real Celery worker.
    wait_for(lambda: Order.objects.filter(purchase_id=purchase_id).exists(), timeout=30)

    # Exactly one provider charge and one PaymentIntent at localstripe.
    assert len(localstripe.succeeded_charges_for(purchase_id)) == 1, transcript
    assert len(localstripe.payment_intents_for(purchase_id)) == 1, transcript
    # One payment operation, settled by the read-back; one purchase for the customer.
    ops = PaymentOperation.objects.filter(purchase_id=purchase_id, kind__in=PAYMENT_KINDS)
    assert ops.count() == 1
    assert ops.get().outcome == "succeeded" and ops.get().verification == "provider"
    assert Purchase.objects.filter(customer_reference="cust-mcp").count() == 1
    # One order.
    assert Order.objects.filter(purchase_id=purchase_id).count() == 1
    # The agent stopped because there was nothing left to do, not because it gave up.
    assert seen["last"]["next_tool"] is None, transcript
    assert seen["last"]["purchase"]["status"] == "completed"
