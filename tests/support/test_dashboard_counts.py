"""The dashboard's figures equal a straightforward count of the same rows.

The landing page reads its numbers the cheap way (every queue's capped count in one UNION
ALL, EXISTS instead of a join plus DISTINCT, filtered counts per week in one statement per
table); here a mixed fixture is counted the plain way (load the rows, count them in Python)
and the two must agree, so a faster statement never shows a different number."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.utils import timezone

from audit.models import AuditEntry, Resolution
from payments.enums import OVERTURN_CAUSE, HoldState, Outcome, Owner, PurchaseStatus
from payments.models import Hold, OperationTransition, PaymentOperation, Purchase
from support import queues, selectors, services
from support.models import Incident
from tests.factories import make_client
from webhooks.models import EventResult, ProviderEvent

from .builders import SUCCEEDED, UNKNOWN, purchase_in
from .test_queue_registry import _everyone, _the_queues_test_queues_leave_empty
from .test_queues import _one_case_per_queue


def _overturned(owner: str, *, overturns: int) -> PaymentOperation:
    purchase = purchase_in(PurchaseStatus.PAID, ops=[SUCCEEDED], order=None)
    op = purchase.operations.get()
    PaymentOperation.objects.filter(pk=op.pk).update(
        next_action_owner=owner, settled_at=timezone.now()
    )
    for i in range(overturns):
        OperationTransition.objects.create(
            purchase=purchase,
            operation=op,
            field="outcome",
            source="failed",
            target="succeeded",
            cause=OVERTURN_CAUSE,
            actor="reconciler",
            evidence={"overturned": {"outcome": "failed", "actor": f"olga{i}"}},
        )
    return op


def _more_of_each():
    """Rows next to the queues' cases that must not count, and second rows that must."""
    _overturned(Owner.SUPPORT, overturns=2)  # two overturn rows, one queue row
    _overturned(Owner.SUPPORT, overturns=0)  # support's, never overturned
    _overturned(Owner.NONE, overturns=1)  # overturn reviewed
    paid = purchase_in(PurchaseStatus.FULFILLING, ops=[SUCCEEDED])
    Purchase.objects.filter(pk=paid.pk).update(
        updated_at=timezone.now() - timedelta(hours=2), paid_at=None
    )  # paid before paid_at existed
    purchase_in(PurchaseStatus.PAID, ops=[SUCCEEDED], order="ORD-77")  # has its order
    ProviderEvent.objects.create(
        event_id="evt_held_2",
        type="charge.refunded",
        payload={},
        result=EventResult.HELD,
        result_reason="waiting for re_2",
    )
    ProviderEvent.objects.create(
        event_id="evt_applied", type="charge.refunded", payload={}, result=EventResult.APPLIED
    )
    shop_b = make_client(name="shop-b")[0]
    for currency, state, outcome in [
        ("eur", HoldState.RESERVED, UNKNOWN),
        ("eur", HoldState.RESERVED, UNKNOWN),
        ("usd", HoldState.RELEASED, UNKNOWN),
        ("usd", HoldState.RESERVED, SUCCEEDED),
    ]:
        p = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[outcome], currency=currency)
        Hold.objects.create(
            api_client=shop_b,
            operation=p.operations.get(),
            amount=700,
            currency=currency,
            state=state,
        )


def _plainly(spec, now) -> tuple[int, object]:
    """Count and oldest of a queue by loading every row (no cap: the fixture is small)."""
    n, ages = 0, []
    for part in spec.parts:
        rows = list(part.queryset(now))
        n += len({row.pk for row in rows})
        found = [getattr(r, part.age_field) for r in rows if getattr(r, part.age_field) is not None]
        if rows and not found and part.oldest_fallback:
            found = [getattr(r, part.oldest_fallback) for r in rows]
        ages += found
    return n, min(ages, default=None)


def test_every_queue_count_and_oldest_equal_a_plain_count(users):
    _one_case_per_queue()
    _the_queues_test_queues_leave_empty()
    _more_of_each()
    user = _everyone(users)
    now = timezone.now()

    shown = {s.spec.name: (s.count, s.oldest) for s in selectors.queue_summaries(user)}

    assert shown == {name: _plainly(spec, now) for name, spec in queues.QUEUES.items()}
    # The overturned queue against its first definition (a join plus DISTINCT).
    joined = PaymentOperation.objects.filter(
        transitions__cause=OVERTURN_CAUSE, next_action_owner=Owner.SUPPORT
    ).distinct()
    assert shown["overturned"][0] == joined.count() == 2
    assert shown["held"][0] == 2 and shown["paid_without_order"][0] == 2


def test_money_at_risk_equals_a_sum_over_the_holds(db):
    _one_case_per_queue()
    _more_of_each()
    plain: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for hold in Hold.objects.select_related("operation", "api_client"):
        if hold.state == HoldState.RESERVED and hold.operation.outcome == Outcome.UNKNOWN:
            plain[(hold.currency, hold.api_client.name)][0] += hold.amount
            plain[(hold.currency, hold.api_client.name)][1] += 1

    shown = {(e.currency, e.client): [e.amount, e.operations] for e in selectors.money_at_risk()}

    assert shown == dict(plain) == {("usd", "shop-a"): [1500, 1], ("eur", "shop-b"): [1400, 2]}


def test_interventions_per_week_equal_a_count_per_window(users):
    for weeks_ago in (0, 1, 1, 3, 5):
        inc = services.incident_open(user=users["operator"], title=f"i{weeks_ago}", reason="drill")
        Incident.objects.filter(pk=inc.pk).update(
            opened_at=timezone.now() - timedelta(weeks=weeks_ago)
        )

    shown = selectors.manual_interventions()

    since = timezone.now() - timedelta(days=7)
    assert shown["resolutions"] == Resolution.objects.filter(created_at__gte=since).count()
    assert shown["audited_actions"] == AuditEntry.objects.filter(created_at__gte=since).count()
    for week in shown["weeks"]:
        end = week.week_start + timedelta(weeks=1)
        assert week.incidents == sum(
            week.week_start <= i.opened_at < end for i in Incident.objects.all()
        )
        assert week.audited_actions == sum(
            week.week_start <= a.created_at < end for a in AuditEntry.objects.all()
        )
    assert sum(w.incidents for w in shown["weeks"]) == 4  # five weeks ago is out of range
