"""A person's word, then the provider's record says otherwise: what the word freed must come
back. (1) A duplicate's return a person called "succeeded" releases the duplicate's hold;
the read-back finds no refund at localstripe: the duplicate's money is still with the
merchant, so its hold counts as consumed again (the walkthrough's rule: allowance comes
back only for a duplicate returned in full). (2) A full refund a person called
"succeeded" unwinds the goods; the read-back finds no refund: money kept, goods gone, and
the purchase must not keep saying `refunded` on any face. Counted at localstripe and in
the database; faults only through the fault-drill HTTP client."""

import pytest

from payments import services
from payments.enums import Grade, HoldState, Outcome, PurchaseStatus, Rail
from payments.models import Hold, PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail
from recovery.models import EmailMessage, Order
from recovery.relay import relay_drain
from tests.outbox import settle
from tests.payments.test_provider_outranks_people import _charged_twice

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_duplicates_return_overturned_to_failed_counts_its_hold_again(
    new_purchase, api_client, drill, read_drill, resolver, localstripe, settings, django_user_model
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    person = django_user_model.objects.create(username="resolver-dup")
    purchase, first, retry = _charged_twice(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )
    services.operation_reconcile(operation_id=first.id)
    first = PaymentOperation.objects.get(pk=first.pk)
    assert first.is_duplicate
    [comp] = PaymentOperation.objects.filter(parent=first, kind="refund")
    drill(comp, DrillMode.HTTP_409, step="refund")  # refused before the provider: nothing
    comp = services.operation_dispatch(operation_id=comp.id)
    assert comp.outcome == Outcome.UNKNOWN
    read_drill("*", times=10)
    # a person says the duplicate's return arrived (provider unreadable): hold released
    comp = services.operation_resolve_manual(
        operation_id=comp.id,
        outcome="succeeded",
        reason="buyer's bank shows the return",
        actor="resolver-dup",
        acting_user=person,
    )
    assert (comp.outcome, comp.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    assert Hold.objects.get(operation=first).state == HoldState.RELEASED
    # the provider's record: no refund of the duplicate was ever made
    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    with settings_halt_refunds():
        services.operation_reconcile(operation_id=comp.id)
        assert PaymentOperation.objects.get(pk=comp.pk).outcome == Outcome.FAILED
        relay_drain()
        assert localstripe.refunds_for(first.provider_reference) == []
        # the merchant holds both charges: both count against the client's allowance
        assert services.client_limits(api_client)["consumed"] == first.amount + retry.amount, (
            f"hold of the unreturned duplicate: {Hold.objects.get(operation=first).state}"
        )


class settings_halt_refunds:
    """The refunds workflow halted, so the new return waits (the window in which the
    allowance is judged); lifted quietly afterwards."""

    def __enter__(self):
        from recovery.halts import halt_set

        halt_set(name="refunds", reason="fence: the window", actor="test")

    def __exit__(self, *exc):
        from tests.recovery.halt_fence import lift_halt_quietly

        lift_halt_quietly("refunds")


def test_a_full_refund_overturned_to_failed_does_not_stay_refunded(
    new_purchase, api_client, drill, read_drill, localstripe, settings, django_user_model
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    resolver_, requester, approver = (
        django_user_model.objects.create(username=n)
        for n in ("resolver-2", "support-2", "finance-2")
    )
    purchase = new_purchase(price=1500)
    pay = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    pay = services.operation_dispatch(operation_id=pay.id)
    settle()
    assert Order.objects.filter(purchase_id=purchase.id, cancelled_at__isnull=True).count() == 1
    refund = services.refund_request(purchase_id=purchase.id, amount=1500, acting_user=requester)
    refund = services.refund_approve(operation_id=refund.id, acting_user=approver, reason="r")
    drill(refund, DrillMode.HTTP_409, step="refund")
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.UNKNOWN
    read_drill("*", times=10)
    services.operation_resolve_manual(
        operation_id=refund.id,
        outcome="succeeded",
        reason="buyer says it arrived",
        actor="resolver-2",
        acting_user=resolver_,
    )
    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    settle()
    # refunded is shown only once the provider confirms it: until then, in progress
    assert Purchase.objects.get(pk=purchase.id).status == PurchaseStatus.REFUND_PENDING
    services.operation_reconcile(operation_id=refund.id)
    settle()
    assert localstripe.refunds_for(pay.provider_reference) == []
    status = Purchase.objects.get(pk=purchase.id).status
    live = Order.objects.filter(purchase_id=purchase.id, cancelled_at__isnull=True).count()
    assert status != PurchaseStatus.REFUNDED
    # money kept: either the goods are live again, or a person owns the purchase
    assert live == 1 or status == PurchaseStatus.MANUAL_REVIEW, (status, live)


def test_refunded_is_not_shown_on_a_persons_word_alone(
    client, new_purchase, api_client, drill, read_drill, localstripe, settings, django_user_model
):
    """docs/reliability.md: "Refunded and voided are shown only after the provider confirms
    them." A person's "succeeded" on a full refund, taken while the provider cannot be read
    (grade acknowledged): no face may say refunded yet."""
    from payments.api import presenters
    from payments.customer_copy import customer_state

    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    resolver_, requester, approver = (
        django_user_model.objects.create(username=n)
        for n in ("resolver-3", "support-3", "finance-3")
    )
    purchase = new_purchase(price=1500)
    pay = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    services.operation_dispatch(operation_id=pay.id)
    settle()
    refund = services.refund_request(purchase_id=purchase.id, amount=1500, acting_user=requester)
    refund = services.refund_approve(operation_id=refund.id, acting_user=approver, reason="r")
    drill(refund, DrillMode.HTTP_409, step="refund")
    services.operation_dispatch(operation_id=refund.id)
    read_drill("*", times=10)
    services.operation_resolve_manual(
        operation_id=refund.id,
        outcome="succeeded",
        reason="buyer says it arrived",
        actor="resolver-3",
        acting_user=resolver_,
    )
    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    settle()
    p = Purchase.objects.get(pk=purchase.id)
    view = presenters.purchase_view(p)
    state = customer_state(p)
    assert localstripe.refunds_for(pay.provider_reference) == []  # nothing at the provider
    assert view["status"] != PurchaseStatus.REFUNDED, (
        f"shown {view['status']!r} on a person's word; customer page {state.code!r} "
        f"{state.headline!r}; live orders "
        f"{Order.objects.filter(purchase_id=p.id, cancelled_at__isnull=True).count()}; "
        "e-mails "
        f"{list(EmailMessage.objects.filter(purchase_id=p.id).values_list('kind', flat=True))}"
    )


def test_refunded_is_shown_once_the_provider_confirms_a_persons_word(
    new_purchase, api_client, drill, read_drill, localstripe, settings, django_user_model
):
    """The refund did reach the provider (its answer was lost, the provider unreadable): a
    person's "succeeded" says refund in progress; the read-back that confirms it says
    refunded."""
    from payments.api import presenters

    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    resolver_, requester, approver = (
        django_user_model.objects.create(username=n)
        for n in ("resolver-4", "support-4", "finance-4")
    )
    purchase = new_purchase(price=1500)
    pay = services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    services.operation_dispatch(operation_id=pay.id)
    pay = PaymentOperation.objects.get(pk=pay.pk)
    settle()
    refund = services.refund_request(purchase_id=purchase.id, amount=1500, acting_user=requester)
    refund = services.refund_approve(operation_id=refund.id, acting_user=approver, reason="r")
    drill(refund, DrillMode.DROP_RESPONSE_AFTER_SEND, step="refund")
    services.operation_dispatch(operation_id=refund.id)
    read_drill("*", times=10)
    services.operation_resolve_manual(
        operation_id=refund.id,
        outcome="succeeded",
        reason="buyer says it arrived",
        actor="resolver-4",
        acting_user=resolver_,
    )
    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    settle()
    assert (
        presenters.purchase_view(Purchase.objects.get(pk=purchase.id))["status"]
        == PurchaseStatus.REFUND_PENDING
    )
    services.operation_reconcile(operation_id=refund.id)
    settle()
    assert [
        r["amount"]
        for r in localstripe.refunds_for(pay.provider_reference)
        if r["status"] == "succeeded"
    ] == [1500]
    refund = PaymentOperation.objects.get(pk=refund.pk)
    assert (refund.outcome, refund.grade) == (Outcome.SUCCEEDED, Grade.CONFIRMED)
    assert (
        presenters.purchase_view(Purchase.objects.get(pk=purchase.id))["status"]
        == PurchaseStatus.REFUNDED
    )
    assert Order.objects.filter(purchase_id=purchase.id, cancelled_at__isnull=True).count() == 0
