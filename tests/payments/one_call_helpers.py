"""Counting at localstripe over plain HTTP (never through Verity's adapter)."""

import time

from payments import services
from payments.models import ProviderCall


def start(purchase, api_client, method="pm_card_visa", retry_of=None):
    return services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method=method, retry_of=retry_of
    )


def calls(op, purpose="dispatch"):
    return list(
        ProviderCall.objects.filter(operation=op, purpose=purpose)
        .order_by("started_at")
        .values_list("step", "http_status", "classification")
    )


def provider_count(localstripe, purchase):
    """(PaymentIntents, succeeded/authorized PaymentIntents, succeeded charges) of one
    purchase at the provider."""
    intents = localstripe.payment_intents_for(purchase.id)
    ids = {pi["id"] for pi in intents}
    paid = [pi for pi in intents if pi["status"] in ("succeeded", "requires_capture")]
    charges = [
        c
        for c in localstripe.list("charges")
        if c.get("payment_intent") in ids and c.get("status") == "succeeded"
    ]
    return len(intents), len(paid), len(charges)


def wait_intents(localstripe, purchase, n, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(localstripe.payment_intents_for(purchase.id)) >= n:
            return True
        time.sleep(0.1)
    return False
