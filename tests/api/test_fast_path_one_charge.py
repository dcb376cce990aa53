"""Can the fast path before the session/CSRF chain let one purchase become two
charges, or a replay make a provider call? Parallel first payments with one key and with
new keys, racing replays and reads, then replays in every shape the fast path accepts.
Asserted on localstripe's PaymentIntents and on ProviderCall / PaymentOperation rows."""

import pytest

from payments.models import IdempotencyRecord, PaymentOperation, ProviderCall
from tests.api.client import Api, new_key
from tests.api.test_fast_path_equivalence import BODY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_settings")]


def test_parallel_first_payments_replays_and_reads_charge_once(
    storefront, product, localstripe, send_at_once
):
    purchase = storefront.new_purchase(product.sku)
    pid = purchase["id"]
    storefront.get(f"purchases/{pid}")  # the key verified: the fast path is warm
    shared = new_key()
    keys = [shared] * 4 + [new_key(), new_key()]  # four with one key, two with their own
    apis = [Api(storefront.key, storefront.client) for _ in range(8)]
    sends = []
    for n, api in enumerate(apis):
        if n < 6:
            sends.append(
                lambda api=api, k=keys[n]: api.post(f"purchases/{pid}/payments", BODY, key=k)
            )
        else:
            sends.append(lambda api=api: api.get(f"purchases/{pid}"))
    answers = send_at_once(sends)
    print([getattr(a, "status_code", a) for a in answers])
    assert not [a for a in answers if isinstance(a, Exception)], answers
    assert sum(1 for a in answers[:6] if a.status_code == 201) == 1
    assert all(a.status_code in (200, 201, 409) for a in answers[:6])

    charged = localstripe.succeeded_charges_for(pid)
    assert len(charged) == 1, charged
    ops = PaymentOperation.objects.filter(purchase_id=pid)
    assert ops.count() == 1
    calls = ProviderCall.objects.filter(operation__purchase_id=pid).count()

    # every replay of the winning request after it (whichever key won the race): fast or
    # DRF, no provider call, no operation, no intent
    key = next(k for k, a in zip(keys, answers, strict=False) if a.status_code == 201)
    replays = send_at_once(
        [lambda api=api: api.post(f"purchases/{pid}/payments", BODY, key=key) for api in apis]
    )
    assert all(r.status_code == 200 and r["Idempotent-Replayed"] == "true" for r in replays)
    assert any(getattr(r, "verity_fast_path", False) for r in replays)
    assert ProviderCall.objects.filter(operation__purchase_id=pid).count() == calls
    assert PaymentOperation.objects.filter(purchase_id=pid).count() == 1
    assert len(localstripe.succeeded_charges_for(pid)) == 1
    rec = IdempotencyRecord.objects.get(api_client=storefront.client, key=key)
    assert rec.state == IdempotencyRecord.State.DONE and rec.resource_id == ops.get().id


def test_a_replay_on_another_purchase_path_is_no_replay(storefront, product, localstripe):
    """One key, the same body, another purchase's path: the fingerprint names the path, so
    the fast path must not answer the first purchase's operation (422 from the view), and
    the second purchase is not charged."""
    first = storefront.new_purchase(product.sku)
    second = storefront.new_purchase(product.sku)
    key = new_key()
    assert storefront.post(f"purchases/{first['id']}/payments", BODY, key=key).status_code == 201
    storefront.get(f"purchases/{first['id']}")
    other = storefront.post(f"purchases/{second['id']}/payments", BODY, key=key)
    assert other.status_code == 422 and not getattr(other, "verity_fast_path", False)
    assert localstripe.payment_intents_for(second["id"]) == []
    assert not PaymentOperation.objects.filter(purchase_id=second["id"]).exists()
    # and a percent-encoded spelling of the first path replays the first operation
    encoded = "".join(f"%{ord(c):02X}" for c in first["id"])
    again = storefront.http.post(
        f"/api/v1/purchases/{encoded}/payments", BODY, format="json", HTTP_IDEMPOTENCY_KEY=key
    )
    assert again.status_code == 200, again.content
    assert len(localstripe.succeeded_charges_for(first["id"])) == 1
