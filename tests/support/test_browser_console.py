"""Headless Chromium over the seeded demo, as support, operator and finance: a refund
typed "10.00" is echoed back and requests 1 000 minor units; every queue item has a
working link or action; search finds an order reference, a balance transaction and a
partial e-mail; the dashboard draws its charts; no console page shows a raw None, a
minor-unit amount or a second time format."""

from __future__ import annotations

import json
import re

import pytest

from payments.enums import OperationKind, Outcome
from payments.models import PaymentOperation, Purchase
from support import selectors
from support.access import can
from support.models import Incident
from support.runbooks import runbooks_all
from tests.browser import cdp
from webhooks.models import ProviderEvent

from .test_browser import SHOTS

pytestmark = [
    pytest.mark.skipif(not cdp.available(), reason="/usr/bin/chromium is not installed"),
    pytest.mark.django_db(transaction=True),
]

ROLE_USER = {"support": "sam", "operator": "olga", "finance": "fred"}


def _log_in(browser, live_server, role):
    name = ROLE_USER[role]
    browser.goto(f"{live_server.url}/console/login/")
    browser.evaluate(
        f"document.getElementById('id_username').value = '{name}';"
        f"document.getElementById('id_password').value = 'pw-{name}'"
    )
    browser.submit("form[action='/console/login/']")
    assert browser.evaluate("location.pathname") == "/console/"


def _text(browser) -> str:
    return browser.evaluate("document.body.innerText")


@pytest.mark.parametrize("role", ["support", "operator", "finance"])
def test_refund_typed_in_major_units_is_echoed_then_requested(
    browser, live_server, role, users, new_purchase, pay_now
):
    purchase = new_purchase(price=1500)
    assert pay_now(purchase).outcome == Outcome.SUCCEEDED
    _log_in(browser, live_server, role)
    browser.goto(f"{live_server.url}/console/purchases/{purchase.pk}/")
    form = f"form[action='/console/purchases/{purchase.pk}/refunds']"
    browser.evaluate(
        f"var f = document.querySelector({form!r});"
        "f.querySelector('#refund-amount').value = '10.00';"
        "f.querySelector('textarea[name=reason]').value = 'Mug arrived broken';"
        "f.querySelector('input[name=confirm]').checked = true;"
        "document.getElementById('refund-h').scrollIntoView();"
    )
    if role == "finance":
        browser.screenshot(SHOTS / "console-refund-form.png")

    browser.submit(form)

    echo = browser.evaluate("document.querySelector('[data-refund-echo]').dataset.amountMinor")
    assert echo == "1000"
    assert "Refund 10.00 USD on" in _text(browser)
    assert not PaymentOperation.objects.filter(
        purchase=purchase, kind=OperationKind.REFUND
    ).exists()
    if role == "finance":
        browser.screenshot(SHOTS / "console-refund-echo.png")

    browser.submit("[data-refund-echo] form")

    assert "Refund of 10.00 USD requested" in _text(browser)
    refund = PaymentOperation.objects.get(purchase=purchase, kind=OperationKind.REFUND)
    assert (refund.amount, refund.outcome) == (1000, Outcome.AWAITING_APPROVAL)
    assert refund.requested_by_user.get_username() == ROLE_USER[role]
    assert browser.csp_violations() == []


_FETCH_ALL = """
Promise.all(%s.map(u => fetch(u, {credentials: 'same-origin'}).then(r => [u, r.status])))
"""


@pytest.mark.parametrize("role", ["support", "operator", "finance"])
def test_every_queue_item_has_a_working_link_or_action(browser, live_server, demo, role, users):
    _log_in(browser, live_server, role)
    queues = [q for q in selectors.QUEUES.values() if can(users[role], q.action)]
    checked = 0
    for q in queues:
        browser.goto(f"{live_server.url}/console/queues/{q.name}/")
        rows = browser.evaluate("""
          Array.from(document.querySelectorAll('table.queue tbody tr')).map(tr => ({
            links: Array.from(tr.querySelectorAll('a')).map(a => a.getAttribute('href')),
            forms: tr.querySelectorAll('[data-item-action] form').length,
            action: tr.querySelector('[data-item-action]').innerText.trim()}))""")
        assert rows, q.name  # the demo has an item in every queue
        for row in rows:
            assert row["links"] or row["forms"], (q.name, row)
            assert row["action"], (q.name, row)
            statuses = browser.call(
                "Runtime.evaluate",
                awaitPromise=True,
                returnByValue=True,
                expression=_FETCH_ALL % json.dumps([h.split("#")[0] for h in row["links"]]),
            )["result"]["value"]
            assert all(status == 200 for _, status in statuses), (q.name, statuses)
            checked += 1
    assert checked >= len(queues)


def test_search_finds_order_reference_balance_transaction_and_partial_email(
    browser, live_server, demo, new_purchase, pay_now, localstripe
):
    paid = new_purchase(price=2200, email="ada.lovelace@example.com")
    charge = pay_now(paid)
    [txn] = [
        t["id"]
        for t in localstripe.list("balance_transactions")
        if t.get("source") == charge.provider_charge
    ]
    with_order = Purchase.objects.get(customer_reference="demo-paid-with-order")
    _log_in(browser, live_server, "finance")

    for q, purchase in (("ord_demo_paid-with-order", with_order), (txn, paid), ("ada.love", paid)):
        browser.evaluate(f"document.getElementById('q').value = {json.dumps(q)}")
        browser.submit("form.search")
        assert browser.evaluate("location.pathname") == f"/console/purchases/{purchase.pk}/", q


def test_dashboard_renders_its_charts(browser, live_server, demo):
    _log_in(browser, live_server, "operator")
    browser.goto(f"{live_server.url}/console/")
    charts = browser.evaluate("""
      Array.from(document.querySelectorAll('.charts img')).map(i => ({
        src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0}))""")
    assert len(charts) == 4 and all(c["ok"] for c in charts), charts
    assert browser.evaluate("document.querySelector('section.halted') === null")
    browser.evaluate("document.getElementById('charts-h').scrollIntoView()")
    browser.screenshot(SHOTS / "console-dashboard-charts.png")
    browser.evaluate("window.scrollTo(0, 0)")
    browser.screenshot(SHOTS / "console-dashboard.png")
    assert browser.csp_violations() == []


# A number directly followed or preceded by a currency code with no decimal point is a
# minor-unit amount ("1500 usd"); lower-case codes beside numbers are provider spelling.
MINOR = re.compile(
    r"(?<![\d.,])\d+ (?:USD|EUR|GBP)\b|\b\d+ (?:usd|eur|gbp)\b"
    r"|\b(?:usd|eur|gbp) \d"
)
RAW_NONE = re.compile(r"\bNone\b")
OTHER_TIME = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d|\b[ap]\.m\.|\d\d:\d\d:\d\d")


def _console_pages(role_user) -> list[str]:
    pages = [
        "/console/",
        "/console/halts/",
        "/console/incidents/",
        "/console/audit/",
        "/console/runbooks/",
        "/console/search/?q=demo-",
    ]
    pages += [
        f"/console/queues/{q.name}/" for q in selectors.QUEUES.values() if can(role_user, q.action)
    ]
    pages += [f"/console/purchases/{pk}/" for pk in Purchase.objects.values_list("pk", flat=True)]
    pages += [f"/console/events/{pk}/" for pk in ProviderEvent.objects.values_list("pk", flat=True)]
    pages += [f"/console/incidents/{pk}/" for pk in Incident.objects.values_list("pk", flat=True)]
    pages += [f"/console/runbooks/{rb.slug}/" for rb in runbooks_all()]
    return pages


@pytest.mark.parametrize("role", ["support", "operator", "finance"])
def test_no_console_page_shows_raw_none_minor_units_or_another_time_format(
    browser, live_server, demo, role, users, new_purchase, pay_now, drill, api_client
):
    from payments import services as pay
    from payments.providers.stripe import DrillMode

    # Plus real payments through localstripe, so provider calls, transitions and a
    # scheduled read-back exist: one paid, one whose answer was lost (unknown).
    pay_now(new_purchase(price=1500))
    lost = pay.payment_create(
        purchase_id=new_purchase(price=1250).pk,
        api_client=api_client,
        payment_method="pm_card_visa",
    )
    drill(lost, DrillMode.DROP_RESPONSE_AFTER_SEND)
    assert pay.operation_dispatch(operation_id=lost.pk).outcome == Outcome.UNKNOWN
    _log_in(browser, live_server, role)
    problems = []
    for page in _console_pages(users[role]):
        browser.goto(f"{live_server.url}{page}")
        text = _text(browser)
        assert "Not allowed" not in text or page.startswith("/console/queues/"), page
        for name, pattern in (
            ("raw None", RAW_NONE),
            ("minor units", MINOR),
            ("other time format", OTHER_TIME),
        ):
            for m in pattern.finditer(text):
                problems.append((page, name, text[max(0, m.start() - 40) : m.end() + 20]))
        untitled = browser.evaluate(
            "Array.from(document.querySelectorAll('main time')).filter("
            "t => !t.getAttribute('title')).length"
        )
        if untitled:
            problems.append((page, "time without absolute on hover", untitled))
    assert problems == []
    assert browser.csp_violations() == []


def test_screenshots_of_a_timeline_and_the_audit_page(browser, live_server, demo):
    from django.urls import reverse

    comp = Purchase.objects.get(customer_reference="demo-compensation-needed")
    _log_in(browser, live_server, "operator")
    browser.goto(f"{live_server.url}{reverse('support:purchase', args=[comp.pk])}")
    form = "form[data-step-form='ledger']"
    browser.evaluate(
        f"var f = document.querySelector({form!r});"
        "f.querySelector('input[value=done]').checked = true;"
        "f.querySelector('textarea[name=reason]').value = 'Booked by hand in the ledger';"
        "f.querySelector('input[name=confirm]').checked = true;"
    )
    browser.submit(form)
    assert "Step ledger marked handled" in _text(browser)
    browser.evaluate("document.getElementById('tl-h').scrollIntoView()")
    browser.screenshot(SHOTS / "console-timeline.png")
    browser.goto(f"{live_server.url}/console/audit/")
    assert "step_resolve" in _text(browser)
    browser.screenshot(SHOTS / "console-audit.png")
    assert browser.csp_violations() == []


def test_on_a_phone_every_console_link_shows_and_the_page_does_not_scroll_sideways(
    browser, live_server, demo
):
    _log_in(browser, live_server, "support")
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        width=390,
        height=844,
        deviceScaleFactor=1,
        mobile=True,
    )
    try:
        for path in ("/console/", "/console/purchases/"):
            browser.goto(f"{live_server.url}{path}")
            assert browser.evaluate("document.documentElement.scrollWidth") <= 390, path
            hidden = browser.evaluate(
                "[...document.querySelectorAll('header.top nav a')]"
                ".filter(a => a.getBoundingClientRect().right > 390).map(a => a.textContent)"
            )
            assert hidden == [], path
        browser.screenshot(SHOTS / "console-purchases-phone.png")
    finally:
        browser.call("Emulation.clearDeviceMetricsOverride")
