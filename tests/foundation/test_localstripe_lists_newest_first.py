"""The localstripe launcher lists newest first, as Stripe does ("sorted in order of
creation, with the most recent appearing first"), and pages on from `starting_after`.
localstripe listed PaymentIntents oldest first: a read-back by metadata (the lost answer of
a create) pages from the first page, so in a long soak each one paged through every older
PaymentIntent, the fake provider's one event loop fell behind, and past the page bound
recent payments were never read. Plain HTTP."""

import uuid

import requests
from django.conf import settings


def _intent(tag: str) -> str:
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/v1/payment_intents",
        data={"amount": 500, "currency": "usd", "metadata[tag]": tag},
        timeout=10,
        auth=(settings.STRIPE_API_KEY, ""),
    )
    assert r.status_code == 200, r.text
    return r.json()["id"]


def _page(**params) -> dict:
    r = requests.get(
        f"{settings.STRIPE_API_BASE}/v1/payment_intents",
        params=params,
        timeout=10,
        auth=(settings.STRIPE_API_KEY, ""),
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_payment_intents_are_listed_newest_first_and_paged_on(localstripe):
    tag = uuid.uuid4().hex
    first, second, third = (_intent(tag) for _ in range(3))
    page = _page(limit=2)
    assert [pi["id"] for pi in page["data"]] == [third, second]
    assert page["has_more"] is True
    after = _page(limit=2, starting_after=second)
    assert after["data"][0]["id"] == first
