"""The four people Verity serves, each doing their task end to end in Chromium (Playwright):
a customer on a phone told not to pay again, support answering a caller, finance approving
a refund, an operator halting checkout during an incident. Each test asserts what the
person sees (the words, the primary button, no refusal page) and what happened (provider
objects at localstripe, rows in the database).

The screenshots named here are the ones docs/console.md shows (VERITY_DOC_IMAGES=1 refreshes
docs/img/)."""

from __future__ import annotations

import re
import uuid
from io import StringIO

import pytest
import requests
from django.core import mail
from django.core.management import call_command

from payments import services
from payments.enums import Outcome
from payments.models import PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from recovery.models import EmailMessage, WorkflowHalt
from support.customer_copy import customer_state
from support.demo import DEMO_INCIDENT_TITLE, DEMO_REFUND_CASE, demo_provider_payments_seed
from support.models import Incident
from tests.acp.tokens import issue_spt
from tests.factories import ProductFactory, make_client
from tests.outbox import settle_outbox

from .pages import log_in, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

CODE = re.compile(r"\b[A-Z0-9]{5}-[A-Z0-9]{5}\b")
# A filled button (the page's accent colour) is what a person takes for "the" button.
FILLED = """() => [...document.querySelectorAll('button, a.button')].filter(e => {
  const r = e.getBoundingClientRect();
  return r.width > 0 && r.height > 0
      && getComputedStyle(e).backgroundColor === 'rgb(11, 92, 173)';
}).map(e => [e.id, e.innerText.trim(), e.getBoundingClientRect().bottom])"""


class Shop:
    """The storefront's backend, calling Verity's REST API over HTTP."""

    def __init__(self, base: str, key: str) -> None:
        self.base = f"{base}/api/v1/"
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Api-Key {key}"

    def post(self, path: str, body: dict) -> requests.Response:
        return self.http.post(
            self.base + path, json=body, timeout=30, headers={"Idempotency-Key": str(uuid.uuid4())}
        )

    def buy(self, sku: str, customer: str, email: str, **extra) -> requests.Response:
        quote = self.post("quotes", {"items": [{"sku": sku, "quantity": 1}], "currency": "usd"})
        assert quote.status_code == 201, quote.text
        q = quote.json()
        return self.post(
            "purchases",
            {
                "quote_id": q["id"],
                "quote_version": q["version"],
                "customer": {"reference": customer, "email": email},
                **extra,
            },
        )

    def pay(self, purchase_id: str) -> requests.Response:
        return self.post(f"purchases/{purchase_id}/payments", {"payment_method": "pm_card_visa"})


@pytest.fixture(autouse=True)
def _outbox_settled():
    """Work the API calls left in the outbox finishes before the tables are emptied (see
    tests/outbox.py settle_outbox)."""
    yield
    settle_outbox()


@pytest.fixture
def shop(live_server, settings):
    settings.PUBLIC_BASE_URL = live_server.url  # the status links the API hands out
    client, key = make_client(name="people-shop", limit=100_000_000)
    shop = Shop(live_server.url, key)
    shop.client = client
    return shop


@pytest.fixture
def demo(console_people):
    make_client(name="demo-storefront")
    call_command("seed_console_demo", stdout=StringIO())


def _filled(page) -> list:
    return page.evaluate(FILLED)


def test_a_customer_told_not_to_pay_again_takes_the_safe_path_then_gets_a_code(
    person_on_phone, shop, drill, localstripe
):
    product = ProductFactory(sku=f"LAMP-{uuid.uuid4().hex[:6]}", price=2000, stock=100)
    first = shop.buy(product.sku, "cust-ana", "ana@example.com").json()
    # The shop's payment reaches the provider, the answer is lost: the money may have moved.
    op = services.payment_create(
        purchase_id=first["id"], api_client=shop.client, payment_method="pm_card_visa"
    )
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    assert services.operation_dispatch(operation_id=op.id).outcome == Outcome.UNKNOWN
    again = shop.buy(product.sku, "cust-ana", "ana@example.com")
    assert again.status_code == 409, again.text
    refusal = again.json()
    assert refusal["code"] == "customer_has_unresolved_purchase"
    assert refusal["purchase"] == first["id"] and "Do not open another" in refusal["detail"]
    page = person_on_phone

    page.goto(first["status_url"])
    assert "Please do not pay again" in page.inner_text("body")
    # One filled button on the first screen, and it is the safe one.
    (primary,) = _filled(page)
    assert primary[:2] == ["check-now", "Check again now"] and primary[2] <= 844, primary
    assert not page.is_visible("#confirm-new-purchase")
    screenshot(page, "customer-phone-do-not-pay-again.png", docs=True)
    with page.expect_navigation():
        page.tap("#check-now")
    assert "Please do not pay again" in page.inner_text("body")
    assert EmailMessage.objects.filter(purchase_id=first["id"]).count() == 0

    # They really want a second lamp: the folded choice, then the code by e-mail.
    page.tap("#new-purchase summary")
    assert "You do not need this for the purchase above" in page.inner_text("body")
    assert [f[:2] for f in _filled(page)] == [primary[:2]]
    with page.expect_navigation():
        page.tap("#confirm-new-purchase")
    shown = page.inner_text("body")
    screenshot(page, "customer-phone-code-sent.png", docs=True)
    assert "You asked for a new purchase" in shown and not CODE.search(shown), shown
    assert page.refusals == []  # no 403 on the way (the CSRF check accepted the tap)
    codes = [
        CODE.search(m.body).group(0)
        for m in mail.outbox
        if f"next to {first['id']})" in m.subject and CODE.search(m.body)
    ]
    assert len(codes) == 1

    second = shop.buy(product.sku, "cust-ana", "ana@example.com", buyer_confirmation=codes[0])
    assert second.status_code == 201, second.text
    # One payment at the provider for the first purchase: nothing was paid twice.
    assert len(localstripe.payment_intents_for(first["id"])) == 1
    assert Purchase.objects.filter(customer_reference="cust-ana").count() == 2


def test_support_finds_a_caller_by_name_and_reads_them_what_their_page_says(
    person_at_desk, live_server, console_people, acp_agent, tea
):  # noqa: F811
    session = acp_agent.create(tea.sku).json()
    done = acp_agent.post(
        f"checkout_sessions/{session['id']}/complete",
        {
            "buyer": {
                "first_name": "Grace",
                "last_name": "Hopperton",
                "email": "grace@example.com",
            },
            "payment_data": {"provider": "stripe", "token": issue_spt(1250)},
        },
    )
    assert done.status_code == 200, done.text
    purchase = Purchase.objects.get(pk=done.json()["order"]["id"])
    page = person_at_desk
    log_in(page, live_server.url, "sam")

    # "Hello, this is Grace Hopperton, I bought tea from your shop."
    with page.expect_navigation():
        page.get_by_role("link", name="Purchases").first.click()
    page.fill("#list-q", "hopperton")
    with page.expect_navigation():
        page.get_by_role("button", name="Show").click()
    listing = page.inner_text("main")
    assert "Grace Hopperton" in listing and "grace@example.com" in listing, listing
    assert "12.50 USD" in listing
    screenshot(page, "console-purchases-search.png", docs=True)
    with page.expect_navigation():
        page.locator(f"a[href*='{purchase.pk}']").first.click()

    told = page.inner_text("main")
    truth = customer_state(Purchase.objects.get(pk=purchase.pk))
    assert "What the customer sees" in told and truth.headline in told, told
    assert purchase.operations.get().provider_reference in told
    screenshot(page, "console-purchase-for-a-caller.png", docs=True)
    assert page.refusals == []


def test_finance_approves_a_refund_and_the_provider_pays_it(
    person_at_desk, live_server, demo, localstripe
):
    intent = demo_provider_payments_seed()
    purchase = Purchase.objects.get(customer_reference=DEMO_REFUND_CASE)
    page = person_at_desk
    log_in(page, live_server.url, "fred")

    with page.expect_navigation():
        page.get_by_role("link", name="Refunds awaiting approval").click()
    with page.expect_navigation():
        page.locator(f"a[href*='{purchase.pk}']").first.click()
    form = page.locator("form", has=page.get_by_role("button", name="Approve and send"))
    form.locator("textarea[name=reason]").fill("Customer sent the tea back")
    form.locator("input[name=confirm]").check()
    screenshot(page, "console-refund-approve.png", docs=True)
    with page.expect_navigation():
        form.get_by_role("button", name="Approve and send").click()

    refund = PaymentOperation.objects.get(purchase=purchase, kind="refund")
    assert refund.outcome == Outcome.SUCCEEDED
    at_provider = localstripe.refunds_for(intent)
    assert [(r["id"], r["amount"], r["status"]) for r in at_provider] == [
        (refund.provider_reference, 1250, "succeeded")
    ]
    seen = page.inner_text("main")
    assert "Approve and send" not in seen and refund.provider_reference in seen
    assert page.refusals == []


def test_an_operator_halts_checkout_during_an_incident_and_lifts_it(
    person_at_desk, live_server, demo, shop
):
    product = ProductFactory(sku=f"MUG-{uuid.uuid4().hex[:6]}", price=1800, stock=100)
    incident = Incident.objects.get(title=DEMO_INCIDENT_TITLE)
    page = person_at_desk
    log_in(page, live_server.url, "olga")

    with page.expect_navigation():
        page.get_by_role("link", name=DEMO_INCIDENT_TITLE).first.click()
    form = page.locator(f"form[action='/console/incidents/{incident.pk}/halt']")
    form.locator("select[name=name]").select_option("checkout")
    form.locator("textarea[name=reason]").fill("Provider times out on confirm")
    form.locator("input[name=confirm]").check()
    with page.expect_navigation():
        form.get_by_role("button", name="Halt").click()
    assert "checkout (still on)" in page.inner_text("main")
    screenshot(page, "console-incident-halt.png", docs=True)
    assert WorkflowHalt.objects.filter(name="checkout").count() == 1
    # What the halt does: the shop's new payment is refused, nothing reaches the provider.
    held = shop.buy(product.sku, "cust-halt", "halt@example.com").json()
    refused = shop.pay(held["id"])
    assert refused.status_code == 503 and refused.json()["code"] == "workflow_halted"

    with page.expect_navigation():
        page.get_by_role("link", name="Halts").first.click()
    form = page.locator("form[action='/console/halts/clear']")
    form.locator("select[name=name]").select_option("checkout")
    form.locator("textarea[name=reason]").fill("Provider answers again")
    form.locator("input[name=confirm]").check()
    with page.expect_navigation():
        form.get_by_role("button", name="Resume").click()

    assert "Nothing is halted." in page.inner_text("main")
    assert WorkflowHalt.objects.filter(name="checkout").count() == 0
    assert shop.pay(held["id"]).status_code == 201
    assert page.refusals == []
