"""A scripted storefront agent over real HTTP (live server, real worker, localstripe).

The agent does what agents do when an answer is slow or unclear: it times out, retries
with the same key, retries with a new key, changes the amount, adds a field, opens a
second purchase for the same customer, hammers in parallel. Whatever it does, the
provider must hold exactly one charge for the purchase and the shop exactly one order.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.utils import timezone

from payments.models import PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from recovery.models import Order, OutboxMessage
from tests.api.client import leave_crashed_payment_request, payment_body
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Agent:
    def __init__(self, base: str, api_key: str, customer: str) -> None:
        self.base = f"{base}/api/v1"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Api-Key {api_key}"
        self.customer = customer
        self.log: list[tuple[str, int | str]] = []

    def post(self, path: str, body: dict, *, key: str, timeout: float = 15.0):
        try:
            r = self.session.post(
                f"{self.base}/{path}", json=body, timeout=timeout, headers={"Idempotency-Key": key}
            )
        except requests.exceptions.Timeout:
            self.log.append((path, "timeout"))
            return None
        self.log.append((path, r.status_code))
        return r

    def get(self, path: str):
        r = self.session.get(f"{self.base}/{path}", timeout=15)
        self.log.append((path, r.status_code))
        return r

    def post_until_not_in_progress(self, path: str, body: dict, *, key: str):
        """Retries while the server says the same request is still running."""
        deadline = time.monotonic() + 20
        while True:
            r = self.post(path, body, key=key)
            if r.status_code != 409 or r.json()["code"] != "request_in_progress":
                return r
            assert int(r.headers["Retry-After"]) >= 1
            assert time.monotonic() < deadline, "request stayed in progress"
            time.sleep(0.1)  # a hurried agent: shorter than Retry-After

    def open_purchase(self, sku: str) -> requests.Response:
        q = self.post(
            "quotes",
            {"items": [{"sku": sku, "quantity": 1}], "currency": "usd"},
            key=str(uuid.uuid4()),
        )
        assert q.status_code == 201, q.text
        quote = q.json()
        return self.post(
            "purchases",
            {
                "quote_id": quote["id"],
                "quote_version": quote["version"],
                "customer": {"reference": self.customer, "email": "agent@example.com"},
            },
            key=str(uuid.uuid4()),
        )


def _one_charge_and_one_order(localstripe, purchase_id: str) -> None:
    assert len(localstripe.succeeded_charges_for(purchase_id)) == 1
    assert len(localstripe.payment_intents_for(purchase_id)) == 1
    # The order comes from the orchestrator, run by the real Celery worker via the outbox.
    wait_for(lambda: Order.objects.filter(purchase_id=purchase_id).exists(), timeout=30)
    # Count only once the worker has drained every message that is due (a duplicate step
    # run would be one of them), not after a fixed sleep that a slow worker outlasts.
    wait_for(
        lambda: (
            not OutboxMessage.objects.filter(
                processed_at__isnull=True, available_at__lte=timezone.now()
            ).exists()
        ),
        timeout=30,
    )
    assert Order.objects.filter(purchase_id=purchase_id).count() == 1


def test_agent_that_ignores_an_unknown_outcome_causes_one_charge_and_one_order(
    live_server, celery_worker, storefront, product, localstripe, drill
):
    agent = Agent(live_server.url, storefront.key, customer=f"cust-{uuid.uuid4().hex[:8]}")
    p = agent.open_purchase(product.sku)
    assert p.status_code == 201, p.text
    purchase = p.json()
    pay_path = f"purchases/{purchase['id']}/payments"
    key, body = str(uuid.uuid4()), payment_body()

    # The agent's first attempt went to a web process that died right after creating the
    # operation; and the provider's answer to the charge will be lost after it is applied.
    op = leave_crashed_payment_request(storefront, purchase["id"], key, body)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)

    # 1. It times out (the agent gives up waiting; the server carries on).
    assert agent.post(pay_path, body, key=key, timeout=0.01) is None
    # 2. Same key: the server answers the current state, which is unknown; do not retry.
    # (200 replay if the first attempt finished; 202 if this retry got there first and
    # resumed the crashed request itself.)
    r = agent.post_until_not_in_progress(pay_path, body, key=key)
    assert r.status_code in (200, 202), r.text
    assert r.json()["outcome"] == "unknown"
    assert r.json()["next_action"]["retry"] == "forbidden"
    assert len(localstripe.succeeded_charges_for(purchase["id"])) == 1  # it did charge

    # 3. It does not obey. New key: refused, naming the unresolved operation.
    r = agent.post(pay_path, body, key=str(uuid.uuid4()))
    assert (r.status_code, r.json()["code"], r.json()["operation"]) == (
        409,
        "payment_unresolved",
        op.id,
    )
    # 4. Varies the amount, same key then new key.
    r = agent.post(pay_path, {**body, "amount": 1}, key=key)
    assert (r.status_code, r.json()["code"]) == (422, "idempotency_key_reused")
    r = agent.post(pay_path, {**body, "amount": 1}, key=str(uuid.uuid4()))
    assert r.status_code in (409, 422) and r.json()["code"] in (
        "amount_mismatch",
        "payment_unresolved",
    )
    # 5. Adds a note field, same key then new key: money requests are strict,
    # so the field is refused by name before anything else is looked at.
    r = agent.post(pay_path, {**body, "note": "customer says it failed"}, key=key)
    assert (r.status_code, r.json()["code"]) == (400, "unknown_field")
    r = agent.post(pay_path, {**body, "note": "please"}, key=str(uuid.uuid4()))
    assert (r.status_code, r.json()["code"]) == (400, "unknown_field")
    r = agent.post(pay_path, {**body, "capture": "manual"}, key=key)
    assert (r.status_code, r.json()["code"]) == (422, "idempotency_key_reused")
    # 6. Opens a second purchase for the same customer.
    second = agent.open_purchase(product.sku)
    assert (second.status_code, second.json()["code"]) == (409, "customer_has_unresolved_purchase")
    # 7. Hammers in parallel with fresh keys.
    with ThreadPoolExecutor(8) as pool:
        codes = list(
            pool.map(lambda _: agent.post(pay_path, body, key=str(uuid.uuid4())), range(8))
        )
    assert {(r.status_code, r.json()["code"]) for r in codes} == {(409, "payment_unresolved")}

    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1
    assert Purchase.objects.count() == 1
    assert Order.objects.count() == 0  # unknown never satisfies a dependency

    # Reconciliation reads the provider's record: the charge happened.
    r = agent.post(f"operations/{op.id}/reconcile", {}, key=str(uuid.uuid4()))
    assert r.status_code == 200 and r.json()["outcome"] == "succeeded", r.text
    # The agent, following answers again: same key shows the settled state; new key is
    # refused as already paid.
    r = agent.post(pay_path, body, key=key)
    assert (r.status_code, r.json()["outcome"]) == (200, "succeeded")
    r = agent.post(pay_path, body, key=str(uuid.uuid4()))
    assert (r.status_code, r.json()["code"]) == (409, "already_paid")

    _one_charge_and_one_order(localstripe, purchase["id"])
    view = agent.get(f"purchases/{purchase['id']}").json()
    assert view["payment"] == {"operation": op.id, "outcome": "succeeded", "grade": "confirmed"}


def test_agent_that_times_out_on_a_normal_payment_causes_one_charge_and_one_order(
    live_server, celery_worker, storefront, product, localstripe
):
    agent = Agent(live_server.url, storefront.key, customer=f"cust-{uuid.uuid4().hex[:8]}")
    purchase = agent.open_purchase(product.sku).json()
    pay_path = f"purchases/{purchase['id']}/payments"
    key, body = str(uuid.uuid4()), payment_body()

    assert agent.post(pay_path, body, key=key, timeout=0.005) is None  # gives up at once
    r = agent.post_until_not_in_progress(pay_path, body, key=key)
    # Either the retry found the first request finished (a replay), or it arrived first
    # and did the work itself; in both cases the answer is the one charge.
    assert r.status_code in (200, 201), r.text
    assert r.json()["outcome"] == "succeeded"
    for extra in ({"amount": purchase["amount"] + 100}, {"note": "again"}, {}):
        r = agent.post(pay_path, {**body, **extra}, key=str(uuid.uuid4()))
        assert r.status_code in (400, 409, 422)
        assert r.json()["code"] in ("already_paid", "amount_mismatch", "unknown_field")
    second = agent.open_purchase(product.sku)
    # The first purchase is paid; the same buyer re-planning the same basket is a probable
    # duplicate: refused, naming the paid purchase. Only the buyer can ask.
    assert (second.status_code, second.json()["code"]) == (409, "probable_duplicate_purchase")
    assert second.json()["purchase"] == purchase["id"]
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1
    _one_charge_and_one_order(localstripe, purchase["id"])


def test_parallel_requests_with_one_key_make_one_operation(
    live_server, storefront, product, localstripe
):
    agent = Agent(live_server.url, storefront.key, customer=f"cust-{uuid.uuid4().hex[:8]}")
    purchase = agent.open_purchase(product.sku).json()
    pay_path = f"purchases/{purchase['id']}/payments"
    key, body = str(uuid.uuid4()), payment_body()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: agent.post(pay_path, body, key=key), range(8)))

    statuses = sorted(r.status_code for r in answers)
    # One request did the work; the others were told to wait or got its result.
    assert statuses.count(201) == 1, statuses
    assert set(statuses) <= {200, 201, 409}
    for r in answers:
        if r.status_code == 409:
            assert r.json()["code"] == "request_in_progress" and "Retry-After" in r.headers
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1
    assert len(localstripe.payment_intents_for(purchase["id"])) == 1
