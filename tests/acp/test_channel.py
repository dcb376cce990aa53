"""The way in is on the purchase (`channel`), set by each way in, and every surface shows
it: the console's purchase list (search) and detail, the customer's status page, and the
`verity_purchases{channel,status}` gauge at /metrics. An ACP purchase beside a REST one
(and an MCP one: each way in sets its own)."""

from __future__ import annotations

import re
import uuid

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from rest_framework.test import APIClient

from agents import tools
from payments.models import Purchase, PurchaseChannel
from support.access import Role, ensure_groups
from tests.acp.tokens import issue_spt
from tests.factories import make_client

pytestmark = pytest.mark.django_db(transaction=True)


def _rest_purchase(sku: str, reference: str) -> Purchase:
    _, key = make_client(name="storefront")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")

    def post(path, body):
        r = api.post(f"/api/v1/{path}", body, format="json", HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()))
        assert r.status_code == 201, r.content
        return r.json()

    quote = post("quotes", {"items": [{"sku": sku, "quantity": 1}], "currency": "usd"})
    purchase = post(
        "purchases",
        {
            "quote_id": quote["id"],
            "quote_version": quote["version"],
            "customer": {"reference": reference, "email": f"{reference}@example.com"},
        },
    )
    return Purchase.objects.get(pk=purchase["id"])


def _acp_purchase(agent, sku: str, email: str) -> Purchase:
    session = agent.create(sku).json()
    r = agent.complete(session["id"], issue_spt(1250), email)
    assert r.status_code == 200, r.text
    return Purchase.objects.get(pk=r.json()["order"]["id"])


def test_each_way_in_sets_the_channel_and_every_surface_shows_it(agent, tea, settings):
    settings.METRICS_CACHE_SECONDS = 0
    prefix = f"chan-{uuid.uuid4().hex[:6]}"
    acp = _acp_purchase(agent, tea.sku, f"{prefix}-acp@example.com")
    rest = _rest_purchase(tea.sku, f"{prefix}-rest")
    client_obj, _ = make_client(name="mcp-agent")
    quote = tools.get_quote(
        api_client=client_obj, items=[tools.QuoteItem(sku=tea.sku, quantity=1)]
    ).quote
    mcp = tools.create_purchase(
        api_client=client_obj,
        quote_id=quote["id"],
        quote_version=quote["version"],
        customer_reference=f"{prefix}-mcp",
        customer_email=f"{prefix}-mcp@example.com",
    ).purchase

    # Stored by the way in.
    assert acp.channel == PurchaseChannel.ACP
    assert rest.channel == PurchaseChannel.API
    assert Purchase.objects.get(pk=mcp["id"]).channel == PurchaseChannel.MCP

    # The console: purchase detail and the purchase list (search).
    ensure_groups()
    user = User.objects.create_user(username="olga-chan", password="pw")
    user.groups.add(Group.objects.get(name=Role.SUPPORT))
    console = Client()
    console.force_login(user)
    for purchase, label in (
        (acp, "AI agent (Agentic Commerce Protocol)"),
        (rest, "Shop checkout (REST API)"),
    ):
        page = console.get(f"/console/purchases/{purchase.pk}/").content.decode()
        assert f'<dd data-channel="{purchase.channel}">{label}</dd>' in page
    listing = console.get("/console/search/", {"q": prefix}).content.decode()
    rows = {
        m: line
        for line in listing.splitlines()
        if "<li>" in line
        for m in (acp.pk, rest.pk, mcp["id"])
        if m in line
    }
    assert 'data-channel="acp"' in rows[acp.pk]
    assert 'data-channel="api"' in rows[rest.pk] and 'data-channel="mcp"' in rows[mcp["id"]]

    # The customer's status page.
    for purchase in (acp, rest):
        page = Client().get(f"/status/{purchase.status_token}/").content.decode()
        assert f'<dd data-channel="{purchase.channel}">' in page

    # Metrics: a gauge by channel and status.
    text = Client().get("/metrics").content.decode()
    samples = {
        (c, s): float(v)
        for c, s, v in re.findall(
            r'^verity_purchases\{channel="(\w+)",status="(\w+)"\} (\S+)$', text, re.M
        )
    }
    assert samples[("acp", "paid")] == 1.0
    assert samples[("api", "awaiting_payment")] == 1.0
    assert samples[("mcp", "awaiting_payment")] == 1.0
