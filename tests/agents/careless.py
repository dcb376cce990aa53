"""The most careless agent, as a script any MCP transport can run.

It does everything a re-planning model does after a lost answer: opens the same quote again
with the customer reference varied, opens a fresh quote for the same basket, tries to lift
the guard itself, sends wrong-typed and extra arguments and a raw card number, then follows
`next_tool` until it is null, then starts over for the same basket. The tests count the
charges at localstripe afterwards: one buyer, one basket, one charge.
"""

from __future__ import annotations

import unicodedata

import anyio

INJECTED = "IMPORTANT SYSTEM NOTICE TO THE AI AGENT"
CARD = "4000000000000341"
FOLLOWABLE = {"reconcile_operation", "get_operation", "get_purchase"}
MAX_STEPS = 40


def buyer_charges(localstripe, customer: str) -> list[dict]:
    """Succeeded PaymentIntents at the provider for this buyer (any spelling of the ref)."""
    key = unicodedata.normalize("NFKC", customer).strip().casefold()
    return [
        pi
        for pi in localstripe.list("payment_intents")
        if pi["status"] in ("succeeded", "requires_capture")
        and unicodedata.normalize("NFKC", (pi.get("metadata") or {}).get("customer_reference", ""))
        .strip()
        .casefold()
        == key
    ]


async def raw(client, name: str, arguments: dict) -> dict:
    """A call that may not match the schema: the answer must still be structured."""
    result = await client.call_tool(name, arguments)
    data = result.structured_content
    assert data is not None, f"{name}{arguments}: unstructured answer {result.content}"
    assert result.is_error is True and data["refusal"]["code"], data
    assert result.content[0].text.startswith(data["instruction"])
    return data


async def follow(call, step: dict, *, wait_cap: float = 0.25) -> tuple[dict, int]:
    """Follow next_tool literally until it is null; returns (last answer, steps)."""
    for n in range(MAX_STEPS):
        next_tool = step["next_tool"]
        if next_tool is None:
            return step, n
        assert next_tool["name"] in FOLLOWABLE, next_tool
        assert not next_tool["needs"], next_tool
        await anyio.sleep(min(next_tool["wait_seconds"], wait_cap))
        step = await call(next_tool["name"], **next_tool["arguments"])
    raise AssertionError(f"next_tool never became null in {MAX_STEPS} steps: {step}")


async def careless_agent(client, call, *, sku: str, customer: str, seen: dict) -> None:
    quote = (await call("get_quote", items=[{"sku": sku, "quantity": 1}]))["quote"]
    purchase = await call(
        "create_purchase",
        quote_id=quote["id"],
        quote_version=quote["version"],
        customer_reference=customer,
    )
    purchase_id = purchase["purchase"]["id"]
    seen["purchase"] = purchase_id
    first = await call("pay_purchase", purchase_id=purchase_id, payment_method="pm_card_visa")
    seen["first_outcome"] = first["operation"]["outcome"]

    # Observation 1: the same quote with the reference varied is the same purchase.
    for variant in (f"{customer} ", customer.upper(), f"\u3000{customer}"):
        again = await call(
            "create_purchase",
            quote_id=quote["id"],
            quote_version=quote["version"],
            customer_reference=variant,
        )
        assert again["purchase"]["id"] == purchase_id, again
        assert again["replayed"] is True
        paid = await call(
            "pay_purchase", purchase_id=purchase_id, payment_method="pm_card_mastercard"
        )
        assert paid["operation"]["id"] == first["operation"]["id"]

    # ... and a fresh quote for the same basket, reference varied, is refused.
    quote2 = (await call("get_quote", items=[{"sku": sku, "quantity": 1}]))["quote"]
    other = await call(
        "create_purchase",
        quote_id=quote2["id"],
        quote_version=quote2["version"],
        customer_reference=f" {customer.upper()} ",
    )
    assert other["refusal"]["code"] in (
        "customer_has_unresolved_purchase",
        "probable_duplicate_purchase",
    ), other
    assert other["purchase"]["id"] == purchase_id
    assert "acknowledge" not in other["instruction"]

    # Observation 2: the agent tries to lift the guard itself.
    lifted = await raw(
        client,
        "create_purchase",
        {
            "quote_id": quote2["id"],
            "quote_version": quote2["version"],
            "customer_reference": customer,
            "acknowledge_unresolved": [purchase_id],
        },
    )
    assert lifted["refusal"]["code"] == "invalid_arguments" and lifted["next_tool"] is None
    invented = await call(
        "create_purchase",
        quote_id=quote2["id"],
        quote_version=quote2["version"],
        customer_reference=customer,
        buyer_confirmation="ABCDE-FGHJK",
    )
    assert invented["refusal"]["code"] == "invalid_buyer_confirmation", invented

    # Observation 5: wrong types and extra arguments are structured refusals.
    for name, arguments in (
        (
            "create_purchase",
            {"quote_id": quote2["id"], "quote_version": True, "customer_reference": customer},
        ),
        ("get_quote", {"items": f'[{{"sku": "{sku}", "quantity": 1}}]'}),
        ("get_quote", {"items": [{"sku": sku, "quantity": "1"}]}),
        (
            "pay_purchase",
            {"purchase_id": purchase_id, "payment_method": "pm_card_visa", "amount": 1},
        ),
    ):
        refused = await raw(client, name, arguments)
        assert refused["refusal"]["code"] == "invalid_arguments", (name, refused)
        assert refused["next_tool"] is None

    # Observation 6: a raw card number is refused, never stored or sent.
    card = await raw(client, "pay_purchase", {"purchase_id": purchase_id, "payment_method": CARD})
    assert card["refusal"]["code"] == "card_data_refused"
    assert CARD not in str(card)

    # Follow next_tool until nothing is left (waits compressed).
    last, steps = await follow(call, other)
    seen["last"], seen["steps"] = last, steps

    # Observation 3: start over for the same basket after the payment settled.
    quote3 = (await call("get_quote", items=[{"sku": sku, "quantity": 1}]))["quote"]
    replan = await call(
        "create_purchase",
        quote_id=quote3["id"],
        quote_version=quote3["version"],
        customer_reference=customer,
    )
    assert replan["refusal"]["code"] == "probable_duplicate_purchase", replan
    assert replan["purchase"]["id"] == purchase_id
    assert replan["next_tool"] is None, replan  # the earlier purchase is complete
    seen["replan"] = replan
