"""/metrics answers only an allowed scraper (bearer token or allow-listed
network), computes its figures with bounded aggregate queries (no id lists), and caches
them for a few seconds. Effects counted: SQL statements per scrape and their size."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from payments.enums import OperationKind, Outcome
from payments.models import PaymentOperation, Purchase, Quote
from recovery.models import Order

pytestmark = pytest.mark.django_db


def _paid_with_orders(n: int, start: int = 0) -> list[str]:
    now = timezone.now()
    ids = []
    for i in range(start, start + n):
        quote = Quote.objects.create(
            items=[], amount=900, currency="usd", expires_at=now + timedelta(minutes=30)
        )
        purchase = Purchase.objects.create(
            quote=quote,
            amount=900,
            currency="usd",
            customer_reference=f"c{i}",
            customer_email=f"c{i}@example.com",
        )
        PaymentOperation.objects.create(
            purchase=purchase,
            kind=OperationKind.CHARGE,
            amount=900,
            currency="usd",
            outcome=Outcome.SUCCEEDED,
            settled_at=now - timedelta(seconds=10),
        )
        Order.objects.create(purchase_id=purchase.id, reference=f"ord-{purchase.id}")
        ids.append(purchase.id)
    return ids


def _scrape(client, **headers):
    with CaptureQueriesContext(connection) as queries:
        answer = client.get("/metrics", **headers)
    return answer, [q["sql"] for q in queries.captured_queries]


def test_metrics_refuse_an_outside_scraper_before_any_query(client, settings):
    # given the default protection (loopback) and a token configured
    settings.METRICS_TOKEN = "scrape-token-for-tests"

    # when an outside address scrapes with no token, and with a wrong one
    anonymous, sql = _scrape(client, REMOTE_ADDR="198.51.100.7")
    wrong, _ = _scrape(client, REMOTE_ADDR="198.51.100.7", HTTP_AUTHORIZATION="Bearer nope")
    right, _ = _scrape(
        client, REMOTE_ADDR="198.51.100.7", HTTP_AUTHORIZATION="Bearer scrape-token-for-tests"
    )

    # then only the token opens it, and the refused scrape touched no table
    assert (anonymous.status_code, wrong.status_code, right.status_code) == (404, 404, 200)
    assert sql == []
    assert b"verity_operations" in right.content


def test_scrape_work_does_not_grow_with_volume(client, settings):
    # given no scrape cache (this counts each scrape's own statements: with the default
    # cache, a second scrape within its seconds reads part of the first's collection)
    settings.METRICS_CACHE_SECONDS = 0
    # and a few paid purchases with orders, then many more
    few = _paid_with_orders(3)
    _, small = _scrape(client)
    many = few + _paid_with_orders(150, start=3)

    # when scraped again
    answer, large = _scrape(client)

    # then the same number of statements, none carrying ids, none larger than before
    assert answer.status_code == 200
    assert len(large) == len(small)
    assert not any(pid in sql for sql in large for pid in many)
    assert max(map(len, large)) == max(map(len, small))
    assert b"verity_order_after_payment_seconds_count 153.0" in answer.content
    # (orders were written about 10 s after the provider success)
    assert b'verity_order_after_payment_seconds_bucket{le="5.0"} 0.0' in answer.content
    assert b'verity_order_after_payment_seconds_bucket{le="60.0"} 153.0' in answer.content


def test_scrapes_in_a_burst_share_one_collection(client, settings):
    # given a cache of a few seconds
    settings.METRICS_CACHE_SECONDS = 5
    _scrape(client)

    # when scraped again at once; then no database work
    answer, sql = _scrape(client)
    assert answer.status_code == 200 and sql == []
