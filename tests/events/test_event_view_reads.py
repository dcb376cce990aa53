"""The purchase view a storefront event carries is read with the purchase's disputes and
steps in the purchase's own statement (payments.view_queries.PURCHASE_WITH_LISTS_BY_ID);
the API reads them apart. Both must show the same view, field for field."""

import datetime as dt
import uuid

import pytest

from payments.api import presenters
from payments.models import Dispute, PaymentOperation
from recovery.models import StepRun

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_events_view_is_the_view_the_api_shows(api, new_purchase, localstripe):
    # given a paid purchase with disputes (a due date with and without a fraction of a
    # second, and none) and two of its steps run
    purchase = new_purchase()
    paid = api.post(
        f"/api/v1/purchases/{purchase.id}/payments",
        {"payment_method": "pm_card_visa", "capture": "automatic"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
    )
    assert paid.status_code == 201, paid.content
    payment = PaymentOperation.objects.get(purchase=purchase)
    due_dates = [
        dt.datetime(2026, 1, 2, 3, 4, 5, 120000, tzinfo=dt.UTC),
        None,
        dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    ]
    for n, due in enumerate(due_dates):
        Dispute.objects.create(
            id=f"dp_{n}_{purchase.id}",
            purchase=purchase,
            payment=payment,
            amount=100 + n,
            currency="usd",
            reason="fraudulent" if due else "",
            status="needs_response",
            evidence_due_by=due,
        )
    for step, state in [("order", "done"), ("inventory", "failed")]:
        StepRun.objects.create(purchase_id=purchase.id, step=step, state=state, key=step)

    # when the event's view and the API's view are read
    _, event_view = presenters.purchase_view_by_id(purchase.id)
    api_view = presenters.purchase_view_for_client(
        purchase_id=purchase.id, api_client=purchase.api_client
    )

    # then they are the same view
    assert event_view == api_view
    assert [d["evidence_due_by"] for d in event_view["disputes"]] == [
        "2026-01-02T03:04:05.120000Z",
        None,
        "2026-01-02T03:04:05Z",
    ]
    assert event_view["fulfillment"]["order"] == "done"
    assert event_view["fulfillment"]["inventory"] == "failed"
