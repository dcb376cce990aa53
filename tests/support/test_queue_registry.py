"""The console's queues are one registry (support.queues): every registered queue counts,
lists and renders its rows, each row carries a runbook that exists, and a queue declared
without a runbook is refused when the registry is built."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.urls import reverse
from django.utils import timezone

from payments.enums import OVERTURN_CAUSE, OperationKind, Outcome, Owner, PurchaseStatus
from payments.models import OperationTransition, PaymentOperation
from support import queues, runbooks, selectors
from support.access import Action, Role
from webhooks.models import EventResult, ProviderEvent

from .builders import SUCCEEDED, purchase_in
from .test_provider_queues import disputed_purchase, external_refund
from .test_queues import _one_case_per_queue

pytestmark = pytest.mark.django_db


def _the_queues_test_queues_leave_empty():
    """Rows for the queues `_one_case_per_queue` does not fill."""
    ProviderEvent.objects.create(
        event_id="evt_held",
        type="charge.refunded",
        payload={},
        result=EventResult.HELD,
        result_reason="waiting for re_1",
    )
    ProviderEvent.objects.create(
        event_id="evt_mismatch",
        type="payment_intent.succeeded",
        payload={},
        result=EventResult.QUARANTINED,
        result_reason="mismatch:amount",
    )
    purchase_in(
        PurchaseStatus.PAID,
        ops=[
            SUCCEEDED,
            {
                **SUCCEEDED,
                "is_duplicate": True,
                "settled_at": timezone.now(),
                "provider_reference": "pi_test_duplicate",
            },
        ],
    )
    overturned = purchase_in(PurchaseStatus.PAID, ops=[SUCCEEDED])
    op = overturned.operations.get()
    PaymentOperation.objects.filter(pk=op.pk).update(
        next_action_owner=Owner.SUPPORT, settled_at=timezone.now()
    )
    OperationTransition.objects.create(
        purchase=overturned,
        operation=op,
        field="outcome",
        source="failed",
        target="succeeded",
        cause=OVERTURN_CAUSE,
        actor="reconciler",
        evidence={"overturned": {"outcome": "failed", "actor": "olga"}},
    )
    purchase_in(
        PurchaseStatus.MANUAL_REVIEW,
        ops=[
            {
                **SUCCEEDED,
                "outcome": Outcome.FAILED,
                "rail": "x402",
                "next_action_owner": "support",
                "reason": "transfer_reversed_on_chain",
                "settled_at": timezone.now(),
            }
        ],
    )
    disputed_purchase(timedelta(days=3), "dp_registry")
    external_refund(purchase_in(PurchaseStatus.PAID, ops=[SUCCEEDED]))


def _everyone(users) -> User:
    user = users["operator"]
    for role in Role:
        user.groups.add(Group.objects.get(name=role.value))
    return User.objects.get(pk=user.pk)  # no cached roles


def test_every_registered_queue_counts_lists_and_renders_its_rows(client, users):
    _one_case_per_queue()
    _the_queues_test_queues_leave_empty()
    user = _everyone(users)
    client.force_login(user)

    summaries = {s.spec.name: s for s in selectors.queue_summaries(user)}
    assert list(summaries) == list(queues.QUEUES)  # every queue, in registry order
    for name, spec in queues.QUEUES.items():
        items = spec.items()
        assert summaries[name].count >= 1, name  # each queue has a case above
        assert summaries[name].count == len(items), name
        assert summaries[name].oldest is not None, name
        for item in items:
            assert runbooks.runbook_get(item.runbook) is not None, (name, item.runbook)
        page = client.get(reverse("support:queue", args=[name]))
        assert page.status_code == 200, name
        html = page.content.decode()
        assert spec.label in html.replace("&#x27;", "'")
        for item in items:
            assert str(item.ref) in html, (name, item.ref)
    dashboard = client.get(reverse("support:dashboard")).content.decode()
    for name in queues.QUEUES:
        assert f'data-queue="{name}"' in dashboard


def test_a_mismatch_in_quarantine_links_the_mismatch_runbook():
    _the_queues_test_queues_leave_empty()
    [row] = selectors.queue_items("quarantined")
    assert row.runbook == "amount-currency-mismatch"
    assert runbooks.QUEUE_RUNBOOK["quarantined"] == "quarantined-event"


def _part():
    return queues.QueuePart(
        queues.duplicate_operations, "settled_at", queues.each(lambda op, now: op)
    )


def test_a_queue_without_a_runbook_is_refused():
    with pytest.raises(ValueError, match="has no runbook"):
        queues.QueueSpec(
            "orphans", "Orphans", Action.VIEW, "Rows nobody explains.", runbook="", parts=(_part(),)
        )


def test_a_queue_naming_a_missing_runbook_or_a_taken_name_is_not_registered():
    before = dict(queues.QUEUES)
    with pytest.raises(ValueError, match="not in"):
        queues.queue_register(
            queues.QueueSpec(
                "orphans",
                "Orphans",
                Action.VIEW,
                "Rows nobody explains.",
                runbook="no-such-runbook",
                parts=(_part(),),
            )
        )
    with pytest.raises(ValueError, match="registered twice"):
        queues.queue_register(
            queues.QueueSpec(
                "unknown",
                "Again",
                Action.VIEW,
                "A second unknown queue.",
                runbook="unknown-operation",
                parts=(_part(),),
            )
        )
    assert queues.QUEUES == before


def test_refund_kinds_in_the_approval_queue_read_as_refunds():
    purchase = purchase_in(PurchaseStatus.PAID, ops=[SUCCEEDED])
    PaymentOperation.objects.create(
        purchase=purchase,
        kind=OperationKind.REFUND,
        amount=500,
        currency="usd",
        outcome=Outcome.AWAITING_APPROVAL,
    )
    [row] = selectors.queue_items("refund_approval")
    assert row.summary.startswith("refund ") and row.owner == "finance"
