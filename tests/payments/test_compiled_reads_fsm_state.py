"""The compiled reads arm the concurrent-transition check as the ORM does. Every instance
the compiled reads build — the purchase of the purchase view, its operations and their
parents, the replayed operation, the operation view — carries the same initial states as
`from_db`'s, a dict of its own, and a save after a concurrent change of the state column
raises ConcurrentTransition and writes nothing. Real PostgreSQL."""

import pytest
from django.db import transaction
from django_fsm import ConcurrentTransition

from payments.api.idempotency import _REPLAYED_OPERATION
from payments.enums import Outcome, PurchaseStatus
from payments.models import PaymentOperation, Purchase
from payments.view_queries import (
    _PURCHASE_OPERATIONS,
    PURCHASE_OF_CLIENT,
    _build_plan,
    _plans,
    operation_for_view,
)
from tests.api.client import new_key
from tests.api.test_fast_path_equivalence import BODY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_settings")]

STATES = "_ConcurrentTransitionMixin__initial_states"


def _paid_and_refunded(api, product):  # noqa: F811
    purchase = api.new_purchase(product.sku)
    key = new_key()
    paid = api.post(f"purchases/{purchase['id']}/payments", BODY, key=key)
    assert paid.status_code == 201, paid.content
    refund = api.post(f"purchases/{purchase['id']}/refunds", {"amount": 100})
    assert refund.status_code in (200, 201, 202), refund.content
    return purchase, key


def _built(storefront, purchase, key):  # noqa: F811
    pid = purchase["id"]
    out = {"purchase": PURCHASE_OF_CLIENT.instances(pid, storefront.client.pk)[0]}
    ops = _PURCHASE_OPERATIONS.instances(pid)
    assert len(ops) >= 2
    for n, op in enumerate(ops):
        out[f"op{n}"] = op
        if op.parent_id:
            out[f"op{n}.parent"] = op.parent
    out["replayed"] = _REPLAYED_OPERATION.instances(
        storefront.client.pk, "purchases_payments_create", key
    )[0]
    out["view"] = operation_for_view(out["replayed"].pk)
    return out


def test_every_built_instance_has_from_dbs_initial_states(storefront, product):
    purchase, key = _paid_and_refunded(storefront, product)
    built = _built(storefront, purchase, key)
    assert isinstance(_plans.get(Purchase), tuple) and isinstance(_plans[Purchase][1], tuple)
    assert _build_plan(PaymentOperation)[1] == (STATES, ("outcome",))
    seen = set()
    for name, inst in built.items():
        orm = type(inst).objects.get(pk=inst.pk)
        assert inst.__dict__[STATES] == orm.__dict__[STATES], name
        assert id(inst.__dict__[STATES]) not in seen, name  # a dict of its own
        seen.add(id(inst.__dict__[STATES]))
        assert "_state" in inst.__dict__ and not inst._state.adding


@pytest.mark.parametrize("which", ["purchase", "op0", "op1", "op1.parent", "replayed", "view"])
def test_a_concurrent_state_change_is_detected_on_every_built_instance(storefront, product, which):
    purchase, key = _paid_and_refunded(storefront, product)
    inst = _built(storefront, purchase, key)[which]
    if isinstance(inst, Purchase):
        Purchase.objects.filter(pk=inst.pk).update(status=PurchaseStatus.MANUAL_REVIEW)
        inst.mark_manual_review()
        column, kept = "status", PurchaseStatus.MANUAL_REVIEW
    else:
        moved = Outcome.UNKNOWN if inst.outcome != Outcome.UNKNOWN else Outcome.FAILED
        PaymentOperation.objects.filter(pk=inst.pk).update(outcome=moved, reason="moved")
        inst.reason = "stale-write"
        column, kept = "outcome", moved
    with pytest.raises(ConcurrentTransition):
        with transaction.atomic():
            inst.save()
    row = type(inst).objects.get(pk=inst.pk)
    assert getattr(row, column) == kept
    if isinstance(inst, PaymentOperation):
        assert row.reason == "moved"


def test_a_save_rearms_the_check_with_the_new_state(storefront, product):
    purchase, key = _paid_and_refunded(storefront, product)
    op = _built(storefront, purchase, key)["replayed"]
    assert op.outcome == Outcome.SUCCEEDED
    with transaction.atomic():
        op.overturn_to_failed()
        op.save()
    assert op.__dict__[STATES] == {"outcome": Outcome.FAILED}
    PaymentOperation.objects.filter(pk=op.pk).update(outcome=Outcome.SUCCEEDED)
    op.overturn_to_succeeded()
    with pytest.raises(ConcurrentTransition):
        with transaction.atomic():
            op.save()
