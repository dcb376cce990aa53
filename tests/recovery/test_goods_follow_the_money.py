"""Goods follow the money (docs/reliability.md#rules-every-money-movement-obeys): a purchase
whose money went back (refunded in full, voided, a dispute lost) has no live order, serves
no deliverable and runs no step that would make one; closing a dispute restores nothing the
money no longer supports.

Driven from where a storefront and the card network stand: the public REST API with a
storefront key allowed automatic refunds, and localstripe's dispute resource (inquiries
included) whose signed `charge.dispute.*` events reach the webhook. Effects are counted at
localstripe and in the database (orders, stock, e-mails, step runs)."""

import pytest
import requests
from django.conf import settings
from django.db import transaction

from payments.enums import PurchaseStatus
from payments.models import Product, Purchase
from recovery.halts import halt_set
from recovery.models import EmailMessage, InventoryCommit, Order, StepRun
from recovery.outbox import run_steps_put
from tests.api.client import Api
from tests.factories import ProductFactory
from tests.localstripe import provider_object
from tests.outbox import settle
from tests.recovery.halt_fence import lift_halt_quietly
from tests.webhooks.events import SECRET, deliver_and_process, event_for

pytestmark = pytest.mark.django_db(transaction=True)

PRICE = 2000


@pytest.fixture(autouse=True)
def webhook_secrets(settings):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_WEBHOOK_TOLERANCE = 300
    settings.STRIPE_ACCOUNT = ""


def _buy(auto_refund_shop: Api, *, kind: str = "physical", stock: int = 10) -> tuple[str, str]:
    product = ProductFactory(price=PRICE, stock=stock, kind=kind)
    purchase = auto_refund_shop.new_purchase(product.sku)
    r = auto_refund_shop.pay(purchase["id"])
    assert r.status_code == 201, r.content
    return purchase["id"], product.sku


def _refund(auto_refund_shop: Api, purchase_id: str, amount: int | None = None) -> dict:
    r = auto_refund_shop.post(
        f"purchases/{purchase_id}/refunds", {} if amount is None else {"amount": amount}
    )
    assert r.status_code in (201, 202), r.content
    return r.json()


def _charge(purchase_id: str) -> str:
    from payments.models import PaymentOperation

    return PaymentOperation.objects.get(purchase_id=purchase_id, kind="charge").provider_charge


def _dispute(charge: str, *, inquiry: bool = False) -> str:
    data = {"charge": charge, "reason": "fraudulent"}
    if inquiry:
        data["inquiry"] = "true"
    r = requests.post(f"{settings.STRIPE_API_BASE}/_config/disputes", data=data, timeout=10)
    r.raise_for_status()
    return r.json()["id"]


def _move(dispute_id: str, status: str) -> None:
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/_config/disputes/{dispute_id}",
        data={"status": status},
        timeout=10,
    )
    r.raise_for_status()


def _event(client, dispute_id: str, type_: str) -> None:
    deliver_and_process(client, event_for(provider_object("disputes", dispute_id), type_))


def _live_orders(purchase_id: str) -> int:
    return Order.objects.filter(purchase_id=purchase_id, cancelled_at__isnull=True).count()


def _confirmations(purchase_id: str) -> int:
    return EmailMessage.objects.filter(purchase_id=purchase_id, kind="confirmation").count()


def _provider_refunds(purchase_id: str) -> list[dict]:
    from payments.models import PaymentOperation

    pi = PaymentOperation.objects.get(purchase_id=purchase_id, kind="charge").provider_reference
    r = requests.get(
        f"{settings.STRIPE_API_BASE}/v1/refunds",
        params={"payment_intent": pi},
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=10,
    )
    return r.json()["data"]


def _refunded_at_provider(purchase_id: str) -> int:
    return sum(x["amount"] for x in _provider_refunds(purchase_id) if x["status"] == "succeeded")


def _faces_agree(client, auto_refund_shop: Api, purchase_id: str, status: str) -> None:
    """The record, the REST purchase view and the customer page say the same thing."""
    from payments.customer_copy import StateCode, customer_state

    purchase = Purchase.objects.get(pk=purchase_id)
    assert purchase.status == status
    body = auto_refund_shop.get(f"purchases/{purchase_id}").json()
    assert body["status"] == status
    state = customer_state(purchase)
    page = client.get(f"/status/{purchase.status_token}/").content.decode()
    assert state.headline in page
    if status == PurchaseStatus.REFUNDED:
        assert body["refunds"]["refunded"] == PRICE
        assert state.code == StateCode.REVERSED and state.order_reference is None
    elif status == PurchaseStatus.COMPLETED:
        # complete, or complete with part of the payment refunded
        partly = body["refunds"]["refunded"] > 0
        assert state.code == (StateCode.REVERSED if partly else StateCode.COMPLETE)


def test_a_full_refund_mid_fulfilment_cancels_the_order_and_releases_the_stock(
    client, auto_refund_shop
):
    # given a paid purchase whose fulfilment stopped after the order (the stock step halted)
    halt_set(name="step:inventory", reason="fence: fulfilment mid-way", actor="test")
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    assert _live_orders(purchase_id) == 1
    # when the storefront refunds it in full through the public API, and the halt lifts
    _refund(auto_refund_shop, purchase_id)
    settle()
    lift_halt_quietly("step:inventory")
    with transaction.atomic():
        run_steps_put(purchase_id=purchase_id)  # what clearing the halt would kick
    settle()
    # then the money went back, and so did the goods: no live order, no stock taken,
    # no confirmation, the customer told once
    assert _refunded_at_provider(purchase_id) == PRICE
    assert _live_orders(purchase_id) == 0
    assert Product.objects.get(sku=sku).stock == 10
    assert not InventoryCommit.objects.filter(
        purchase_id=purchase_id, released_at__isnull=True
    ).exists()
    assert _confirmations(purchase_id) == 0
    assert EmailMessage.objects.filter(purchase_id=purchase_id, kind="cancellation").count() == 1
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)


def test_a_full_refund_after_fulfilment_unwinds_order_and_stock(client, auto_refund_shop):
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    assert Product.objects.get(sku=sku).stock == 9 and _live_orders(purchase_id) == 1
    _refund(auto_refund_shop, purchase_id)
    settle()
    assert _refunded_at_provider(purchase_id) == PRICE
    assert _live_orders(purchase_id) == 0
    assert Product.objects.get(sku=sku).stock == 10
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)


def test_a_partial_refund_keeps_the_order(auto_refund_shop):
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    _refund(auto_refund_shop, purchase_id, amount=500)
    settle()
    assert _live_orders(purchase_id) == 1
    assert Product.objects.get(sku=sku).stock == 9


def test_a_refunded_purchase_serves_no_deliverable(auto_refund_shop):
    # given a digital good delivered (a licence key served for the redelivery period)
    purchase_id, _ = _buy(auto_refund_shop, kind="digital")
    settle()
    assert auto_refund_shop.get(f"purchases/{purchase_id}/deliverable").status_code == 200
    # when it is refunded in full
    _refund(auto_refund_shop, purchase_id)
    settle()
    # then the licence key is no longer served
    assert _refunded_at_provider(purchase_id) == PRICE
    r = auto_refund_shop.get(f"purchases/{purchase_id}/deliverable")
    assert r.status_code == 404, r.content
    assert "licence_key" not in r.content.decode()


def test_a_lost_dispute_serves_no_deliverable(client, auto_refund_shop):
    purchase_id, _ = _buy(auto_refund_shop, kind="digital")
    settle()
    assert auto_refund_shop.get(f"purchases/{purchase_id}/deliverable").status_code == 200
    dispute = _dispute(_charge(purchase_id))
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "lost")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    assert Purchase.objects.get(pk=purchase_id).status == PurchaseStatus.DISPUTE_LOST
    assert auto_refund_shop.get(f"purchases/{purchase_id}/deliverable").status_code == 404


def test_an_inquiry_answered_with_a_full_refund_closes_without_fulfilling(client, auto_refund_shop):
    # given a charge whose steps have not run when the bank's inquiry opens
    halt_set(name="step:order", reason="fence: before fulfilment", actor="test")
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    inquiry = _dispute(_charge(purchase_id), inquiry=True)
    _event(client, inquiry, "charge.dispute.created")
    lift_halt_quietly("step:order")
    settle()
    assert Purchase.objects.get(pk=purchase_id).status == PurchaseStatus.DISPUTED
    # when the merchant answers it with a full refund, and the inquiry closes
    _refund(auto_refund_shop, purchase_id)
    settle()
    _move(inquiry, "warning_closed")
    _event(client, inquiry, "charge.dispute.closed")
    settle()
    # then the money stays back: no order, no stock taken, no "confirmed" e-mail
    assert _refunded_at_provider(purchase_id) == PRICE
    assert Order.objects.filter(purchase_id=purchase_id).count() == 0
    assert Product.objects.get(sku=sku).stock == 10
    assert _confirmations(purchase_id) == 0
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)


def test_a_refunded_charge_disputed_and_won_is_not_fulfilled(client, auto_refund_shop):
    halt_set(name="step:order", reason="fence: before fulfilment", actor="test")
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    _refund(auto_refund_shop, purchase_id)
    settle()
    lift_halt_quietly("step:order")
    dispute = _dispute(_charge(purchase_id))
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "won")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    assert Order.objects.filter(purchase_id=purchase_id).count() == 0
    assert Product.objects.get(sku=sku).stock == 10
    assert _confirmations(purchase_id) == 0
    assert not StepRun.objects.filter(purchase_id=purchase_id, state="done").exists()
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)


def test_an_inquiry_withdrawn_without_a_refund_resumes_fulfilment(client, auto_refund_shop):
    halt_set(name="step:order", reason="fence: before fulfilment", actor="test")
    purchase_id, _ = _buy(auto_refund_shop)
    settle()
    inquiry = _dispute(_charge(purchase_id), inquiry=True)
    _event(client, inquiry, "charge.dispute.created")
    lift_halt_quietly("step:order")
    _move(inquiry, "warning_closed")
    _event(client, inquiry, "charge.dispute.closed")
    settle()
    assert _live_orders(purchase_id) == 1 and _confirmations(purchase_id) == 1
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.COMPLETED)


def test_an_inquiry_during_a_pending_partial_refund_does_not_strand_the_purchase(
    client, auto_refund_shop
):
    from payments import services
    from payments.enums import Outcome, Rail
    from payments.models import PaymentOperation
    from payments.providers.stripe import DrillMode
    from payments.services import provider_for_rail

    # given a paid purchase whose partial refund the provider accepted as `pending`
    halt_set(name="step:order", reason="fence: before fulfilment", actor="test")
    purchase_id, _ = _buy(auto_refund_shop)
    settle()
    stripe = provider_for_rail(Rail.STRIPE)
    stripe.arm_drill(
        key_prefix="*", step="refund", mode=DrillMode.DROP_RESPONSE_AFTER_SEND, times=1
    )
    try:
        _refund(auto_refund_shop, purchase_id, amount=500)
        settle()
    finally:
        stripe.drill_client.disarm_all()
    refund = PaymentOperation.objects.get(purchase_id=purchase_id, kind="refund")
    assert refund.outcome == Outcome.UNKNOWN  # its answer was lost
    [real] = _provider_refunds(purchase_id)
    real = {**real, "status": "pending"}
    deliver_and_process(client, event_for(real, "refund.updated"))
    assert Purchase.objects.get(pk=purchase_id).status == PurchaseStatus.REFUND_PENDING
    # when an inquiry opens, the refund settles, and the inquiry closes
    inquiry = _dispute(_charge(purchase_id), inquiry=True)
    _event(client, inquiry, "charge.dispute.created")
    services.operation_reconcile(operation_id=refund.id)
    assert PaymentOperation.objects.get(id=refund.id).outcome == Outcome.SUCCEEDED
    lift_halt_quietly("step:order")
    _move(inquiry, "warning_closed")
    _event(client, inquiry, "charge.dispute.closed")
    settle()
    # then the purchase is fulfilled for what it kept, not `refund_pending` for ever
    assert _refunded_at_provider(purchase_id) == 500
    assert _live_orders(purchase_id) == 1 and _confirmations(purchase_id) == 1
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.COMPLETED)


def test_a_dispute_won_after_another_was_lost_keeps_the_purchase_lost(client, auto_refund_shop):
    # given a charge whose dispute was lost (the money went back to the buyer)
    purchase_id, _ = _buy(auto_refund_shop)
    settle()
    first = _dispute(_charge(purchase_id))
    _event(client, first, "charge.dispute.created")
    _move(first, "lost")
    _event(client, first, "charge.dispute.closed")
    # when a second dispute of the same charge is won
    second = _dispute(_charge(purchase_id))
    _event(client, second, "charge.dispute.created")
    _move(second, "won")
    _event(client, second, "charge.dispute.closed")
    settle()
    # then the purchase still says the money went back by the dispute, never "refunded"
    assert _refunded_at_provider(purchase_id) == 0
    assert _live_orders(purchase_id) == 0
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.DISPUTE_LOST)


def test_a_cancellation_email_refused_by_the_mail_server_is_sent_again(
    client, auto_refund_shop, settings
):
    """The customer is told through the outbox, as other e-mails are retried: a mail
    server that refused the connection (nothing sent) is tried again, and the buyer gets
    exactly one cancellation."""
    from django.core import mail
    from django.utils import timezone

    from recovery.models import OutboxMessage
    from tests.stack import free_port

    purchase_id, _ = _buy(auto_refund_shop, stock=10)
    settle()
    assert _live_orders(purchase_id) == 1
    # when the mail server is down (nothing listens: refused before any data) ...
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", free_port()
    _refund(auto_refund_shop, purchase_id)
    settle()
    assert _refunded_at_provider(purchase_id) == PRICE and _live_orders(purchase_id) == 0
    told = EmailMessage.objects.get(purchase_id=purchase_id, kind="cancellation")
    assert told.sent_at is None
    # ... and back once the outbox's retry comes due
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    mail.outbox.clear()
    OutboxMessage.objects.filter(processed_at__isnull=True).update(available_at=timezone.now())
    settle()
    told.refresh_from_db()
    assert told.sent_at is not None
    assert [m.subject for m in mail.outbox] == [told.subject]
    settle()
    assert len(mail.outbox) == 1  # told once


def test_a_refund_awaiting_approval_when_the_dispute_is_lost_is_never_paid_on_top(
    client, auto_refund_shop, django_user_model
):
    """Support asked for a partial refund (finance must approve); the bank then took the
    whole payment back (a chargeback, lost). Approving that refund would pay the buyer
    back a second time, so it is superseded (declined, audited), not left in finance's
    queue, and nothing more is refundable."""
    from django.contrib.auth.models import Group

    from payments import services
    from payments.models import PaymentOperation
    from support.access import Role
    from support.selectors import refundable_amount

    purchase_id, _ = _buy(auto_refund_shop)
    settle()
    people = {}
    for name, role in (("asker", Role.SUPPORT), ("approver", Role.FINANCE)):
        people[name] = django_user_model.objects.create(username=name)
        people[name].groups.add(Group.objects.get_or_create(name=role.value)[0])
    refund = services.refund_request(
        purchase_id=purchase_id, amount=500, acting_user=people["asker"]
    )
    assert refund.outcome == "awaiting_approval"
    dispute = _dispute(_charge(purchase_id))
    _event(client, dispute, "charge.dispute.created")
    _move(dispute, "lost")
    _event(client, dispute, "charge.dispute.closed")
    settle()
    assert Purchase.objects.get(pk=purchase_id).status == PurchaseStatus.DISPUTE_LOST

    refund = PaymentOperation.objects.get(pk=refund.pk)
    assert (refund.outcome, refund.reason) == ("failed", "refund_declined")
    with pytest.raises(services.DomainError) as refused:
        services.refund_approve(operation_id=refund.id, acting_user=people["approver"], reason="ok")
    assert refused.value.code == "not_awaiting_approval"
    assert refundable_amount(Purchase.objects.get(pk=purchase_id)) == 0
    settle()
    assert _provider_refunds(purchase_id) == []  # the bank's return only


def test_a_full_refund_heard_of_only_as_pending_keeps_the_goods_until_it_succeeds(
    client, auto_refund_shop
):
    """The lifecycle machine's seed 3955478403192537988678844369410925590: a full refund
    whose answer was a 500 (made at the provider, `unknown` here), then its `pending`
    state delivered late and twice. Verity has not been told the money went back: the
    goods stay (purchase `refund_pending`) until the provider's word that it succeeded."""
    from payments.enums import Outcome, Rail
    from payments.models import PaymentOperation
    from payments.providers.stripe import DrillMode
    from payments.services import provider_for_rail

    # given a fulfilled purchase refunded in full, the provider's answer a 500
    purchase_id, sku = _buy(auto_refund_shop, stock=10)
    settle()
    assert _live_orders(purchase_id) == 1
    stripe = provider_for_rail(Rail.STRIPE)
    stripe.arm_drill(key_prefix="*", step="refund", mode=DrillMode.HTTP_500, times=1)
    try:
        _refund(auto_refund_shop, purchase_id)
        settle()
    finally:
        stripe.drill_client.disarm_all()
    refund = PaymentOperation.objects.get(purchase_id=purchase_id, kind="refund")
    assert refund.outcome == Outcome.UNKNOWN
    [real] = _provider_refunds(purchase_id)
    assert real["status"] == "succeeded"  # localstripe makes its refunds succeeded at once
    # when its earlier `pending` state arrives, twice
    pending = event_for({**real, "status": "pending"}, "refund.updated")
    deliver_and_process(client, pending)
    deliver_and_process(client, {**pending, "id": pending["id"] + "x"})
    settle()
    # then the refund is in flight and the goods stay
    assert PaymentOperation.objects.get(id=refund.id).outcome == Outcome.AWAITING_PROVIDER
    assert Purchase.objects.get(pk=purchase_id).status == PurchaseStatus.REFUND_PENDING
    assert _live_orders(purchase_id) == 1 and Product.objects.get(sku=sku).stock == 9
    # and when the provider says it succeeded, the goods follow the money
    deliver_and_process(client, event_for(real, "refund.updated"))
    settle()
    assert PaymentOperation.objects.get(id=refund.id).outcome == Outcome.SUCCEEDED
    assert _live_orders(purchase_id) == 0 and Product.objects.get(sku=sku).stock == 10
    _faces_agree(client, auto_refund_shop, purchase_id, PurchaseStatus.REFUNDED)
