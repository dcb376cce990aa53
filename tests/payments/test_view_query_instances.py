"""An
instance from these reads, saved or put through an FSM transition, must behave as one from
the ORM: UPDATE not INSERT, the right columns, the concurrent-transition check armed, the
protected state field protected, refresh_from_db working."""

import pytest
from django_fsm import ConcurrentTransition

from payments import selectors
from payments.enums import PurchaseStatus
from payments.models import Purchase
from payments.view_queries import _build_plan
from tests.factories import PurchaseFactory, make_client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def owned():
    client, _ = make_client(name="attack-vq")
    p = PurchaseFactory(api_client=client)
    return client, p


def _fast(client, pk):
    got = selectors.purchase_get_for_client(purchase_id=pk, api_client=client)
    assert got is not None
    return got


def test_the_fast_instance_is_built_without_init(owned):
    assert _build_plan(Purchase) is not None  # the __dict__ path is the one under attack


def test_fast_instance_transition_and_save_updates_in_place(owned):
    client, p = owned
    inst = _fast(client, p.pk)
    assert inst._state.adding is False and inst._state.db == "default"
    assert inst.get_deferred_fields() == set()
    assert inst.quote_id == p.quote_id and inst.quote.pk == p.quote_id
    with pytest.raises(AttributeError):
        inst.status = PurchaseStatus.PAID  # protected FSM field
    n = Purchase.objects.count()
    inst.mark_manual_review()
    inst.save()
    assert Purchase.objects.count() == n
    row = Purchase.objects.get(pk=p.pk)
    assert row.status == PurchaseStatus.MANUAL_REVIEW
    assert (row.amount, row.currency, row.quote_id, row.api_client_id) == (
        p.amount,
        p.currency,
        p.quote_id,
        p.api_client_id,
    )


def test_fast_instance_stale_transition_is_refused(owned):
    client, p = owned
    stale = _fast(client, p.pk)
    other = Purchase.objects.get(pk=p.pk)
    other.mark_manual_review()
    other.save()
    stale.mark_manual_review()
    with pytest.raises(ConcurrentTransition):
        stale.save()


def test_fast_instance_update_fields_and_refresh(owned):
    client, p = owned
    inst = _fast(client, p.pk)
    inst.customer_email = "x@example.com"
    inst.save(update_fields=["customer_email"])
    row = Purchase.objects.get(pk=p.pk)
    assert row.customer_email == "x@example.com" and row.status == p.status
    Purchase.objects.filter(pk=p.pk).update(amount=p.amount + 1)
    inst.refresh_from_db(fields=["amount"])
    assert inst.amount == p.amount + 1
