"""Replays and reads of a purchase in
every state the storefront can reach answer byte for byte as the DRF view does.

tests/api/test_fast_path_equivalence.py compares one state (paid, 201). Here: declined,
authorized (manual capture), needing the buyer (3-D Secure), partially and fully refunded,
and a purchase whose payment is unknown at Verity."""

import pytest

from payments.models import PaymentOperation
from tests.api.client import new_key
from tests.api.test_fast_path_equivalence import _both, _same
from tests.outbox import settle_outbox

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_settings")]


def _pay(storefront, product, method, capture="automatic"):  # noqa: F811
    purchase = storefront.new_purchase(product.sku)
    key, body = new_key(), {"payment_method": method, "capture": capture}
    first = storefront.post(f"purchases/{purchase['id']}/payments", body, key=key)
    settle_outbox()
    storefront.get(f"purchases/{purchase['id']}")  # the key is verified: cache warm
    return purchase, key, body, first


def _compare(storefront, purchase, key, body, fast_settings):  # noqa: F811
    replay_fast, replay_drf = _both(
        fast_settings,
        lambda: storefront.post(f"purchases/{purchase['id']}/payments", body, key=key),
    )
    get_fast, get_drf = _both(fast_settings, lambda: storefront.get(f"purchases/{purchase['id']}"))
    print(
        f"replay fast={replay_fast.status_code}"
        f"{' (fast)' if hasattr(replay_fast, 'verity_fast_path') else ''}"
        f" drf={replay_drf.status_code}; get fast={get_fast.status_code} drf={get_drf.status_code}"
    )
    _same(replay_fast, replay_drf)
    _same(get_fast, get_drf)
    return replay_fast, get_fast


@pytest.mark.parametrize(
    "method,capture",
    [
        ("pm_card_visa", "automatic"),
        ("pm_card_visa", "manual"),
        ("pm_card_chargeDeclined", "automatic"),
        ("pm_card_threeDSecure2Required", "automatic"),
    ],
)
def test_replay_and_read_answer_as_drf_in_each_payment_state(
    storefront, product, fast_settings, method, capture
):  # noqa: F811
    purchase, key, body, first = _pay(storefront, product, method, capture)
    print(f"{method}/{capture}: first={first.status_code}")
    _compare(storefront, purchase, key, body, fast_settings)


@pytest.mark.parametrize("amount", ["partial", "full"])
def test_replay_and_read_answer_as_drf_after_refunds(storefront, product, fast_settings, amount):  # noqa: F811
    purchase, key, body, first = _pay(storefront, product, "pm_card_visa")
    assert first.status_code == 201, first.content
    payment = PaymentOperation.objects.get(pk=first.json()["id"])
    refund = storefront.post(
        f"purchases/{purchase['id']}/refunds",
        {"amount": 500 if amount == "partial" else payment.amount},
    )
    assert refund.status_code in (201, 202), refund.content
    settle_outbox()
    _compare(storefront, purchase, key, body, fast_settings)


def test_replay_and_read_answer_as_drf_while_the_payment_is_unknown(
    storefront, product, fast_settings
):  # noqa: F811
    purchase, key, body, first = _pay(storefront, product, "pm_card_visa")
    PaymentOperation.objects.filter(pk=first.json()["id"]).update(outcome="unknown")
    _compare(storefront, purchase, key, body, fast_settings)


@pytest.mark.parametrize("halt", ["checkout", "refunds"])
def test_replay_and_read_answer_as_drf_while_a_workflow_is_halted(
    storefront, product, fast_settings, halt
):  # noqa: F811
    from recovery.halts import halt_set

    purchase, key, body, first = _pay(storefront, product, "pm_card_visa")
    assert first.status_code == 201, first.content
    halt_set(name=halt, reason="an incident drill", actor="attacker")
    _compare(storefront, purchase, key, body, fast_settings)


def test_a_get_the_fast_path_hands_to_drf_after_counting_is_counted_once(
    storefront, other_storefront, product, fast_settings
):  # noqa: F811
    # The fast path counts a GET before it reads the view; a purchase that is not this
    # client's (404) or a read that raises goes to the DRF view, with that count.
    from django.core.cache import cache

    from payments.api import presenters

    purchase, key, body, first = _pay(storefront, product, "pm_card_visa")
    mine = f"rl:throttle_api_client_client:{storefront.client.pk}"
    theirs = f"rl:throttle_api_client_client:{other_storefront.client.pk}"
    other_storefront.get("products")  # verified: cache warm
    cache.delete_many([mine, theirs])
    assert other_storefront.get(f"purchases/{purchase['id']}").status_code == 404
    not_mine = cache.get(theirs)

    real = presenters.purchase_view_for_client

    def broken(**kw):
        raise RuntimeError("a read that fails on the fast path")

    presenters.purchase_view_for_client = broken
    try:
        answer = storefront.get(f"purchases/{purchase['id']}")
    finally:
        presenters.purchase_view_for_client = real
    print(
        f"404 counted {not_mine}; fast-path error -> {answer.status_code}, "
        f"counted {cache.get(mine)}"
    )
    assert answer.status_code == 200 and not hasattr(answer, "verity_fast_path")
    assert not_mine == 1
    assert cache.get(mine) == 1
