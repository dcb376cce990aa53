"""The refundable room is net of chargebacks: the bank already gave the buyer the money
back (a dispute lost), or holds it (a chargeback open: the provider's dispute says
`is_charge_refundable` false), so a refund on top would return it twice. localstripe, like
any fake, accepts such a refund; Verity must count what the bank took back
(payments.services.common.payment_refund_room). Judged on localstripe's refunds and
disputes and on Verity's rows."""

import pytest
import requests
from django.conf import settings

from payments.enums import PurchaseStatus
from payments.models import Purchase
from recovery.halts import halt_set
from tests.outbox import settle
from tests.recovery.halt_fence import lift_halt_quietly
from tests.recovery.test_goods_follow_the_money import (  # noqa: F401  (fixtures)
    PRICE,
    _buy,
    _charge,
    _dispute,
    _event,
    _live_orders,
    _move,
    _refunded_at_provider,
    webhook_secrets,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _withdrawn_by_bank(dispute_id: str) -> int:
    r = requests.get(
        f"{settings.STRIPE_API_BASE}/v1/disputes/{dispute_id}",
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    r.raise_for_status()
    d = r.json()
    return -sum(t["amount"] for t in d.get("balance_transactions", []) if t["amount"] < 0)


def _refund_rest(auto_refund_shop, purchase_id):
    return auto_refund_shop.post(f"purchases/{purchase_id}/refunds", {}).status_code


def _refund_mcp(auto_refund_shop, purchase_id):
    from agents import tools

    result = tools.request_refund(api_client=auto_refund_shop.client, purchase_id=purchase_id)
    return result.refusal.code if result.refusal else "accepted"


@pytest.mark.parametrize("face", [_refund_rest, _refund_mcp], ids=["rest", "mcp"])
def test_a_refund_after_a_lost_chargeback_returns_nothing_more(client, auto_refund_shop, face):
    # given a paid purchase whose chargeback the merchant lost (the bank took 2000 back)
    purchase_id, _ = _buy(auto_refund_shop)
    settle()
    dispute = _dispute(_charge(purchase_id))
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "lost")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    assert Purchase.objects.get(pk=purchase_id).status == PurchaseStatus.DISPUTE_LOST
    withdrawn = _withdrawn_by_bank(dispute)
    # when the storefront then asks a full refund (REST, or the MCP tool)
    answer = face(auto_refund_shop, purchase_id)
    settle()
    # then the buyer gets back at most what was paid, counted at the provider
    back = withdrawn + _refunded_at_provider(purchase_id)
    assert back <= PRICE, (
        f"refund answered {answer}; bank withdrew {withdrawn}, localstripe refunded "
        f"{_refunded_at_provider(purchase_id)}: {back} back for {PRICE} paid"
    )


def test_a_refund_during_an_open_chargeback_then_lost_returns_it_once(client, auto_refund_shop):
    # given a paid purchase with an open chargeback (needs_response)
    purchase_id, _ = _buy(auto_refund_shop)
    settle()
    dispute = _dispute(_charge(purchase_id))
    _event(client, dispute, "charge.dispute.created")
    settle()
    assert Purchase.objects.get(pk=purchase_id).status == PurchaseStatus.DISPUTED
    # when the storefront refunds in full meanwhile, and the chargeback is then lost
    r = auto_refund_shop.post(f"purchases/{purchase_id}/refunds", {})
    settle()
    status_while_open = Purchase.objects.get(pk=purchase_id).status
    _move(dispute, "lost")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    back = _withdrawn_by_bank(dispute) + _refunded_at_provider(purchase_id)
    assert back <= PRICE, (
        f"refund answered {r.status_code}, purchase said {status_while_open!r} while the "
        f"chargeback was open; {back} back to the buyer for {PRICE} paid"
    )


def test_a_partial_refund_during_an_open_chargeback_keeps_it_disputed(client, auto_refund_shop):
    purchase_id, _ = _buy(auto_refund_shop)
    settle()
    dispute = _dispute(_charge(purchase_id), inquiry=True)
    _event(client, dispute, "charge.dispute.created")
    settle()
    r = auto_refund_shop.post(f"purchases/{purchase_id}/refunds", {"amount": 500})
    settle()
    # the dispute is still open: the purchase says so on every face (docs/reliability.md)
    assert Purchase.objects.get(pk=purchase_id).status == PurchaseStatus.DISPUTED, r.content
    assert (
        auto_refund_shop.get(f"purchases/{purchase_id}").json()["status"] == PurchaseStatus.DISPUTED
    )


def test_a_full_refund_during_an_inquiry_says_disputed_until_it_closes(client, auto_refund_shop):
    purchase_id, _ = _buy(auto_refund_shop)
    settle()
    inquiry = _dispute(_charge(purchase_id), inquiry=True)
    _event(client, inquiry, "charge.dispute.created")
    settle()
    auto_refund_shop.post(f"purchases/{purchase_id}/refunds", {})
    settle()
    assert _refunded_at_provider(purchase_id) == PRICE
    body = auto_refund_shop.get(f"purchases/{purchase_id}").json()
    assert _live_orders(purchase_id) == 0, "money back during the inquiry, order still live"
    assert body["status"] in (PurchaseStatus.DISPUTED, PurchaseStatus.REFUNDED)


def test_a_lost_chargeback_mid_fulfilment_cancels_the_order_and_runs_no_more_steps(
    client, auto_refund_shop
):
    from django.db import transaction

    from payments.models import Product
    from recovery.models import EmailMessage, InventoryCommit
    from recovery.outbox import run_steps_put

    halt_set(name="step:inventory", reason="fence: fulfilment mid-way", actor="test")
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    assert _live_orders(purchase_id) == 1
    dispute = _dispute(_charge(purchase_id))
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "lost")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    lift_halt_quietly("step:inventory")
    with transaction.atomic():
        run_steps_put(purchase_id=purchase_id)
    settle()
    assert _live_orders(purchase_id) == 0
    assert Product.objects.get(sku=sku).stock == 10
    assert not InventoryCommit.objects.filter(
        purchase_id=purchase_id, released_at__isnull=True
    ).exists()
    assert EmailMessage.objects.filter(purchase_id=purchase_id, kind="confirmation").count() == 0
    assert Purchase.objects.get(pk=purchase_id).status == PurchaseStatus.DISPUTE_LOST


def test_a_refund_approved_after_the_chargeback_was_lost_is_refused(
    client, auto_refund_shop, django_user_model
):
    from payments import services

    requester = django_user_model.objects.create(username="support-1")
    approver = django_user_model.objects.create(username="finance-1")
    # given a refund a person asked before the chargeback, waiting for finance
    purchase_id, _ = _buy(auto_refund_shop)
    settle()
    refund = services.refund_request(purchase_id=purchase_id, amount=PRICE, acting_user=requester)
    dispute = _dispute(_charge(purchase_id))
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "lost")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    # when finance approves it (the approval re-checks the refundable room under the lock)
    try:
        services.refund_approve(
            operation_id=refund.id, acting_user=approver, reason="buyer asked before the chargeback"
        )
        answer = "approved"
        services.operation_dispatch(operation_id=refund.id)  # as the console sends it
    except services.DomainError as exc:
        answer = exc.code
    settle()
    back = _withdrawn_by_bank(dispute) + _refunded_at_provider(purchase_id)
    assert back <= PRICE, f"approval {answer}: {back} back to the buyer for {PRICE} paid"
