"""Headless Chromium: from a queue row to its runbook, and from the queue row's purchase
to the runbook shown for its state (unknown, amount mismatch). No CSP violations (the
rendered Markdown carries no inline style or script)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from support.customer_copy import WORDS
from tests.browser import cdp
from tests.factories import make_client

from .test_browser import SHOTS

pytestmark = [
    pytest.mark.skipif(not cdp.available(), reason="/usr/bin/chromium is not installed"),
    pytest.mark.django_db(transaction=True),
]


def _click(browser, selector: str) -> None:
    browser.events = [e for e in browser.events if e["method"] != "Page.loadEventFired"]
    browser.evaluate(f"document.querySelector({selector!r}).click()")
    browser._wait_event("Page.loadEventFired")


@pytest.mark.parametrize(
    "queue,slug,words",
    [
        ("unknown", "unknown-operation", "not_yet_confirmable"),
        ("mismatch", "amount-currency-mismatch", "under_review"),
    ],
)
def test_queue_row_to_runbook_and_purchase_runbook(
    chromium, live_server, users, queue, slug, words
):
    browser = chromium
    browser.call("Network.clearBrowserCookies")
    browser.events.clear()
    make_client(name="demo-storefront")
    call_command("seed_console_demo", stdout=StringIO())

    browser.goto(f"{live_server.url}/console/login/")
    browser.evaluate(
        "document.getElementById('id_username').value = 'sam';"
        "document.getElementById('id_password').value = 'pw-sam'"
    )
    browser.submit("form[action='/console/login/']")

    browser.goto(f"{live_server.url}/console/queues/{queue}/")
    _click(browser, f"a[data-row-runbook='{slug}']")
    assert browser.evaluate("location.pathname") == f"/console/runbooks/{slug}/"
    text = browser.evaluate("document.querySelector('article.runbook').innerText")
    headline, message = WORDS[words]
    assert headline in text and "What to tell the customer" in text
    browser.screenshot(SHOTS / f"runbook-{slug}.png")

    browser.goto(f"{live_server.url}/console/queues/{queue}/")
    _click(browser, "table tbody tr td:nth-child(3) a")
    assert browser.evaluate("location.pathname").startswith("/console/purchases/")
    shown = browser.evaluate("document.querySelector('section.runbook').dataset.runbook")
    assert shown == slug
    browser.evaluate("document.querySelector('section.runbook details').open = true")
    assert headline in browser.evaluate("document.querySelector('section.runbook').innerText")
    browser.screenshot(SHOTS / f"purchase-runbook-{slug}.png")
    assert browser.csp_violations() == []
