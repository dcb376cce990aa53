"""The dashboard draws its charts as server-rendered SVG images from this origin: no
script, no third-party host, the page's CSP unchanged; halted workflows and open
incidents look different."""

from __future__ import annotations

from django.urls import reverse

from payments.enums import HoldState, PurchaseStatus
from payments.models import Hold
from recovery.models import WorkflowHalt
from support import charts
from tests.factories import make_client

from .builders import UNKNOWN, purchase_in


def test_dashboard_links_every_chart_as_an_image(login, db):
    html = login("support").get(reverse("support:dashboard")).content.decode()

    for slug in charts.CHARTS:
        assert f'<img src="/console/charts/{slug}.svg"' in html
    assert "<svg" not in html and "<script" not in html


def test_each_chart_is_svg_without_script_or_external_reference(login, db):
    purchase = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN])
    Hold.objects.create(
        api_client=make_client(name="shop-a")[0],
        operation=purchase.operations.get(),
        amount=3050,
        currency="usd",
        state=HoldState.RESERVED,
    )
    client = login("support")

    for slug in charts.CHARTS:
        response = client.get(reverse("support:chart", args=[slug]))
        body = response.content.decode()
        assert response.status_code == 200 and response["Content-Type"] == "image/svg+xml"
        assert body.lstrip().startswith("<?xml") and "<svg" in body
        assert "<script" not in body and "http://" not in body.split("-->")[-1].replace(
            "http://www.w3.org/", ""
        )
        assert "script-src" not in response["Content-Security-Policy"]
        assert "default-src 'none'" in response["Content-Security-Policy"]
    risk = client.get(reverse("support:chart", args=["money-at-risk"])).content.decode()
    assert "USD" in risk and "30.50" in risk and "shop-a" in risk
    age = client.get(reverse("support:chart", args=["unknown-age"])).content.decode()
    assert "&lt; 5 min" in age or "< 5 min" in age


def test_unknown_chart_is_404(login, db):
    assert login("support").get("/console/charts/nope.svg").status_code == 404


def test_halted_workflow_looks_different_from_an_open_incident(login, db):
    WorkflowHalt.objects.create(name="checkout", reason="provider outage", halted_by="olga")

    html = login("support").get(reverse("support:dashboard")).content.decode()

    assert 'class="halted" data-halted' in html
    assert "Halted: new dispatches are refused" in html
    assert "data-incident-open" not in html
