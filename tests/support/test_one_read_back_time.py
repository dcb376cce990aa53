"""One next read-back time per screen: the message after a read-back, the next-action card
and the operation card all say it in the console's one format (support.timefmt)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from payments.enums import PurchaseStatus
from tests.support.builders import UNKNOWN, purchase_in

pytestmark = pytest.mark.django_db


def test_the_next_read_back_reads_the_same_everywhere_on_the_page(login, localstripe):
    purchase = purchase_in(
        PurchaseStatus.PAYMENT_UNKNOWN, ops=[{**UNKNOWN, "provider_reference": "pi_never_created"}]
    )
    op = purchase.operations.get()
    response = login("support").post(reverse("support:reconcile", args=[op.pk]), {}, follow=True)
    op.refresh_from_db()
    assert op.next_reconcile_at is not None and op.next_reconcile_at > timezone.now()
    # Far enough from a minute's edge that both renderings see the same minute.
    assert (op.next_reconcile_at - timezone.now()) > timedelta(seconds=30)
    html = response.content.decode()
    said = set(re.findall(r"[Nn]ext read-back (?:</dt><dd><time[^>]*>)?(in [0-9][^<.)]*)", html))
    assert len(said) == 1, said
