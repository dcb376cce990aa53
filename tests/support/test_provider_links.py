"""A provider reference on the purchase page links to where support reads it: the Stripe
dashboard (configurable base URL) for pi_/ch_/re_."""

from __future__ import annotations

import pytest

from payments.enums import PurchaseStatus
from tests.support.builders import SUCCEEDED, purchase_in

pytestmark = pytest.mark.django_db


def test_a_payment_intent_links_to_the_stripe_dashboard(login, settings):
    settings.STRIPE_DASHBOARD_URL = "https://dashboard.example.test/acct"
    p = purchase_in(PurchaseStatus.COMPLETED, ops=[SUCCEEDED], order="ord_linked")
    html = login("support").get(f"/console/purchases/{p.pk}/").content.decode()
    assert 'href="https://dashboard.example.test/acct/payments/pi_test_ok"' in html
