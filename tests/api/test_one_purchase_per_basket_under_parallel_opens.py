"""A buyer's purchase opened many times at once over real HTTP: the same quote under one
key and under many, and other quotes of the same basket. One purchase; every answer that
opened or returned a purchase names it; a refused open leaves no purchase, no history and
no event (the open runs in the keyed request's transaction, without a savepoint)."""

from __future__ import annotations

import uuid

import pytest
import requests

from payments.models import IdempotencyRecord, OperationTransition, Purchase
from tests.api.client import Api
from tests.events.event_judge import orphan_events, orphan_fanout, violations
from tests.factories import ProductFactory, make_client

pytestmark = pytest.mark.django_db(transaction=True)


def test_parallel_opens_of_one_basket_make_one_purchase(live_server, send_at_once):
    client, key = make_client(limit=10_000_000)
    shop = Api(key, client)
    sku = ProductFactory(price=1500).sku
    quotes = [shop.quote(sku).json() for _ in range(3)]
    customer = f"cust-{uuid.uuid4().hex[:8]}"
    url = f"{live_server.url}/api/v1/purchases"

    def body(q):
        return {
            "quote_id": q["id"],
            "quote_version": q["version"],
            "customer": {"reference": customer, "email": "buyer@example.com"},
        }

    def send(k, b):
        return requests.post(
            url,
            json=b,
            headers={"Authorization": f"Api-Key {key}", "Idempotency-Key": k},
            timeout=30,
        )

    shared = str(uuid.uuid4())
    sends = [lambda: send(shared, body(quotes[0])) for _ in range(3)]
    sends += [lambda: send(str(uuid.uuid4()), body(quotes[0])) for _ in range(2)]
    sends += [lambda q=q: send(str(uuid.uuid4()), body(q)) for q in quotes[1:]]
    answers = send_at_once(sends)
    codes = [getattr(a, "status_code", repr(a)) for a in answers]
    print(codes, [a.json().get("code") for a in answers if a.status_code >= 400])
    assert not [a for a in answers if isinstance(a, Exception)], answers
    purchases = list(Purchase.objects.all())
    assert len(purchases) == 1, [(p.id, p.quote_id) for p in purchases]
    pid = purchases[0].id
    for a in answers:
        assert a.status_code in (200, 201, 409), (a.status_code, a.text[:300])
        if a.status_code in (200, 201):
            assert a.json()["id"] == pid
    assert (
        OperationTransition.objects.filter(field="status", target="awaiting_payment").count() == 1
    )
    assert orphan_events() == [] and orphan_fanout() == []
    assert violations(pid) == []
    bound = IdempotencyRecord.objects.exclude(resource_id="").exclude(resource_id=pid)
    assert not bound.filter(resource_type="purchase").exists()
