"""A halt binds at claim time (a rule every money movement obeys,
docs/reliability.md#rules-every-money-movement-obeys) on the MCP face, where the provider
dedupes keys (one-call payments): checkout is halted while an agent's `pay_purchase` waits
for its purchase's lock, after the tool's own reads and before its claim. The halt committed
before the claim, so nothing may leave for the provider while it stands, and the agent is
told that nothing was done. The tool is called through the real MCP client over the
streamable HTTP transport; the provider is counted at localstripe over plain HTTP."""

from __future__ import annotations

import threading

import pytest

from payments.models import IdempotencyRecord, PaymentOperation, ProviderCall
from recovery.halts import halt_clear, halt_set
from tests.agents.test_http import run_http_agent

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_halt_set_while_pay_purchase_waits_for_the_purchase_holds_the_payment(
    mcp_url, agent_key, product, one_call, held_purchase
):
    async def open_purchase(client, call):
        quote = (await call("get_quote", items=[{"sku": product.sku, "quantity": 1}]))["quote"]
        return (
            await call(
                "create_purchase",
                quote_id=quote["id"],
                quote_version=quote["version"],
                customer_reference="cust-halted",
            )
        )["purchase"]

    purchase, _ = run_http_agent(mcp_url, agent_key, open_purchase)
    pid = purchase["id"]
    answer: dict = {}

    async def pay(client, call):
        return await call("pay_purchase", purchase_id=pid, payment_method="pm_card_visa")

    def pay_over_mcp():
        answer["paid"], answer["transcript"] = run_http_agent(mcp_url, agent_key, pay)

    held_purchase.hold(pid)
    payer = threading.Thread(target=pay_over_mcp)
    payer.start()
    held_purchase.wait_for_a_waiter("pay_purchase")
    # The tool read the purchase, found no payment and waits for its lock: halt checkout.
    halt_set(name="checkout", reason="incident", actor="ops")
    try:
        held_purchase.release()
        payer.join(30)
        assert not payer.is_alive(), "pay_purchase never answered"
        paid = answer["paid"]
        intents = one_call.payment_intents_for(pid)
        ops = list(PaymentOperation.objects.filter(purchase_id=pid).values_list("id", "outcome"))
        print(paid["instruction"], paid["refusal"], ops, [pi["status"] for pi in intents])
        # Nothing left for the provider while checkout is halted.
        assert intents == [], [pi["status"] for pi in intents]
        assert ops == [], ops
        assert not ProviderCall.objects.filter(operation__purchase_id=pid).exists()
        assert not IdempotencyRecord.objects.filter(route="mcp.pay_purchase").exists()
        # The agent is told nothing was done and to call again later, with no payment.
        assert paid["refusal"]["code"] == "workflow_halted", paid
        assert paid["operation"] is None, paid
        assert paid["instruction"].startswith("Nothing was done (workflow_halted)"), paid
        assert paid["next_tool"]["name"] == "pay_purchase", paid
        # an MCP call has no Idempotency-Key header: the refusal names none
        assert "Idempotency-Key" not in str(paid), paid
    finally:
        halt_clear(name="checkout", actor="ops", reason="over")
    # Once checkout resumes, the same call is the purchase's one payment, sent once.
    again, t = run_http_agent(mcp_url, agent_key, pay)
    assert again["refusal"] is None and again["replayed"] is False, t
    assert again["operation"]["outcome"] == "succeeded", t
    assert [pi["status"] for pi in one_call.payment_intents_for(pid)] == ["succeeded"]
    assert PaymentOperation.objects.filter(purchase_id=pid).count() == 1
