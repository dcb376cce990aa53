"""The localstripe launcher's idempotency layer behaves as Stripe documents it
(docs.stripe.com/api/idempotent_requests): same key and parameters -> the stored answer,
replayed even when it was a 500; other parameters -> 400 idempotency_error; a key in use
-> 409; keys expire after the window. Plain HTTP against the stack's localstripe."""

import threading
import time

import pytest
import requests
from django.conf import settings


@pytest.fixture
def ls(localstripe):
    localstripe.idempotency(enabled="true", window_seconds=86400, hold_seconds=0, flush="true")
    yield localstripe
    localstripe.idempotency(enabled="false", window_seconds=86400, hold_seconds=0, flush="true")


def _post(path, data, key):
    return requests.post(
        f"{settings.STRIPE_API_BASE}/v1/{path}",
        data=data,
        timeout=10,
        auth=(settings.STRIPE_API_KEY, ""),
        headers={"Idempotency-Key": key},
    )


def _pay(ls_key, amount=700, method="pm_card_visa"):
    return _post(
        "payment_intents",
        {
            "amount": amount,
            "currency": "usd",
            "confirm": "true",
            "payment_method": method,
            "metadata[operation_id]": ls_key,
        },
        ls_key,
    )


def _count(ls, key):
    return len(
        [pi for pi in ls.list("payment_intents") if pi["metadata"].get("operation_id") == key]
    )


def test_the_same_key_and_parameters_replay_the_stored_answer(ls):
    first = _pay("k-same")
    again = _pay("k-same")
    assert first.status_code == again.status_code == 200
    assert first.json()["status"] == "succeeded"
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert _count(ls, "k-same") == 1


def test_other_parameters_under_the_key_are_an_idempotency_error(ls):
    _pay("k-other")
    other = _pay("k-other", amount=800)
    assert other.status_code == 400
    assert other.json()["error"]["type"] == "idempotency_error"
    assert _count(ls, "k-other") == 1


def test_a_decline_and_a_500_are_stored_and_replayed(ls):
    declined = _pay("k-decline", method="pm_card_chargeCustomerFail")
    assert declined.status_code == 402
    assert declined.json()["error"]["payment_intent"]["id"].startswith("pi_")
    assert _pay("k-decline", method="pm_card_chargeCustomerFail").status_code == 402
    assert _count(ls, "k-decline") == 1
    # localstripe answers a confirm naming a payment method with a 500: stored like any.
    intent = _post(
        "payment_intents",
        {"amount": 500, "currency": "usd", "payment_method": "pm_card_visa"},
        "k-create",
    ).json()
    failed = _post(
        f"payment_intents/{intent['id']}/confirm", {"payment_method": "pm_card_visa"}, "k-500"
    )
    replayed = _post(
        f"payment_intents/{intent['id']}/confirm", {"payment_method": "pm_card_visa"}, "k-500"
    )
    assert failed.status_code == replayed.status_code == 500
    assert replayed.headers["Idempotent-Replayed"] == "true"


def test_a_key_in_use_is_a_409_and_nothing_runs_twice(ls):
    ls.idempotency(hold_seconds=1)
    answers = []
    first = threading.Thread(target=lambda: answers.append(_pay("k-busy").status_code))
    first.start()
    time.sleep(0.3)
    busy = _pay("k-busy")
    first.join()
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "idempotency_key_in_use"
    assert answers == [200]
    assert _count(ls, "k-busy") == 1


def test_a_key_runs_a_new_request_after_its_window(ls):
    ls.idempotency(window_seconds=0.5)
    first = _pay("k-expire")
    time.sleep(0.6)
    again = _pay("k-expire")
    assert again.status_code == 200 and again.json()["id"] != first.json()["id"]
    assert "Idempotent-Replayed" not in again.headers
    assert _count(ls, "k-expire") == 2


def test_off_by_default_every_request_runs(localstripe):
    assert localstripe.idempotency()["enabled"] is False
    _pay("k-off")
    _pay("k-off")
    assert _count(localstripe, "k-off") == 2
