"""Headless Chromium (Debian's /usr/bin/chromium over CDP) against pytest-django's live
server: the status page updates in place when the payment settles, the console flow
from support to operator. Screenshots are saved as test artefacts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests

from payments.enums import Outcome, PurchaseStatus
from payments.models import PaymentOperation
from payments.providers.stripe import DrillMode
from support.models import AuditEntry
from tests.browser import cdp
from tests.waiting import wait_for

from .test_status_page import CASES, _build

pytestmark = [
    pytest.mark.skipif(not cdp.available(), reason="/usr/bin/chromium is not installed"),
    pytest.mark.django_db(transaction=True),
]

ARTIFACTS = Path(
    os.environ.get(
        "VERITY_ARTIFACT_DIR", Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
    )
)
SHOTS = ARTIFACTS / "screenshots"


def _code(browser) -> str:
    return browser.evaluate("document.getElementById('state').getAttribute('data-code')")


def test_status_page_updates_without_reload(
    browser, live_server, settings, new_purchase, api_client, drill
):
    from payments import services as pay

    settings.STATUS_POLL_SECONDS = 1
    purchase = new_purchase()
    op = pay.payment_create(
        purchase_id=purchase.pk, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    assert pay.operation_dispatch(operation_id=op.pk).outcome == Outcome.UNKNOWN

    url = f"{live_server.url}/status/{purchase.status_token}/"
    browser.goto(url)
    assert _code(browser) == "not_yet_confirmable"
    assert browser.evaluate("document.getElementById('pay-again') === null")
    browser.evaluate("window.__sameDocument = 'yes'")  # lost if the page reloads
    browser.screenshot(SHOTS / "status-live-1-checking.png")

    # The reconciler reads the provider back in the background.
    assert pay.operation_reconcile(operation_id=op.pk).outcome == Outcome.SUCCEEDED
    # "complete" if a Celery worker from another test module runs the steps meanwhile.
    wait_for(lambda: _code(browser) in ("paid_confirmation_delayed", "complete"), timeout=20)
    assert browser.evaluate("window.__sameDocument") == "yes"
    assert browser.evaluate("document.getElementById('state-h').textContent") in (
        "Payment received — order confirmation in progress",
        "Your order is complete",
    )
    assert browser.evaluate("document.getElementById('pay-again') === null")
    browser.screenshot(SHOTS / "status-live-2-paid.png")
    assert browser.csp_violations() == []

    # Posting the pay form directly is refused by the server.
    r = requests.post(f"{url}pay-again", allow_redirects=False, timeout=10)
    assert r.status_code == 409
    assert PaymentOperation.objects.filter(purchase_id=purchase.pk).count() == 1


def test_screenshot_of_every_state(browser, live_server):
    for case_id, status, ops, order, code, _ in CASES:
        purchase = _build(status, ops, order)
        browser.goto(f"{live_server.url}/status/{purchase.status_token}/")
        assert _code(browser) == code, case_id
        has_button = browser.evaluate("document.getElementById('pay-again') !== null")
        assert has_button == (code == "failed"), case_id
        browser.screenshot(SHOTS / f"status-{case_id}.png")
    assert browser.csp_violations() == []


def test_console_support_then_operator(
    browser, live_server, users, new_purchase, api_client, drill
):
    from payments import services as pay

    purchase = new_purchase()
    op = pay.payment_create(
        purchase_id=purchase.pk, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    op = pay.operation_dispatch(operation_id=op.pk)
    assert op.outcome == Outcome.UNKNOWN and op.provider_reference.startswith("pi_")

    def log_in(username):
        browser.goto(f"{live_server.url}/console/login/")
        browser.evaluate(
            f"document.getElementById('id_username').value = '{username}';"
            f"document.getElementById('id_password').value = 'pw-{username}'"
        )
        browser.submit("form[action='/console/login/']")

    log_in("sam")  # support
    browser.goto(f"{live_server.url}/console/search/?q={op.provider_reference}")
    assert browser.evaluate("location.pathname") == f"/console/purchases/{purchase.pk}/"
    text = browser.evaluate("document.body.innerText")
    assert "unknown" in text and "We are checking your payment" in text
    assert "Resolve manually" not in text
    browser.screenshot(SHOTS / "console-1-support-sees-unknown.png")
    # Support posts the resolve form anyway: refused by the server.
    status = browser.call(
        "Runtime.evaluate",
        awaitPromise=True,
        returnByValue=True,
        expression=(
            f"fetch('/console/operations/{op.pk}/resolve', "
            "{method: 'POST', credentials: 'same-origin',"
            " headers: {'Content-Type': 'application/x-www-form-urlencoded',"
            " 'X-CSRFToken': document.querySelector('[name=csrfmiddlewaretoken]').value},"
            " body: 'outcome=succeeded&reason=x&confirm=yes'}).then(r => r.status)"
        ),
    )["result"]["value"]
    assert status == 403
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.UNKNOWN

    browser.submit("form.logout")
    log_in("olga")  # operator
    browser.goto(f"{live_server.url}/console/")
    assert (
        browser.evaluate("document.querySelector('tr[data-queue=unknown] td.num').textContent")
        == "1"
    )
    browser.screenshot(SHOTS / "console-0-dashboard.png")
    browser.goto(f"{live_server.url}/console/purchases/{purchase.pk}/")
    form = f"form[action='/console/operations/{op.pk}/resolve']"
    browser.evaluate(
        f"var f = document.querySelector({form!r});"
        "f.querySelector('input[value=succeeded]').checked = true;"
        "f.querySelector('textarea[name=reason]').value = 'Provider dashboard shows it paid';"
        "f.querySelector('input[name=confirm]').checked = true;"
    )
    browser.screenshot(SHOTS / "console-2-operator-resolves.png")
    browser.submit(form)
    text = browser.evaluate("document.body.innerText")
    assert "Operation resolved manually." in text
    assert "Manual resolution" in text and "Audit: console.resolve by olga" in text
    browser.screenshot(SHOTS / "console-3-timeline-and-audit.png")
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.SUCCEEDED
    assert AuditEntry.objects.filter(action="console.resolve", actor="olga").count() == 1
    assert purchase.__class__.objects.get(pk=purchase.pk).status in (
        PurchaseStatus.PAID,
        PurchaseStatus.FULFILLING,
        PurchaseStatus.COMPLETED,
    )
    assert browser.csp_violations() == []
