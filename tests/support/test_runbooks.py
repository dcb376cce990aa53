"""Runbooks (docs/runbooks/*.md) render in the console behind VIEW, every queue links to
its runbook (the queue page and each row), and a purchase page shows the runbook for the
purchase's current state. Server-rendered HTML asserts; test_browser_runbooks.py clicks
through two of them in Chromium."""

from __future__ import annotations

import html
import re

import pytest

from payments.models import Purchase
from support import runbooks, selectors
from support.access import MATRIX, Action
from support.customer_copy import WORDS
from webhooks.models import EventResult, ProviderEvent

pytestmark = pytest.mark.django_db


def _text(response) -> str:
    return html.unescape(response.content.decode())


def test_every_runbook_file_renders_for_support(login):
    client = login("support")
    slugs = runbooks.runbook_slugs()
    assert set(runbooks.RUNBOOK_QUEUE) <= set(slugs)
    for slug in slugs:
        r = client.get(f"/console/runbooks/{slug}/")
        assert r.status_code == 200, slug
        body = _text(r)
        rb = runbooks.runbook_get(slug)
        assert f'data-runbook="{slug}"' in body and rb.title in body and rb.version
        # Every placeholder was filled; the four sections a runbook must have are there.
        assert "[[" not in body and "(unknown" not in body and "(unset" not in body, slug
        for heading in (
            "What this state means",
            "Who may act",
            "What to tell the customer",
            "When to escalate",
        ):
            assert heading in body, (slug, heading)
    index = _text(client.get("/console/runbooks/"))
    assert all(f"/console/runbooks/{s}/" in index for s in slugs)


def test_runbook_quotes_customer_copy_and_the_access_matrix(login):
    body = _text(login("support").get("/console/runbooks/unknown-operation/"))
    headline, message = WORDS["not_yet_confirmable"]
    assert headline in body and message in body
    resolvers = ", ".join(r.value for r, acts in MATRIX.items() if Action.RESOLVE in acts)
    assert f"): {resolvers}." in body
    body = _text(login("finance").get("/console/runbooks/refund-awaiting-approval/"))
    approvers = ", ".join(r.value for r, acts in MATRIX.items() if Action.APPROVE_REFUND in acts)
    assert f"Approve: {approvers}." in body


def test_runbook_requires_login_and_view(login):
    assert login(None).get("/console/runbooks/stuck-outbox/").status_code == 302
    assert login("nobody").get("/console/runbooks/stuck-outbox/").status_code == 403
    assert login("support").get("/console/runbooks/no-such-book/").status_code == 404
    assert login("support").get("/console/runbooks/..%2Fsettings/").status_code == 404


def test_every_queue_and_its_rows_link_their_runbook(login, demo):
    client = login("finance")  # finance sees every queue, settlement included
    dashboard = _text(client.get("/console/"))
    for queue, slug in runbooks.QUEUE_RUNBOOK.items():
        assert queue in selectors.QUEUES
        body = _text(client.get(f"/console/queues/{queue}/"))
        assert f'data-runbook-link="{slug}"' in body, queue
        assert f'data-row-runbook="{slug}"' in body, queue  # demo has a row in each
        assert f'href="/console/runbooks/{slug}/"' in dashboard, queue


# The demo purchase sitting in each queue, and the runbook its purchase page must show.
PURCHASE_IN_STATE = {
    "demo-checking-with-provider": "unknown-operation",
    "demo-escalated": "escalated",
    "demo-paid-confirmation-delayed": "paid-without-order",
    "demo-compensation-needed": "compensation-needed",
    "demo-amount-mismatch": "amount-currency-mismatch",
    "demo-refund-awaiting-approval": "refund-awaiting-approval",
}


def test_purchase_page_shows_the_runbook_for_its_state(login, demo):
    client = login("support")
    for reference, slug in PURCHASE_IN_STATE.items():
        p = Purchase.objects.get(customer_reference=reference)
        body = _text(client.get(f"/console/purchases/{p.pk}/"))
        shown = re.findall(r'class="card runbook" data-runbook="([a-z-]+)"', body)
        assert shown == [slug], (reference, shown)
        assert f'href="/console/runbooks/{slug}/"' in body
    complete = Purchase.objects.get(customer_reference="demo-complete")
    assert "card runbook" not in _text(client.get(f"/console/purchases/{complete.pk}/"))


def test_quarantined_event_without_mismatch_gets_the_quarantine_runbook(login, demo):
    p = Purchase.objects.get(customer_reference="demo-complete")
    ProviderEvent.objects.create(
        event_id="evt_test_other",
        type="charge.refunded",
        object_id="ch_test_other",
        payload={},
        purchase_id=p.pk,
        result=EventResult.QUARANTINED,
        result_reason="conflict",
    )
    client = login("support")
    body = _text(client.get(f"/console/purchases/{p.pk}/"))
    assert 'class="card runbook" data-runbook="quarantined-event"' in body
    rows = _text(client.get("/console/queues/quarantined/"))
    # Mismatch rows point to the mismatch runbook, the others to the quarantine one.
    assert 'data-row-runbook="quarantined-event"' in rows
    assert 'data-row-runbook="amount-currency-mismatch"' in rows
    mismatch = _text(client.get("/console/queues/mismatch/"))
    assert "evt_test_other" not in mismatch and "mismatch:amount" in mismatch
