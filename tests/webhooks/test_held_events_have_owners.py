"""Every held provider event has an owner — it prompts a read-back of the
record it waits for, sits in a console queue, and is exported with its age for an alert.

The scenario: a charge the provider took whose answer was lost, a person's "failed"
accepted while the provider could not be read, and the person's read-back window over
(ACKNOWLEDGED_READBACK_SECONDS): nothing reads that charge again on its own schedule.
A dispute of the charge arrives and is held `payment_not_settled`. Without an owner it
waits forever; with one, its retry reads the charge back, the provider's record
overturns the person's word and the held event applies.
"""

import pytest
from django.contrib.auth.models import User

from payments import services
from payments.enums import Grade, Outcome, PurchaseStatus
from payments.models import Dispute, PaymentOperation, Purchase
from recovery.models import OutboxCategory, OutboxMessage
from tests.outbox import settle
from tests.webhooks.test_disputes import dispute_event, open_dispute
from webhooks.models import EventResult, ProviderEvent

from .events import deliver_and_process

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_held_dispute_prompts_the_read_back_it_waits_for_and_is_owned_meanwhile(
    client, new_purchase, pay, read_drill, localstripe, settings
):
    settings.ACKNOWLEDGED_READBACK_SECONDS = 0  # the person's word is no longer re-read
    purchase = new_purchase()
    op = pay(purchase, drop_response=True)
    assert op.outcome == Outcome.UNKNOWN
    read_drill("*")
    resolver = User.objects.create(username="resolver-held")
    services.operation_resolve_manual(
        operation_id=op.id,
        outcome="failed",
        reason="buyer says declined",
        actor="resolver-held",
        acting_user=resolver,
    )
    op = PaymentOperation.objects.get(pk=op.pk)
    assert (op.outcome, op.grade, op.next_reconcile_at) == (
        Outcome.FAILED,
        Grade.ACKNOWLEDGED,
        None,
    )
    [intent] = localstripe.succeeded_charges_for(purchase.pk)
    charge = intent["latest_charge"]
    charge = (
        charge["id"] if isinstance(charge, dict) else charge or intent["charges"]["data"][0]["id"]
    )
    dispute = open_dispute(charge, reason="fraudulent")
    event = dispute_event(dispute["id"], "charge.dispute.created")

    # when the dispute's event arrives, it is held waiting for the charge's record
    assert deliver_and_process(client, event) == EventResult.HELD
    stored = ProviderEvent.objects.get(event_id=event["id"])
    assert stored.result_reason == "payment_not_settled"

    # then it is owned: a console queue, the gauges the alert reads, and a read-back
    from recovery.metrics import DatabaseCollector
    from support.selectors import queue_items, queue_summaries

    assert [i.ref for i in queue_items("held")] == [str(stored.pk)]
    from django.contrib.auth.models import Group

    from support.access import Role, ensure_groups

    ensure_groups()
    sam = User.objects.create(username="held-support")
    sam.groups.add(Group.objects.get(name=Role.SUPPORT))
    assert any(s.spec.name == "held" and s.count == 1 for s in queue_summaries(sam))
    gauges = {
        m.name: m.samples[0].value
        for m in DatabaseCollector()._collect()
        if m.name.startswith("verity_webhook_held")
    }
    assert gauges["verity_webhook_held_events"] == 1
    assert gauges["verity_webhook_held_oldest_age_seconds"] >= 0
    assert OutboxMessage.objects.filter(
        category=OutboxCategory.RECONCILE, payload={"operation": op.id}
    ).exists()

    # and the read-back it prompted settles the charge; the held event applies
    settle()
    op = PaymentOperation.objects.get(pk=op.pk)
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.CONFIRMED)
    assert ProviderEvent.objects.get(event_id=event["id"]).result == EventResult.APPLIED
    assert Dispute.objects.filter(pk=dispute["id"]).exists()
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.DISPUTED
    assert queue_items("held") == []


def test_a_pending_dashboard_refund_held_purchase_busy_is_never_quarantined_by_count(
    client, new_purchase, pay, drill, localstripe
):
    from webhooks.services import HELD_MAX_ATTEMPTS, event_process

    from .events import event_for, post, refund_object

    # given a paid purchase whose own refund's answer was lost (it holds the slot)
    purchase = new_purchase()
    paid = pay(purchase)
    assert paid.outcome == Outcome.SUCCEEDED
    requester = User.objects.create(username="req-busy")
    approver = User.objects.create(username="fin-busy")
    refund = services.refund_request(purchase_id=purchase.id, amount=500, acting_user=requester)
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")
    drill(refund, "drop_response_after_send", step="refund")
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.UNKNOWN

    # when a pending refund made in the dashboard arrives meanwhile
    event = event_for(
        refund_object(
            re_id="re_dash_busy", status="pending", amount=100, pi_id=paid.provider_reference
        ),
        "refund.created",
    )
    assert post(client, event).status_code == 200
    stored = ProviderEvent.objects.get(event_id=event["id"])
    results = [event_process(event_id=stored.pk) for _ in range(HELD_MAX_ATTEMPTS + 2)]

    # then it keeps waiting for the slot (it matched: not "unmatched"), and each retry
    # asks for a read-back of the refund that holds the slot
    stored.refresh_from_db()
    assert results == [EventResult.HELD] * len(results), results
    assert (stored.result, stored.result_reason) == (EventResult.HELD, "purchase_busy")
    assert OutboxMessage.objects.filter(
        category=OutboxCategory.RECONCILE,
        payload={"operation": refund.id},
        processed_at__isnull=True,
    ).exists()
