"""The provider's replay of a key is its answer of that moment, not the object now. A
one-call authorization (`capture_method=manual`) whose answer was lost, then cancelled at
the provider (a person in the provider's dashboard, a fraud rule) before Verity asked
again: the re-send is answered with the stored `requires_capture` (`Idempotent-Replayed`).
Verity reads the PaymentIntent it names by id, as the two-step flow reads a lost answer,
and books what the provider shows now: `canceled`, not an authorization."""

import pytest
import requests
from django.conf import settings

from payments import services
from payments.enums import CallStep, Outcome
from payments.providers.stripe import DrillMode

from .one_call_helpers import calls

pytestmark = pytest.mark.django_db(transaction=True)


def _cancel_at_provider(intent_id):
    r = requests.post(
        f"{settings.STRIPE_API_BASE.rstrip('/')}/v1/payment_intents/{intent_id}/cancel",
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    r.raise_for_status()
    return r.json()["status"]


@pytest.mark.parametrize("capture", ["manual"])
def test_a_replayed_authorization_cancelled_since(
    capture, new_purchase, api_client, one_call, drill, read_drill
):
    purchase = new_purchase()
    op = services.payment_create(
        purchase_id=purchase.id,
        api_client=api_client,
        payment_method="pm_card_visa",
        capture_method=capture,
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY, times=2)
    read_drill(times=1)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN and not op.provider_reference
    [intent] = one_call.payment_intents_for(purchase.id)
    assert intent["status"] == "requires_capture"
    assert _cancel_at_provider(intent["id"]) == "canceled"
    op = services.operation_reconcile(operation_id=op.id)
    now = one_call.payment_intents_for(purchase.id)
    purchase.refresh_from_db()
    print(
        "op:",
        op.outcome,
        op.verification,
        op.provider_status,
        "purchase:",
        purchase.status,
        "replays:",
        calls(op, "replay"),
        "provider now:",
        [(p["id"], p["status"]) for p in now],
    )
    assert [p["status"] for p in now] == ["canceled"]
    assert [s for s, _, _ in calls(op, "replay")][-1:] == ["pay"]
    assert op.outcome != Outcome.SUCCEEDED, (
        f"Verity booked the authorization {op.outcome} (provider_status "
        f"{op.provider_status!r}, purchase {purchase.status}) from the replayed answer; the "
        f"provider shows it canceled"
    )
