"""One next action, four surfaces: for every purchase/operation state a purchase can be in,
the REST API, the MCP tools, the console and the customer page say the same thing about
who acts next and whether the buyer may pay (again).

Each surface is read through its own entry point (REST over HTTP, the MCP tool function,
the console page over HTTP, the customer page's state); the expectations below compare
them with each other, not with payments.next_action, so a surface that re-derives shows
up as a disagreement.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from agents import tools
from payments.enums import (
    Grade,
    OperationKind,
    Outcome,
    PurchaseStatus,
    Reason,
    Stage,
    Verification,
)
from payments.models import PaymentOperation
from support.customer_copy import customer_state
from tests.factories import make_client

from .builders import FAILED, SUCCEEDED, UNKNOWN, purchase_in

pytestmark = pytest.mark.django_db

S = PurchaseStatus
PENDING = {"outcome": Outcome.PENDING, "stage": Stage.QUEUED}
DISPATCHING = {
    "outcome": Outcome.DISPATCHING,
    "stage": Stage.DISPATCHING,
    "provider_reference": "pi_test_sending",
}
AWAITING_PROVIDER = {
    "outcome": Outcome.AWAITING_PROVIDER,
    "stage": Stage.RECONCILING,
    "verification": Verification.PROVIDER,
    "provider_reference": "pi_test_processing",
}
AWAITING_BUYER = {
    "outcome": Outcome.AWAITING_BUYER,
    "stage": Stage.DISPATCHING,
    "provider_reference": "pi_test_3ds",
}
ESCALATED = {**UNKNOWN, "stage": Stage.ESCALATED}
BY_TEAM_FAILED = {
    **FAILED,
    "grade": Grade.ACKNOWLEDGED,
    "verification": Verification.MANUAL,
    "reason": Reason.MANUAL,
}
PROVIDER_FAILED = {**FAILED, "reason": Reason.PROVIDER_FAILED}
INVALID = {**FAILED, "reason": Reason.INVALID_REQUEST}
X402_SENT = {**AWAITING_PROVIDER, "rail": "x402", "provider_reference": "0xsent"}
X402_UNKNOWN = {**UNKNOWN, "rail": "x402", "provider_reference": "0xlost"}


def _refund(outcome, **kw):
    return {"kind": OperationKind.REFUND, "amount": 500, "outcome": outcome, **kw}


# name -> (purchase status, operations, extra setup)
STATES = {
    "awaiting payment": (S.AWAITING_PAYMENT, [], None),
    "awaiting payment, quote expired": (S.AWAITING_PAYMENT, [], "expire_quote"),
    "payment recorded, not sent": (S.PAYMENT_PENDING, [PENDING], None),
    "payment being sent": (S.PAYMENT_PENDING, [DISPATCHING], None),
    "payment awaiting provider": (S.PAYMENT_PENDING, [AWAITING_PROVIDER], None),
    "awaiting buyer": (S.ACTION_REQUIRED, [AWAITING_BUYER], None),
    "unknown": (S.PAYMENT_UNKNOWN, [UNKNOWN], None),
    "unknown, escalated": (S.PAYMENT_UNKNOWN, [ESCALATED], None),
    "unknown, no payment recorded": (S.PAYMENT_UNKNOWN, [], None),
    "succeeded, fulfilling": (S.PAID, [SUCCEEDED], None),
    "completed": (S.COMPLETED, [SUCCEEDED], None),
    "declined": (S.PAYMENT_FAILED, [FAILED], None),
    "failed at the provider": (S.PAYMENT_FAILED, [PROVIDER_FAILED], None),
    "failed as invalid": (S.PAYMENT_FAILED, [INVALID], None),
    "failed by our team": (S.PAYMENT_FAILED, [BY_TEAM_FAILED], None),
    "failed, quote expired": (S.PAYMENT_FAILED, [FAILED], "expire_quote"),
    "failed, attempts exhausted": (S.PAYMENT_FAILED, [FAILED, FAILED, FAILED], "chain"),
    "failed and retried": (S.PAYMENT_PENDING, [FAILED, AWAITING_PROVIDER], "chain"),
    "refund waiting for approval": (
        S.COMPLETED,
        [SUCCEEDED, _refund(Outcome.AWAITING_APPROVAL)],
        "parent",
    ),
    "refund pending": (
        S.REFUND_PENDING,
        [
            SUCCEEDED,
            _refund(
                Outcome.AWAITING_PROVIDER,
                provider_reference="re_test_processing",
                verification=Verification.PROVIDER,
            ),
        ],
        "parent",
    ),
    "refunded": (
        S.REFUNDED,
        [
            SUCCEEDED,
            _refund(
                Outcome.SUCCEEDED,
                amount=1500,
                provider_reference="re_test_ok",
                verification=Verification.PROVIDER,
                grade=Grade.CONFIRMED,
            ),
        ],
        "parent",
    ),
    "manual review": (S.MANUAL_REVIEW, [SUCCEEDED], None),
    "disputed": (S.DISPUTED, [SUCCEEDED], None),
    "dispute won": (S.DISPUTE_WON, [SUCCEEDED], None),
    "dispute lost": (S.DISPUTE_LOST, [SUCCEEDED], None),
    "cancelled": (S.CANCELLED, [], None),
    "expired": (S.EXPIRED, [], None),
    "x402 transfer sent, unconfirmed": (S.PAYMENT_PENDING, [X402_SENT], None),
    "x402 transfer unknown": (S.PAYMENT_UNKNOWN, [X402_UNKNOWN], None),
}

# Tools an agent may be pointed at when no money may move on its say-so.
_FOLLOW = {"get_purchase", "get_operation", "reconcile_operation", None}
_PAY = {"pay_purchase", "retry_failed_payment"}


def _build(name: str, client):
    status, ops, extra = STATES[name]
    purchase = purchase_in(status, ops=ops, api_client=client)
    made = list(purchase.operations.order_by("created_at", "id"))
    if extra == "expire_quote":
        purchase.quote.expires_at = timezone.now() - timedelta(minutes=1)
        purchase.quote.save(update_fields=["expires_at"])
    if extra == "chain":  # each payment after the first retries the one before
        for before, after in zip(made, made[1:], strict=False):
            after.retry_of = before
            after.save(update_fields=["retry_of"])
    if extra == "parent":
        for op in made[1:]:
            op.parent = made[0]
            op.save(update_fields=["parent"])
    return purchase


def _open_operation(purchase) -> PaymentOperation | None:
    return (
        purchase.operations.exclude(outcome__in=[Outcome.SUCCEEDED, Outcome.FAILED])
        .order_by("created_at", "id")
        .first()
    )


def _console_owner(html: str) -> str:
    owner = re.search(r"<strong>Owner: ([^<]+)</strong>", html).group(1).strip()
    return {"finance": "support"}.get(owner, owner)  # finance: the role that approves


@pytest.fixture
def setting_storefront(settings):
    settings.STOREFRONT_CHECKOUT_URL = "http://127.0.0.1:8000/demo-checkout/{purchase_id}"


@pytest.mark.parametrize("name", list(STATES))
def test_every_surface_agrees_on_the_next_action(name, login, setting_storefront):
    client, key = make_client()
    purchase = _build(name, client)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")

    rest = api.get(f"/api/v1/purchases/{purchase.pk}").json()["next_action"]
    mcp = tools.get_purchase(api_client=client, purchase_id=purchase.pk)
    console = login("support").get(reverse("support:purchase", args=[purchase.pk]))
    customer = customer_state(purchase)

    # MCP: the same document, renamed to tools, and a next tool that obeys its retry advice.
    assert {k: mcp.purchase["next_action"][k] for k in ("owner", "retry", "code")} == {
        k: rest[k] for k in ("owner", "retry", "code")
    }
    tool = mcp.next_tool.name if mcp.next_tool else None
    if rest["retry"] == "new_quote":
        assert tool == "get_quote", (rest, mcp.instruction)
    elif rest["retry"] == "new_operation":
        assert tool in _PAY, (rest, mcp.instruction)
    elif rest["code"] == "operation_pending":
        assert tool in _PAY | _FOLLOW  # calling the creator again sends that same payment
    else:
        assert tool in _FOLLOW, (rest, mcp.instruction)
        assert "you may call retry_failed_payment" not in mcp.instruction

    # Console: the owner of the open operation it shows first, else the purchase's.
    assert console.status_code == 200
    open_op = _open_operation(purchase)
    expected = (
        api.get(f"/api/v1/operations/{open_op.pk}").json()["next_action"]["owner"]
        if open_op is not None
        else rest["owner"]
    )
    assert _console_owner(console.content.decode()) == expected, name

    # Customer page: "Pay again" exactly when the buyer may start another payment.
    buyer_may_pay_again = (status_failed := purchase.status == S.PAYMENT_FAILED) and (
        rest["owner"],
        rest["retry"],
    ) == ("buyer", "new_operation")
    assert customer.can_pay_again == buyer_may_pay_again, (name, rest, customer.code)
    if status_failed and not buyer_may_pay_again:
        assert "You may try again" not in customer.message


@pytest.mark.parametrize("name", [n for n, (_, ops, _) in STATES.items() if ops])
def test_operation_views_agree(name):
    client, key = make_client()
    purchase = _build(name, client)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")

    for op in purchase.operations.all():
        rest = api.get(f"/api/v1/operations/{op.pk}").json()["next_action"]
        mcp = tools.get_operation(api_client=client, operation_id=op.pk)
        assert {k: mcp.operation["next_action"][k] for k in ("owner", "retry", "code")} == {
            k: rest[k] for k in ("owner", "retry", "code")
        }
        if rest["retry"] == "forbidden" and rest["code"] != "operation_pending":
            tool = mcp.next_tool.name if mcp.next_tool else None
            assert tool in _FOLLOW, (name, op.kind, rest, mcp.instruction)
