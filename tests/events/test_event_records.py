"""Every committed change of a purchase has its event, written in the change's own
transaction: numbered per purchase without gaps, carrying the purchase view as it was.
Real stack: localstripe charges, the fault-drill client for a lost answer."""

from __future__ import annotations

import pytest
from django.db import transaction

from events.models import Event
from payments import services
from payments.enums import Outcome
from payments.models import OperationTransition, Purchase
from payments.providers.stripe import DrillMode
from tests.outbox import settle_outbox

pytestmark = pytest.mark.django_db(transaction=True)


def _events(purchase_id: str) -> list[Event]:
    return list(Event.objects.filter(purchase_id=purchase_id).order_by("sequence"))


def test_a_paid_purchase_has_one_event_per_change_numbered_without_gaps(shop, product, localstripe):
    purchase = shop.new_purchase(product.sku)
    answer = shop.pay(purchase["id"])
    assert answer.status_code == 201, answer.content
    settle_outbox()

    events = _events(purchase["id"])
    types = [e.type for e in events]
    assert types[0] == "purchase.created"
    assert "payment.succeeded" in types
    assert types.count("payment.succeeded") == 1
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    # One event per status change the history recorded, and the view each carries is the
    # purchase as it was at that change.
    status_rows = (
        OperationTransition.objects.filter(
            purchase_id=purchase["id"], field="status", operation__isnull=True
        )
        .exclude(source="")
        .order_by("id")
    )
    status_events = [
        e for e in events if e.type in ("purchase.status_changed", "purchase.completed")
    ]
    assert [e.data["status"] for e in status_events] == [r.target for r in status_rows]
    # (the view is the one the change's transaction left: after its last status change)
    assert status_events[-1].data["purchase"]["status"] == status_events[-1].data["status"]
    assert all("next_action" in e.data["purchase"] for e in events)
    assert len(localstripe.succeeded_charges_for(purchase["id"])) == 1
    assert {e.api_client_id for e in events} == {shop.client.pk}


def test_a_declined_payment_has_its_failed_event(shop, product, localstripe):
    purchase = shop.new_purchase(product.sku)
    answer = shop.pay(purchase["id"], method="pm_card_chargeCustomerFail")
    assert answer.status_code == 402, answer.content
    failed = [e for e in _events(purchase["id"]) if e.type == "payment.failed"]
    assert len(failed) == 1
    assert failed[0].data["operation"]["outcome"] == "failed"
    assert failed[0].data["purchase"]["status"] == "payment_failed"
    assert localstripe.succeeded_charges_for(purchase["id"]) == []


def test_an_unknown_payment_that_the_provider_confirms_is_resolved_by_the_provider(
    shop, product, drill, localstripe
):
    purchase = shop.new_purchase(product.sku)
    op = services.payment_create(
        purchase_id=purchase["id"], api_client=shop.client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    unknown = [e for e in _events(purchase["id"]) if e.type == "payment.unknown"]
    assert len(unknown) == 1
    assert unknown[0].data["purchase"]["next_action"]["retry"] == "forbidden"

    services.operation_reconcile(operation_id=op.id)
    settle_outbox()
    resolved = [e for e in _events(purchase["id"]) if e.type == "payment.resolved"]
    assert len(resolved) == 1
    change = resolved[0].data["operation"]
    assert (change["previous_outcome"], change["outcome"], change["settled_by"]) == (
        "unknown",
        "succeeded",
        "provider",
    )
    assert resolved[0].sequence > unknown[0].sequence
    assert len(localstripe.succeeded_charges_for(purchase["id"])) == 1


def test_a_change_that_rolls_back_leaves_no_event(shop, product):
    purchase = shop.new_purchase(product.sku)
    before = Event.objects.count()

    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), transaction.atomic():
        locked = Purchase.objects.select_for_update().get(pk=purchase["id"])
        services.purchase_cancel(purchase_id=locked.id, api_client=shop.client)
        assert Event.objects.count() > before  # written inside the transaction...
        raise Abandon
    assert Event.objects.count() == before  # ...and gone with it
    assert Purchase.objects.get(pk=purchase["id"]).status == "awaiting_payment"
