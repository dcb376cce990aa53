"""The localstripe launcher lists newest first, as Stripe does ("sorted in order of
creation, with the most recent appearing first"), and pages on from `starting_after`.
localstripe listed PaymentIntents oldest first: a read-back by metadata (the lost answer of
a create) pages from the first page, so in a long soak each one paged through every older
PaymentIntent, the fake provider's one event loop fell behind, and past the page bound
recent payments were never read. Plain HTTP."""

import time
import uuid

import requests
from django.conf import settings


def _call(method: str, path: str, status: int = 200, **kwargs) -> requests.Response:
    r = requests.request(
        method,
        f"{settings.STRIPE_API_BASE}{path}",
        timeout=10,
        auth=(settings.STRIPE_API_KEY, ""),
        **kwargs,
    )
    assert r.status_code == status, r.text
    return r


def _post(path: str, **data) -> dict:
    return _call("POST", path, data=data).json()


def _list(resource: str, **params) -> dict:
    return _call("GET", f"/v1/{resource}", params=params).json()


def _intent(tag: str) -> str:
    return _post("/v1/payment_intents", amount=500, currency="usd", **{"metadata[tag]": tag})["id"]


def _page(**params) -> dict:
    return _list("payment_intents", **params)


def test_payment_intents_are_listed_newest_first_and_paged_on(localstripe):
    tag = uuid.uuid4().hex
    first, second, third = (_intent(tag) for _ in range(3))
    page = _page(limit=2)
    assert [pi["id"] for pi in page["data"]] == [third, second]
    assert page["has_more"] is True
    after = _page(limit=2, starting_after=second)
    assert after["data"][0]["id"] == first


def test_a_list_takes_stripes_created_bounds(localstripe):
    """`created[gt|gte|lt|lte]` as Stripe's lists take them (a read by metadata bounds
    itself to its operation's time); anything else is a 400, not a silent full list."""
    tag = uuid.uuid4().hex
    older = _intent(tag)
    time.sleep(1.1)  # whole seconds
    newer = _intent(tag)
    [listed] = [pi for pi in _page(limit=5)["data"] if pi["id"] == newer]
    since = listed["created"]

    recent = [pi["id"] for pi in _page(limit=100, **{"created[gte]": since})["data"]]
    before = [pi["id"] for pi in _page(limit=100, **{"created[lt]": since})["data"]]
    assert newer in recent and older not in recent
    assert older in before and newer not in before
    _call("GET", "/v1/payment_intents", 400, params={"created[after]": since})


def test_refunds_of_a_payment_intent_take_the_created_bounds(localstripe):
    """The refund list, by PaymentIntent or not, filtered by `created` after localstripe's
    own filter: nothing outside the bound, nothing inside it missing, `has_more` counted
    on what the bound leaves."""
    pi = _post(
        "/v1/payment_intents",
        amount=900,
        currency="usd",
        payment_method="pm_card_visa",
        confirm="true",
    )
    older = _post("/v1/refunds", payment_intent=pi["id"], amount=100)
    time.sleep(1.1)  # whole seconds
    newer = _post("/v1/refunds", payment_intent=pi["id"], amount=200)
    since = newer["created"]

    page = _list("refunds", payment_intent=pi["id"], limit=1, **{"created[gte]": since})
    assert ([r["id"] for r in page["data"]], page["has_more"]) == ([newer["id"]], False)
    page = _list("refunds", payment_intent=pi["id"], limit=1, **{"created[lt]": since})
    assert ([r["id"] for r in page["data"]], page["has_more"]) == ([older["id"]], False)
    everyone = [r["id"] for r in localstripe.list("refunds", **{"created[gte]": since})]
    assert newer["id"] in everyone and older["id"] not in everyone


def test_paging_inside_a_created_bound_reads_each_object_once(localstripe):
    """`starting_after` pages on inside the bound, newest first, each object once."""
    tag = uuid.uuid4().hex
    made = [_intent(tag) for _ in range(3)]
    [first] = [pi for pi in localstripe.list("payment_intents") if pi["id"] == made[0]]

    seen = [
        pi["id"]
        for pi in localstripe.list("payment_intents", limit=1, **{"created[gte]": first["created"]})
        if pi["metadata"].get("tag") == tag
    ]
    assert seen == made[::-1]


def test_a_flush_empties_every_list(localstripe):
    """`DELETE /_config/data` (localstripe's Store.clear) empties the by-type index too: no
    object listed after the flush that the store no longer holds."""
    tag = uuid.uuid4().hex
    gone = _intent(tag)
    localstripe.flush()

    assert _list("payment_intents", limit=100)["data"] == []
    fresh = _intent(tag)
    assert [pi["id"] for pi in _list("payment_intents", limit=100)["data"]] == [fresh]
    _call("GET", f"/v1/payment_intents/{gone}", 404)
