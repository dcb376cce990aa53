"""One owner per thing on every console screen: the purchase card, each operation card and
the queue row name the same next owner (payments.next_action decides it; the console only
renames it), and a purchase nobody needs to act on shows no recovery owner."""

from __future__ import annotations

import re

import pytest

from payments.enums import Outcome, PurchaseStatus, Stage
from tests.support.builders import SUCCEEDED, UNKNOWN, purchase_in

pytestmark = pytest.mark.django_db


def _page_owners(html: str) -> tuple[str, set[str]]:
    card = re.search(r"<strong>Owner: ([^<]+)</strong>", html).group(1)
    return card, set(re.findall(r"data-op-owner>([^<]+)</dd>", html))


def _queue_row(html: str, ref: str) -> str:
    return re.search(rf'<tr [^>]*data-item="{ref}">(.*?)</tr>', html, re.S).group(1)


def test_a_healthy_purchase_shows_no_recovery_owner(login):
    done = purchase_in(
        PurchaseStatus.COMPLETED,
        ops=[SUCCEEDED],
        order="ord_healthy",
        recovery_owner="payments-oncall",
    )
    html = login("support").get(f"/console/purchases/{done.pk}/").content.decode()
    assert "payments-oncall" not in html
    assert "Recovery owner" not in html


def test_the_purchase_its_operation_and_its_queue_row_name_one_owner(login):
    p = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN], recovery_owner="payments-oncall")
    op = p.operations.get()
    client = login("support")
    card, op_owners = _page_owners(client.get(f"/console/purchases/{p.pk}/").content.decode())
    row = _queue_row(client.get("/console/queues/unknown/").content.decode(), op.pk)
    assert op_owners == {card}
    assert f"<td>{card}</td>" in row, (card, row)


def test_a_refund_awaiting_approval_is_finances_on_the_purchase_and_operation_cards(login):
    p = purchase_in(
        PurchaseStatus.COMPLETED,
        order="ord_refund_wait",
        ops=[
            SUCCEEDED,
            {
                "kind": "refund",
                "outcome": Outcome.AWAITING_APPROVAL,
                "stage": Stage.QUEUED,
                "next_action_owner": "support",
            },
        ],
    )
    html = login("support").get(f"/console/purchases/{p.pk}/").content.decode()
    card, _ = _page_owners(html)
    assert card == "finance"
    assert re.findall(r"data-op-owner>([^<]+)</dd>", html) == ["nothing to do", "finance"]
