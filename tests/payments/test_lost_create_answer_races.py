"""A two-step card payment whose create answer was lost, raced by the others who can act
on it (docs/reliability.md#create-then-claim-then-confirm).

Verity finds the PaymentIntent by `operation_id` metadata and confirms it, or leaves the
payment `unknown` until the read-back cancels it. Here someone else moves between Verity's
read and its next write: a holder of the secret key confirms the intent, the dead-dispatch
sweep and the reconciler settle it while the first worker stalls, a person's word lands
while the provider cannot be read and fulfilment runs on it, the metadata search stops at
its page bound. Judged on localstripe's raw record (PaymentIntents by metadata, charges)
and the database (operations, provider calls, orders, stock).

Faults only through the fault-drill HTTP client; the races are placed by wrapping the
read Verity makes (the moment another actor could move), never by patching the SDK.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests
from django.conf import settings as django_settings
from django.utils import timezone

from payments import services
from payments.enums import CallStep, Outcome, PurchaseStatus
from payments.models import PaymentOperation, ProviderCall, Purchase
from payments.providers.stripe import DrillMode
from recovery.models import InventoryCommit, Order
from recovery.relay import relay_drain
from tests.payments.test_create_answer_lost import (
    PAYABLE,
    _charges_of,
    _intents_of,
    _no_payable_intent_beside_the_record,
    _start,
)

pytestmark = pytest.mark.django_db(transaction=True)

AUTH = (django_settings.STRIPE_API_KEY, "")


def _confirm_with_the_secret_key(pi_id: str) -> requests.Response:
    return requests.post(
        f"{django_settings.STRIPE_API_BASE}/v1/payment_intents/{pi_id}/confirm",
        data={},
        auth=AUTH,
        timeout=10,
    )


def _after_first_read(monkeypatch, module, then) -> None:
    """Run `then(result)` right after the first provider read `module` makes (the moment
    between Verity's read and its next write), once."""
    original = module._read_back
    fired = {"done": False}

    def read(op):
        result = original(op)
        if not fired["done"]:
            fired["done"] = True
            then(op, result)
        return result

    monkeypatch.setattr(module, "_read_back", read)


def test_an_intent_confirmed_by_someone_else_between_the_read_and_the_confirm_is_one_charge(
    new_purchase, api_client, localstripe, drill, monkeypatch
):
    from payments.services import dispatch

    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)
    confirmed = {}

    def someone_confirms(_op, result):
        assert result.object is not None and result.object.confirm_unapplied
        confirmed["status"] = _confirm_with_the_secret_key(result.object.id).status_code

    _after_first_read(monkeypatch, dispatch, someone_confirms)

    op = services.operation_dispatch(operation_id=op.id)

    assert confirmed["status"] == 200
    [pi] = _intents_of(localstripe, op)
    assert pi["status"] == "succeeded"
    assert len(_charges_of(localstripe, purchase.id)) == 1
    assert (op.outcome, op.provider_reference) == (Outcome.SUCCEEDED, pi["id"])
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.PAID
    # a new payment for the purchase is refused: it is paid
    with pytest.raises(services.DomainError):
        _start(purchase, api_client, op.id)
    assert len(localstripe.payment_intents_for(purchase.id)) == 1


def test_a_stalled_worker_never_confirms_an_intent_the_sweep_and_reconciler_settled(
    new_purchase, api_client, localstripe, drill, monkeypatch, settings
):
    """The first worker read the waiting intent, then stalled past its lease: the sweep
    moved the payment to `unknown`, the reconciler cancelled the intent and settled it
    failed, the buyer paid again. When the first worker resumes it must not confirm."""
    from payments.services import dispatch

    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)
    later = {}

    def the_world_moves_on(stalled, result):
        assert result.object is not None and result.object.confirm_unapplied
        PaymentOperation.objects.filter(id=stalled.id).update(
            dispatch_deadline=timezone.now() - timedelta(seconds=1)
        )
        assert services.operations_sweep_dead_dispatches() == 1
        assert PaymentOperation.objects.get(id=stalled.id).outcome == Outcome.UNKNOWN
        settled = services.operation_reconcile(operation_id=stalled.id)
        assert settled.outcome == Outcome.FAILED
        again = _start(purchase, api_client, stalled.id)
        later["again"] = services.operation_dispatch(operation_id=again.id)

    _after_first_read(monkeypatch, dispatch, the_world_moves_on)

    first = services.operation_dispatch(operation_id=op.id)

    assert later["again"].outcome == Outcome.SUCCEEDED
    assert first.outcome == Outcome.FAILED
    assert not ProviderCall.objects.filter(
        operation_id=op.id, purpose="dispatch", step=CallStep.CONFIRM
    ).exists()
    intents = {
        pi["metadata"]["operation_id"]: pi for pi in localstripe.payment_intents_for(purchase.id)
    }
    assert intents[op.id]["status"] == "canceled"
    assert intents[later["again"].id]["status"] == "succeeded"
    assert len(_charges_of(localstripe, purchase.id)) == 1
    _no_payable_intent_beside_the_record()


def test_a_persons_failed_raced_by_a_confirm_is_refused_and_the_charge_is_kept(
    new_purchase, api_client, localstripe, drill, read_drill, people, monkeypatch
):
    """A person settles `failed` an unknown payment whose create answer was lost; between
    their read (which finds the intent waiting) and the cancel, a holder of the secret key
    confirms it. The charge is Verity's: the person is refused, the purchase paid, and it
    is not free for a second payment."""
    from payments.services import manual

    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)
    read_drill("*")  # the dispatcher's search cannot read the provider
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN

    def someone_confirms(_op, result):
        assert result.object is not None and result.object.confirm_unapplied
        assert _confirm_with_the_secret_key(result.object.id).status_code == 200

    _after_first_read(monkeypatch, manual, someone_confirms)
    with pytest.raises(services.DomainError) as refused:
        services.operation_resolve_manual(
            operation_id=op.id,
            outcome="failed",
            reason="the buyer gave up",
            actor="resolver",
            acting_user=people.resolver,
        )

    assert refused.value.code in ("provider_contradicts", "provider_cancel_failed")
    [pi] = _intents_of(localstripe, op)
    assert pi["status"] == "succeeded"
    assert len(_charges_of(localstripe, purchase.id)) == 1
    op = (
        services.operation_reconcile(operation_id=op.id)
        if PaymentOperation.objects.get(id=op.id).outcome == Outcome.UNKNOWN
        else PaymentOperation.objects.get(id=op.id)
    )
    assert (op.outcome, op.provider_reference) == (Outcome.SUCCEEDED, pi["id"])
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.PAID
    with pytest.raises(services.DomainError):
        _start(purchase, api_client, op.id)
    assert len(localstripe.payment_intents_for(purchase.id)) == 1


@pytest.mark.parametrize("made", [True, False], ids=["intent-made", "nothing-made"])
def test_goods_shipped_on_a_persons_succeeded_are_unwound_when_the_provider_overturns_it(
    made, new_purchase, api_client, localstripe, drill, read_drill, people, settings
):
    """A person's "succeeded" on a lost create while the provider cannot be read: the
    purchase is paid on their word and fulfilment runs. Verity never sent a confirm, so no
    money came: the read-back overturns it, and the goods must follow (no live order, the
    stock back on the shelf, no charge)."""
    purchase = new_purchase(stock=10)
    op = _start(purchase, api_client)
    mode = DrillMode.DROP_RESPONSE_AFTER_SEND if made else DrillMode.HTTP_409
    drill(op, mode, step=CallStep.CREATE)
    read_drill("*")
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    read_drill("*")
    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome="succeeded",
        reason="the buyer's bank statement shows it",
        actor="resolver",
        acting_user=people.resolver,
    )
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, "acknowledged")
    relay_drain()
    assert Order.objects.filter(purchase_id=purchase.id, cancelled_at__isnull=True).exists()
    commits = InventoryCommit.objects.filter(purchase_id=purchase.id)
    assert commits.exists()

    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    op = services.operation_reconcile(operation_id=op.id)
    relay_drain()

    assert (op.outcome, op.grade) == (Outcome.FAILED, "confirmed")
    assert _charges_of(localstripe, purchase.id) == []
    assert [pi["status"] for pi in _intents_of(localstripe, op)] == (["canceled"] if made else [])
    # goods follow the money: none came, so nothing bought with it stays live
    assert not Order.objects.filter(purchase_id=purchase.id, cancelled_at__isnull=True).exists()
    assert not commits.filter(released_at__isnull=True).exists()
    _no_payable_intent_beside_the_record()


def test_a_search_stopped_at_its_page_bound_never_settles_failed_beside_a_payable_intent(
    new_purchase, api_client, localstripe, drill, pay_now, settings
):
    """The metadata search gives up at its page bound: that is not "none found". The
    payment stays `unknown` (the purchase busy) however long it waits, and once the search
    can reach it the intent is cancelled before the purchase is free."""
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    settings.PROVIDER_LIST_MAX_PAGES = 0  # the search reads no page yet
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    # others' PaymentIntents, newer, listed before ours (Stripe lists newest first)
    for _ in range(2):
        assert pay_now(new_purchase()).outcome == Outcome.SUCCEEDED
    # one PaymentIntent per page, one page: the search cannot reach ours
    settings.PROVIDER_LIST_PAGE_LIMIT = 1
    settings.PROVIDER_LIST_MAX_PAGES = 1

    op = services.operation_reconcile(operation_id=op.id)

    [orphan] = _intents_of(localstripe, op)
    reads = ProviderCall.objects.filter(operation_id=op.id, purpose="reconcile", step="list")
    # the search with no page, then the one that stopped at its bound: neither a verdict
    assert list(reads.values_list("classification", flat=True)) == ["unknown", "unknown"]
    assert op.outcome == Outcome.UNKNOWN
    assert orphan["status"] in PAYABLE
    for _ in range(3):
        op = services.operation_reconcile(operation_id=op.id)
        assert op.outcome == Outcome.UNKNOWN  # never failed beside a payable intent
    with pytest.raises(services.DomainError) as refused:
        _start(purchase, api_client, op.id)
    assert refused.value.code == "payment_unresolved"

    settings.PROVIDER_LIST_PAGE_LIMIT = 100
    settings.PROVIDER_LIST_MAX_PAGES = 50
    op = services.operation_reconcile(operation_id=op.id)
    assert op.outcome == Outcome.FAILED
    [orphan] = _intents_of(localstripe, op)
    assert orphan["status"] == "canceled"
    assert _charges_of(localstripe, purchase.id) == []
    _no_payable_intent_beside_the_record()


def test_a_retry_that_takes_the_key_over_during_the_slow_search_makes_no_second_payment(
    storefront, product, localstripe, settings
):
    """REST: the create's answer is lost and the search for the intent outlives the
    Idempotency-Key lease. The client's retry (same key) takes the key over while the first
    request is still searching; another request with a new key is refused while the first
    is unresolved. One operation, one PaymentIntent, one charge; the key's replay says
    what the provider did."""
    import threading
    import time

    from django.db import connection

    from payments.enums import Rail
    from payments.models import IdempotencyRecord
    from payments.services import provider_for_rail

    settings.IDEMPOTENCY_LEASE_SECONDS = 1
    purchase = storefront.new_purchase(product.sku)
    stripe = provider_for_rail(Rail.STRIPE)
    stripe.arm_drill(key_prefix="*", step="create", mode=DrillMode.DROP_RESPONSE_AFTER_SEND)
    stripe.arm_drill(key_prefix="*", step="read", mode=DrillMode.READ_SLOW)
    first: dict = {}

    def first_request():
        try:
            first["answer"] = storefront.pay(purchase["id"], key="pay-once")
        finally:
            connection.close()

    thread = threading.Thread(target=first_request)
    thread.start()
    try:
        time.sleep(1.5)  # the first request is in its slow search; its lease ran out
        assert thread.is_alive()
        retry = storefront.pay(purchase["id"], key="pay-once")
        other = storefront.pay(purchase["id"], key="pay-other-key")
    finally:
        thread.join(DrillMode.SLOW_READ_SECONDS + 30)
        stripe.drill_client.disarm_all()
    assert not thread.is_alive()

    ops = PaymentOperation.objects.filter(purchase_id=purchase["id"])
    [op] = ops
    [pi] = localstripe.payment_intents_for(purchase["id"])
    assert (op.outcome, op.provider_reference, pi["status"]) == (
        Outcome.SUCCEEDED,
        pi["id"],
        "succeeded",
    )
    assert len(_charges_of(localstripe, purchase["id"])) == 1
    assert retry.status_code in (201, 202), retry.content
    assert retry.json()["id"] == op.id
    assert other.status_code == 409, other.content
    assert first["answer"].status_code in (201, 202), first["answer"].content
    [record] = IdempotencyRecord.objects.filter(key="pay-once")
    assert (record.state, record.resource_id) == (IdempotencyRecord.State.DONE, op.id)
    replay = storefront.pay(purchase["id"], key="pay-once")
    assert (replay.status_code, replay.json()["outcome"]) == (200, "succeeded"), replay.content
