"""`seed_console_demo` (for `make run`): every queue has a case, every customer state a
link, and running it twice creates nothing new."""
from __future__ import annotations

import re
from io import StringIO

from django.core.management import call_command

from payments.models import PaymentOperation, Purchase
from support import selectors
from support.customer_copy import StateCode, customer_state
from tests.factories import make_client


def test_seed_fills_every_queue_and_prints_a_link_per_state(users):
    make_client(name="demo-storefront")
    out = StringIO()
    call_command("seed_console_demo", stdout=out)
    tokens = re.findall(r"/status/([A-Za-z0-9_-]+)/", out.getvalue())
    codes = {customer_state(Purchase.objects.get(status_token=t)).code for t in tokens}
    assert codes >= {StateCode.BEING_CONFIRMED, StateCode.PAYMENT_PENDING,
                     StateCode.NOT_YET_CONFIRMABLE, StateCode.PAID_CONFIRMATION_DELAYED,
                     StateCode.FAILED, StateCode.REVERSED, StateCode.COMPLETE,
                     StateCode.UNDER_REVIEW, StateCode.AWAITING_PAYMENT}
    summaries = selectors.queue_summaries(users["finance"])
    assert {s.spec.name for s in summaries} == set(selectors.QUEUES)
    assert all(s.count >= 1 for s in summaries), [(s.spec.name, s.count) for s in summaries]
    # Each queue's "Oldest" column has an age, as it would for rows the services wrote.
    assert all(s.oldest is not None for s in summaries), [
        s.spec.name for s in summaries if s.oldest is None]
    assert selectors.money_at_risk()

    counts = (Purchase.objects.count(), PaymentOperation.objects.count())
    call_command("seed_console_demo", stdout=StringIO())
    assert (Purchase.objects.count(), PaymentOperation.objects.count()) == counts
