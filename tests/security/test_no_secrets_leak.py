"""No secret, API key, card number or full provider payload in logs, responses, audit rows
or stored provider fields — scanned after real flows (success, decline, unknown, refund)."""

import json
import logging
import re

import pytest
from django.conf import settings

from payments.enums import Rail
from payments.models import ProviderCall
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail
from support.models import AuditEntry
from tests.api.client import Api
from tests.factories import ProductFactory, make_client
from webhooks.models import ProviderEvent

pytestmark = pytest.mark.django_db(transaction=True)

CARD = re.compile(r"\b(?:4\d{15}|5[1-5]\d{14}|3[47]\d{13})\b")
PROVIDER_ONLY = (
    "client_secret",
    "payment_method_details",
    "billing_details",
    "fingerprint",
    '"exp_month"',
    '"last4"',
)


def _secrets(api_key: str) -> list[str]:
    return [
        api_key,
        api_key.split(".", 1)[1],
        settings.STRIPE_API_KEY,
        settings.SECRET_KEY,
        *settings.STRIPE_WEBHOOK_SECRETS,
    ]


def _scan(text: str, secrets: list[str]) -> list[str]:
    found = [f"secret {s[:6]}…" for s in secrets if s and s in text]
    found += [f"card number {m}" for m in CARD.findall(text)]
    found += [f"provider field {f}" for f in PROVIDER_ONLY if f in text]
    return found


def test_flows_leak_nothing(caplog):
    caplog.set_level(logging.DEBUG)
    client, key = make_client(
        scopes=("purchases:read", "purchases:write", "refunds:write"), auto_refund_limit=100_000
    )
    api = Api(key, client)
    product = ProductFactory(price=1500)
    bodies = []

    def record(response):
        bodies.append(response.content.decode() + json.dumps(dict(response.headers)))
        return response

    ok = api.new_purchase(product.sku)
    record(api.pay(ok["id"]))
    record(api.post(f"purchases/{ok['id']}/refunds", {"amount": 500}))
    declined = api.new_purchase(product.sku)
    record(api.pay(declined["id"], method="pm_card_chargeCustomerFail"))
    lost = api.new_purchase(product.sku)
    # The next confirm answer is dropped after the provider applied it: an unknown outcome.
    provider_for_rail(Rail.STRIPE).arm_drill(
        key_prefix="*", step="confirm", mode=DrillMode.DROP_RESPONSE_AFTER_SEND
    )
    try:
        record(api.pay(lost["id"]))
    finally:
        provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    for pid in (ok["id"], declined["id"], lost["id"]):
        record(api.get(f"purchases/{pid}"))
    record(api.get("purchases/pur_doesnotexist"))
    record(api.post("quotes", {"items": "not-a-list"}))

    secrets = _secrets(key)
    leaks = []
    for body in bodies:
        leaks += _scan(body, secrets)
    # Status tokens are customers' credentials: never in a log line.
    from payments.models import Purchase

    tokens = list(
        Purchase.objects.filter(id__in=[ok["id"], declined["id"], lost["id"]]).values_list(
            "status_token", flat=True
        )
    )
    leaks += _scan("\n".join(r.getMessage() for r in caplog.records), secrets + tokens)
    stored = json.dumps(list(ProviderCall.objects.values("safe_fields", "error_code", "key")))
    stored += json.dumps(list(ProviderEvent.objects.values("payload")))
    stored += json.dumps(list(AuditEntry.objects.values("reason", "detail")))
    leaks += _scan(stored, secrets)
    assert not leaks, leaks
    assert any("unknown" in b for b in bodies)  # the flows really covered an unknown
