"""Small things that cost trust: a not-allowed page names who can open it, Verity's own
404 and CSRF pages, Resume lists only what is halted, the customer page names the shop,
the demo's order references look like real ones."""

from __future__ import annotations

from django.test import Client
from django.urls import reverse

from recovery.models import Order, WorkflowHalt

from .builders import purchase_in


def test_not_allowed_names_a_role_that_can_open_the_page(login, db):
    response = login("support").get(reverse("support:queue", args=["settlement"]))

    assert response.status_code == 403
    assert "Ask someone with the <strong>finance</strong> role." in response.content.decode()
    response = login("support").post(reverse("support:halt-set"), {"name": "checkout"})
    assert "Ask someone with the <strong>operator</strong> role." in response.content.decode()


def test_bad_status_link_and_unknown_console_address_get_verity_pages(client, login, db):
    for url in ("/status/bad/", "/status/" + "x" * 200 + "/"):
        response = client.get(url)
        assert response.status_code == 404
        assert "This status link is not valid" in response.content.decode(), url
        assert "Content-Security-Policy" in response
    html = login("support").get("/console/nothing/here/").content.decode()
    assert "Nothing matches this address" in html
    elsewhere = client.get("/no-such-page")
    assert elsewhere.status_code == 404 and "Nothing matches this address" in (
        elsewhere.content.decode()
    )


def test_stale_csrf_token_gets_a_page_that_says_nothing_changed(users):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["operator"])

    response = client.post(
        reverse("support:halt-set"), {"name": "checkout", "reason": "x", "confirm": "yes"}
    )

    assert response.status_code == 403
    assert "This form expired — nothing was changed" in response.content.decode()
    assert not WorkflowHalt.objects.exists()


def test_resume_lists_only_halted_workflows(login, db):
    WorkflowHalt.objects.create(name="refunds", reason="provider refunds failing", halted_by="olga")

    html = login("operator").get(reverse("support:halts")).content.decode()

    resume = html[html.index('id="resume-name"') :]
    resume = resume[: resume.index("</select>")]
    assert "<option>refunds</option>" in resume and "checkout" not in resume
    halt = html[html.index('id="halt-name"') :]
    assert "<option>refunds</option>" not in halt[: halt.index("</select>")]


def test_nothing_halted_offers_no_resume(login, db):
    html = login("operator").get(reverse("support:halts")).content.decode()
    assert 'id="resume-name"' not in html and "Nothing is halted." in html


def test_customer_page_names_the_shop(client, db, settings):
    settings.SHOP_NAME = "Tea & Mugs Ltd"
    purchase = purchase_in()

    html = client.get(f"/status/{purchase.status_token}/").content.decode()

    assert "<span data-shop-name>Tea &amp; Mugs Ltd</span> · purchase status" in html


def test_demo_order_references_look_like_real_ones(users):
    from io import StringIO

    from django.core.management import call_command

    from tests.factories import make_client

    make_client(name="demo-storefront")
    out = StringIO()
    call_command("seed_console_demo", stdout=out)

    refs = list(Order.objects.values_list("reference", flat=True))
    assert refs and all(r.startswith("ord_") for r in refs)
    assert "We are checking your payment" in out.getvalue() or "checking" in out.getvalue()
