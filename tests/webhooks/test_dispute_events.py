"""A dispute's life reaches the storefront as events, written with the change: opened
(with its amount and reason), closed with its outcome, and the purchase's status moves
(disputed, dispute_won) each as its own status event. Real localstripe disputes, signed
`charge.dispute.*` events from the provider's own object."""

import pytest

from events.models import Event
from tests.outbox import settle

from .events import deliver_and_process
from .test_disputes import (  # noqa: F401 (fixtures)
    dispute_event,
    move_dispute,
    open_dispute,
    paid_purchase,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_won_dispute_is_told_opened_then_closed_with_its_outcome(
    client, new_purchase, pay, localstripe
):
    purchase, op = paid_purchase(new_purchase, pay)
    dispute = open_dispute(op.provider_charge, reason="product_not_received")
    deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.created"))
    move_dispute(dispute["id"], "won")
    deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.closed"))
    settle()

    events = list(Event.objects.filter(purchase_id=purchase.pk).order_by("sequence"))
    told = [
        (e.type, e.data.get("dispute", {}).get("outcome"))
        for e in events
        if e.type.startswith("dispute.")
    ]
    assert told[0] == ("dispute.opened", None)
    assert told[-1] == ("dispute.closed", "won")
    opened = next(e for e in events if e.type == "dispute.opened")
    assert (
        opened.data["dispute"]["id"],
        opened.data["dispute"]["amount"],
        opened.data["dispute"]["reason"],
    ) == (dispute["id"], 1500, "product_not_received")
    statuses = [e.data["status"] for e in events if e.type == "purchase.status_changed"]
    assert "disputed" in statuses and statuses[-1] == "dispute_won"
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert len([d for d in localstripe.list("disputes") if d["charge"] == op.provider_charge]) == 1
