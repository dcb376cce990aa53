"""Tool schemas, scopes and the retry rules, through the real MCP client (in-process
transport: the same server definition as stdio, without a subprocess per test)."""

from __future__ import annotations

import anyio
import jsonschema
import pytest
from mcp import Client

from agents.server import _ConfirmDrill, build_server
from agents.tools import TOOL_SCOPES
from payments.models import IdempotencyRecord, PaymentOperation, Purchase
from tests.agents.mcp_host import Transcript
from tests.factories import make_client

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = {
    "list_products",
    "get_quote",
    "create_purchase",
    "pay_purchase",
    "get_purchase",
    "get_operation",
    "reconcile_operation",
    "request_refund",
    "retry_failed_payment",
    "list_purchases",
    "wait_for_purchase_change",
}


def run_agent(key: str, script, **server_kw):
    """Run `script(client, call)` against a server authenticated as `key`."""
    transcript = Transcript()

    async def main():
        # close_connections: tools run on SDK worker threads; their DB connections must
        # not outlive the test (the test database is dropped at the end).
        async with Client(build_server(api_key=key, close_connections=True, **server_kw)) as client:
            return await script(client, lambda name, **a: transcript.call(client, name, **a))

    return anyio.run(main), transcript


async def _new_purchase(call, sku: str, customer: str) -> dict:
    quote = (await call("get_quote", items=[{"sku": sku, "quantity": 1}]))["quote"]
    return (
        await call(
            "create_purchase",
            quote_id=quote["id"],
            quote_version=quote["version"],
            customer_reference=customer,
        )
    )["purchase"]


def test_each_tool_publishes_a_valid_schema_and_no_key_or_amount_to_pay(agent_key):
    async def script(client, call):
        return (await client.list_tools()).tools

    tools, _ = run_agent(agent_key, script)
    assert {t.name for t in tools} == TOOLS
    for tool in tools:
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        jsonschema.Draft202012Validator.check_schema(tool.output_schema)
        assert set(tool.output_schema["required"]) == {"instruction"}
        assert TOOL_SCOPES[tool.name] in tool.description  # the rule is stated plainly
        assert tool.input_schema["additionalProperties"] is False, tool.name
        props = set(tool.input_schema.get("properties", {}))
        assert not {p for p in props if "key" in p or "idempotency" in p}, tool.name
    by_name = {t.name: t for t in tools}
    pay = by_name["pay_purchase"].input_schema
    assert set(pay["properties"]) == {"purchase_id", "payment_method"}
    assert set(pay["required"]) == {"purchase_id", "payment_method"}
    assert "never charges again" in by_name["pay_purchase"].description
    assert "FAILED" in by_name["retry_failed_payment"].description
    validator = jsonschema.Draft202012Validator(by_name["get_quote"].input_schema)
    assert validator.is_valid({"items": [{"sku": "TEA-001", "quantity": 2}]})
    assert not validator.is_valid({"items": [{"sku": "TEA-001", "quantity": 0}]})
    assert not validator.is_valid({"items": []})


def test_an_amount_or_a_key_sent_to_pay_purchase_is_refused_not_ignored(product, agent_key):
    async def script(client, call):
        purchase = await _new_purchase(call, product.sku, "cust-extra")
        answers = []
        for extra in ({"amount": 1}, {"idempotency_key": "mine"}):
            answers.append(
                await client.call_tool(
                    "pay_purchase",
                    {"purchase_id": purchase["id"], "payment_method": "pm_card_visa", **extra},
                )
            )
        return purchase, answers

    (purchase, answers), _ = run_agent(agent_key, script)
    for answer, name in zip(answers, ("amount", "idempotency_key"), strict=False):
        assert answer.is_error is True
        assert name in answer.content[0].text and "not permitted" in answer.content[0].text
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0


def test_a_call_missing_a_scope_is_refused_with_a_clear_error(product, agent_key):
    _, reader_key = make_client(scopes=("purchases:read",), name="reader")

    async def make(client, call):
        return await _new_purchase(call, product.sku, "cust-scope")

    purchase, _ = run_agent(agent_key, make)

    async def script(client, call):
        listed = await call("list_products")
        paid = await client.call_tool(
            "pay_purchase", {"purchase_id": purchase["id"], "payment_method": "pm_card_visa"}
        )
        refund = await call("request_refund", purchase_id=purchase["id"])
        seen = await call("get_purchase", purchase_id=purchase["id"])
        return listed, paid, refund, seen

    (listed, paid, refund, seen), _ = run_agent(reader_key, script)
    assert listed["refusal"] is None and listed["products"]
    assert paid.is_error is True
    assert paid.structured_content["refusal"]["code"] == "forbidden_scope"
    assert "'purchases:write'" in paid.content[0].text and "pay_purchase" in paid.content[0].text
    assert paid.structured_content["next_tool"] is None
    assert (
        refund["refusal"]["code"] == "forbidden_scope" and "refunds:write" in refund["instruction"]
    )
    # Reads work with the read scope, for this client's own purchases only.
    assert seen["refusal"]["code"] == "not_found" and seen["purchase"] is None
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0


def test_an_invalid_or_revoked_key_is_refused(product, agent_key):
    client, key = make_client(name="soon-revoked")
    client.revoked = True
    client.save(update_fields=["revoked"])

    async def script(client, call):
        return await call("list_products")

    result, _ = run_agent(key, script)
    assert result["refusal"]["code"] == "unauthenticated" and result["products"] is None


def test_retry_failed_payment_refuses_anything_not_definitively_failed(
    product, agent_key, localstripe
):
    async def script(client, call):
        purchase = await _new_purchase(call, product.sku, "cust-retry-unknown")
        unknown = await call(
            "pay_purchase", purchase_id=purchase["id"], payment_method="pm_card_visa"
        )
        refused = await call(
            "retry_failed_payment",
            operation_id=unknown["operation"]["id"],
            payment_method="pm_card_mastercard",
        )
        return purchase, unknown, refused

    (purchase, unknown, refused), _ = run_agent(
        agent_key, script, before_dispatch=_ConfirmDrill("drop_response_after_send")
    )
    assert unknown["operation"]["outcome"] == "unknown"
    assert refused["refusal"]["code"] == "retry_not_allowed"
    assert refused["operation"]["id"] == unknown["operation"]["id"]
    assert refused["next_tool"]["name"] == "reconcile_operation"
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1
    assert len(localstripe.payment_intents_for(purchase["id"])) == 1


def test_a_declined_payment_is_retried_once_only_through_retry_failed_payment(
    product, agent_key, localstripe
):
    async def script(client, call):
        purchase = await _new_purchase(call, product.sku, "cust-decline")
        declined = await call(
            "pay_purchase", purchase_id=purchase["id"], payment_method="pm_card_chargeCustomerFail"
        )
        op_id = declined["operation"]["id"]
        pay_again = await call(
            "pay_purchase", purchase_id=purchase["id"], payment_method="pm_card_visa"
        )
        same_card = await call("retry_failed_payment", operation_id=op_id)
        retried = await call(
            "retry_failed_payment", operation_id=op_id, payment_method="pm_card_visa"
        )
        twice = await call(
            "retry_failed_payment", operation_id=op_id, payment_method="pm_card_mastercard"
        )
        after = await call("get_operation", operation_id=op_id)
        return purchase, declined, pay_again, same_card, retried, twice, after

    (purchase, declined, pay_again, same_card, retried, twice, after), t = run_agent(
        agent_key, script
    )
    assert declined["operation"]["outcome"] == "failed"
    assert declined["next_tool"]["name"] == "retry_failed_payment"
    assert declined["next_tool"]["needs"] == ["payment_method"]
    # pay_purchase does not turn into a retry: it shows the failed payment.
    assert pay_again["replayed"] and pay_again["operation"]["id"] == declined["operation"]["id"]
    assert same_card["refusal"]["code"] == "retry_needs_new_method"
    assert retried["operation"]["outcome"] == "succeeded", t
    assert retried["operation"]["retry_of"] == declined["operation"]["id"]
    assert twice["replayed"] and twice["operation"]["id"] == retried["operation"]["id"]
    assert after["next_tool"] == {
        "name": "get_operation",
        "wait_seconds": 0,
        "needs": [],
        "arguments": {"operation_id": retried["operation"]["id"]},
    }
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 2
    assert len(localstripe.succeeded_charges_for(purchase["id"])) == 1


def test_refund_is_one_refund_per_purchase_and_amount(product, localstripe):
    _, key = make_client(name="refunder", auto_refund_limit=1_000_000)

    async def script(client, call):
        purchase = await _new_purchase(call, product.sku, "cust-refund")
        paid = await call("pay_purchase", purchase_id=purchase["id"], payment_method="pm_card_visa")
        first = await call("request_refund", purchase_id=purchase["id"])
        again = await call("request_refund", purchase_id=purchase["id"])
        return purchase, paid, first, again

    (purchase, paid, first, again), t = run_agent(key, script)
    assert paid["operation"]["outcome"] == "succeeded"
    assert (
        first["operation"]["kind"] == "refund" and first["operation"]["outcome"] == "succeeded"
    ), t
    assert again["replayed"] and again["operation"]["id"] == first["operation"]["id"]
    assert len(localstripe.refunds_for(paid["operation"]["id"])) <= 1
    pi = localstripe.payment_intents_for(purchase["id"])[0]["id"]
    assert len(localstripe.refunds_for(pi)) == 1
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="refund").count() == 1
    assert IdempotencyRecord.objects.filter(route="mcp.request_refund").count() == 1
    assert Purchase.objects.get(id=purchase["id"]).status in ("refunded", "refund_pending")


def test_a_halted_checkout_is_a_wait_and_call_again_not_a_new_key(product, agent_key):
    from recovery.halts import halt_clear, halt_set

    async def make(client, call):
        return await _new_purchase(call, product.sku, "cust-halt")

    purchase, _ = run_agent(agent_key, make)
    halt_set(name="checkout", reason="provider incident drill", actor="ops1")

    async def pay(client, call):
        return await call("pay_purchase", purchase_id=purchase["id"], payment_method="pm_card_visa")

    halted, _ = run_agent(agent_key, pay)
    assert halted["refusal"]["code"] == "workflow_halted"
    assert "Idempotency" not in halted["instruction"]
    assert halted["next_tool"]["name"] == "pay_purchase"
    assert halted["next_tool"]["arguments"] == {
        "purchase_id": purchase["id"],
        "payment_method": "pm_card_visa",
    }
    assert halted["next_tool"]["wait_seconds"] > 0
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0

    halt_clear(name="checkout", actor="ops1", reason="incident over")
    paid, _ = run_agent(agent_key, pay)
    assert paid["operation"]["outcome"] == "succeeded"


def test_concurrent_pay_purchase_calls_are_one_payment(product, agent_key, localstripe):
    async def make(client, call):
        return await _new_purchase(call, product.sku, "cust-race")

    purchase, _ = run_agent(agent_key, make)

    async def race(client, call):
        answers = []

        async def pay():
            answers.append(
                await call(
                    "pay_purchase", purchase_id=purchase["id"], payment_method="pm_card_visa"
                )
            )

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(pay)
        return answers

    answers, t = run_agent(agent_key, race)
    assert len({a["operation"]["id"] for a in answers}) == 1, t
    assert all(a["refusal"] is None for a in answers), t
    assert sum(not a["replayed"] for a in answers) == 1, t
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1
    assert len(localstripe.payment_intents_for(purchase["id"])) == 1
    assert len(localstripe.succeeded_charges_for(purchase["id"])) == 1


def test_a_second_refund_of_the_same_amount_is_request_two(product, localstripe):
    """A key of (purchase, amount) could not express a second refund of 500."""
    _, key = make_client(name="refunder2", auto_refund_limit=1_000_000)

    async def script(client, call):
        purchase = await _new_purchase(call, product.sku, "cust-refund-2")
        paid = await call("pay_purchase", purchase_id=purchase["id"], payment_method="pm_card_visa")
        first = await call("request_refund", purchase_id=purchase["id"], amount=500)
        again = await call("request_refund", purchase_id=purchase["id"], amount=500)
        second = await call("request_refund", purchase_id=purchase["id"], amount=500, request=2)
        second_again = await call(
            "request_refund", purchase_id=purchase["id"], amount=500, request=2
        )
        return purchase, paid, first, again, second, second_again

    (purchase, paid, first, again, second, second_again), t = run_agent(key, script)
    assert first["operation"]["outcome"] == "succeeded", t
    assert again["replayed"] and again["operation"]["id"] == first["operation"]["id"]
    assert second["operation"]["outcome"] == "succeeded", t
    assert second["operation"]["id"] != first["operation"]["id"]
    assert second_again["replayed"] and second_again["operation"]["id"] == second["operation"]["id"]
    pi = localstripe.payment_intents_for(purchase["id"])[0]["id"]
    assert sorted(r["amount"] for r in localstripe.refunds_for(pi)) == [500, 500]
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="refund").count() == 2
