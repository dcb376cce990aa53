"""The localstripe launcher refunds no more than what is left of a charge, as Stripe does:
more answers 400 (`amount_too_large`, or `charge_already_refunded` once nothing is left)
and moves nothing; a refund without an amount returns what is left. Without it, a refund
made in the dashboard and one of Verity's could together return more than was paid, and
the soak's ledger judge would count money no real provider moves. Plain HTTP."""

import requests
from django.conf import settings


def _post(path: str, data: dict) -> requests.Response:
    return requests.post(
        f"{settings.STRIPE_API_BASE}/v1/{path}",
        data=data,
        timeout=10,
        auth=(settings.STRIPE_API_KEY, ""),
    )


def _charged(amount: int) -> str:
    r = _post(
        "payment_intents",
        {"amount": amount, "currency": "usd", "confirm": "true", "payment_method": "pm_card_visa"},
    )
    assert r.status_code == 200, r.text
    return r.json()["id"]


def test_refunds_stop_at_what_is_left_of_the_charge(localstripe):
    pi = _charged(1000)
    assert _post("refunds", {"payment_intent": pi, "amount": 600}).status_code == 200
    too_much = _post("refunds", {"payment_intent": pi, "amount": 500})
    assert too_much.status_code == 400
    assert too_much.json()["error"]["code"] == "amount_too_large"
    rest = _post("refunds", {"payment_intent": pi})
    assert rest.status_code == 200 and rest.json()["amount"] == 400
    nothing_left = _post("refunds", {"payment_intent": pi, "amount": 1})
    assert nothing_left.status_code == 400
    assert nothing_left.json()["error"]["code"] == "charge_already_refunded"
    assert sorted(r["amount"] for r in localstripe.refunds_for(pi)) == [400, 600]
