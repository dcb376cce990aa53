"""Verity's own error pages: a bad status link, an unknown console or site address and an
expired form each get a page in Verity's words (not Django's), and an expired form
changes nothing."""

from __future__ import annotations

from django.test import Client
from django.urls import reverse

from recovery.models import WorkflowHalt


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
