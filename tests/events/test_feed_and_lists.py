"""Pull as well as push: the events feed (cursor, type filter, bounded long-poll), the
purchases list (filters, keyset pages) and their MCP twins, each scoped to its API client."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from agents import tools
from events.models import Event
from payments.models import Purchase
from tests.api.client import ALL_SCOPES, Api, body_of
from tests.factories import make_client

pytestmark = pytest.mark.django_db(transaction=True)


def _feed(api: Api, query: str = "") -> dict:
    answer = api.get(f"events{query}")
    assert answer.status_code == 200, answer.content
    return body_of(answer)


def test_the_feed_reads_on_from_a_cursor_and_filters_by_type(shop, product, loopback_allowed):
    first = shop.new_purchase(product.sku)
    page = _feed(shop)
    assert [e["purchase"] for e in page["events"]] == [first["id"]]
    cursor = page["next_cursor"]
    second = shop.new_purchase(product.sku)
    shop.post(f"purchases/{second['id']}/cancel", {})
    page = _feed(shop, f"?after={cursor}")
    assert [(e["purchase"], e["type"]) for e in page["events"]] == [
        (second["id"], "purchase.created"),
        (second["id"], "purchase.status_changed"),
    ]
    assert [e["sequence"] for e in page["events"]] == [1, 2]
    only = _feed(shop, "?type=purchase.status_changed")
    assert [e["data"]["status"] for e in only["events"]] == ["cancelled"]
    assert _feed(shop, f"?after={page['next_cursor']}")["events"] == []
    assert shop.get("events?type=no.such.type").status_code == 400
    assert shop.get("events?after=-1").status_code == 400


def test_another_client_sees_none_of_the_events(shop, product, loopback_allowed):
    other = Api(make_client(scopes=ALL_SCOPES, name="other-shop")[1])
    shop.new_purchase(product.sku)
    assert Event.objects.count() == 1
    assert _feed(other)["events"] == []


def test_the_long_poll_answers_when_the_event_arrives(shop, product, loopback_allowed):
    cursor = _feed(shop)["next_cursor"]
    made: dict = {}

    def buy_later():
        time.sleep(0.7)
        try:
            made["purchase"] = shop.new_purchase(product.sku)
        finally:
            connection.close()

    thread = threading.Thread(target=buy_later)
    started = time.monotonic()
    thread.start()
    page = _feed(shop, f"?after={cursor}&wait=10")
    waited = time.monotonic() - started
    thread.join()
    assert [e["purchase"] for e in page["events"]] == [made["purchase"]["id"]]
    assert waited < 9  # answered by the event, not by the timeout


def test_the_purchases_list_filters_and_pages(shop, product, loopback_allowed):
    ids = [
        shop.new_purchase(product.sku, customer=name)["id"] for name in ("Ada-1", "ada-2", "carol")
    ]
    other_customer = shop.new_purchase(product.sku, customer="bob")["id"]
    shop.post(f"purchases/{ids[0]}/cancel", {})
    outsider = Api(make_client(scopes=ALL_SCOPES, name="outsider")[1])
    outsider.new_purchase(product.sku, customer="ada-1")

    everything = body_of(shop.get("purchases?limit=100"))["purchases"]
    assert {p["id"] for p in everything} == {*ids, other_customer}
    ada = body_of(shop.get("purchases?customer_reference=ADA-1"))["purchases"]
    assert {p["id"] for p in ada} == {ids[0]}  # trimmed, case-insensitive, exact
    cancelled = body_of(shop.get("purchases?status=cancelled"))["purchases"]
    assert [p["id"] for p in cancelled] == [ids[0]]
    assert body_of(shop.get("purchases?amount_min=999999"))["purchases"] == []

    seen, cursor = [], ""
    while True:
        page = body_of(shop.get(f"purchases?limit=2{'&cursor=' + cursor if cursor else ''}"))
        seen += [p["id"] for p in page["purchases"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    newest_first = list(
        Purchase.objects.filter(api_client=shop.client)
        .order_by("-created_at", "-id")
        .values_list("id", flat=True)
    )
    assert seen == newest_first
    assert shop.get("purchases?status=nope").status_code == 400
    assert shop.get("purchases?cursor=garbage").status_code == 400
    assert shop.get("purchases?created_after=yesterday").status_code == 400


def test_the_mcp_tools_list_and_wait(shop, product, loopback_allowed):
    purchase = shop.new_purchase(product.sku)
    listed = tools.list_purchases(api_client=shop.client)
    assert [p["id"] for p in listed.purchases] == [purchase["id"]]

    waited = tools.wait_for_purchase_change(
        api_client=shop.client, purchase_id=purchase["id"], after_sequence=0, timeout_seconds=0
    )
    assert [e["type"] for e in waited.events] == ["purchase.created"]
    started = time.monotonic()
    nothing = tools.wait_for_purchase_change(
        api_client=shop.client, purchase_id=purchase["id"], after_sequence=1, timeout_seconds=1
    )
    assert nothing.events == [] and time.monotonic() - started >= 1
    outsider = make_client(scopes=ALL_SCOPES, name="outsider")[0]
    refused = tools.wait_for_purchase_change(api_client=outsider, purchase_id=purchase["id"])
    assert refused.refusal is not None and refused.events is None
