"""The streamable HTTP transport mounted in the Django app, through the real MCP client
over a real (loopback) HTTP server: Api-Key authentication and the same scopes."""

from __future__ import annotations

import anyio
import httpx2
import pytest
import requests
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from payments.models import PaymentOperation
from tests.agents.mcp_host import Transcript
from tests.factories import make_client

pytestmark = pytest.mark.django_db(transaction=True)


def run_http_agent(url: str, key: str, script):
    transcript = Transcript()

    async def main():
        http = httpx2.AsyncClient(headers={"Authorization": f"Api-Key {key}"}, timeout=60)
        async with (
            http,
            Client(
                streamable_http_client(url, http_client=http), read_timeout_seconds=30
            ) as client,
        ):
            return await script(client, lambda name, **a: transcript.call(client, name, **a))

    return anyio.run(main), transcript


def test_without_a_valid_api_key_the_endpoint_answers_401(mcp_url):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for headers in ({}, {"Authorization": "Api-Key nope.nope"}, {"Authorization": "Bearer x"}):
        r = requests.post(
            mcp_url,
            json=body,
            timeout=10,
            headers={"Accept": "application/json, text/event-stream", **headers},
        )
        assert r.status_code == 401
        assert r.json()["code"] == "unauthenticated"
        assert r.headers["WWW-Authenticate"].startswith("Api-Key")


def test_an_agent_pays_over_http_and_scopes_apply(mcp_url, product, agent_key, localstripe):
    async def script(client, call):
        names = {t.name for t in (await client.list_tools()).tools}
        quote = (await call("get_quote", items=[{"sku": product.sku, "quantity": 2}]))["quote"]
        purchase = (
            await call(
                "create_purchase",
                quote_id=quote["id"],
                quote_version=quote["version"],
                customer_reference="cust-http",
            )
        )["purchase"]
        paid = await call("pay_purchase", purchase_id=purchase["id"], payment_method="pm_card_visa")
        again = await call(
            "pay_purchase", purchase_id=purchase["id"], payment_method="pm_card_visa"
        )
        return names, quote, purchase, paid, again

    (names, quote, purchase, paid, again), t = run_http_agent(mcp_url, agent_key, script)
    assert "pay_purchase" in names
    assert paid["operation"]["outcome"] == "succeeded", t
    assert paid["operation"]["amount"] == quote["amount"] == 2 * product.price
    assert again["replayed"] and again["operation"]["id"] == paid["operation"]["id"]
    assert len(localstripe.succeeded_charges_for(purchase["id"])) == 1

    _, reader_key = make_client(scopes=("purchases:read",), name="http-reader")

    async def reader(client, call):
        return await call("request_refund", purchase_id=purchase["id"])

    refused, _ = run_http_agent(mcp_url, reader_key, reader)
    assert refused["refusal"]["code"] == "forbidden_scope"
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"], kind="refund").count() == 0


def test_no_server_sent_event_stream_is_offered(mcp_url, agent_key):
    # Stateless JSON transport: a GET stream (or session DELETE) is answered 405, which
    # clients treat as "no standalone stream", never a 500.
    headers = {"Authorization": f"Api-Key {agent_key}", "Accept": "text/event-stream"}
    assert requests.get(mcp_url, headers=headers, timeout=10).status_code == 405
    assert requests.delete(mcp_url, headers=headers, timeout=10).status_code == 405
