"""A lost answer is `unknown`, then reconciled from the provider's record; an answer never
sent is sent again with the same key, or fails. Every fault drill and every row of the
outcome table, counted at localstripe."""

import pytest

from payments import services
from payments.enums import Grade, HoldState, Outcome, PurchaseStatus, Verification
from payments.models import Hold, ProviderCall
from payments.providers.stripe import DrillMode, DrillRefused, StripeProvider

pytestmark = pytest.mark.django_db(transaction=True)


def _start(purchase, api_client, method="pm_card_visa"):
    return services.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method=method
    )


@pytest.mark.parametrize(
    "mode", [DrillMode.DROP_RESPONSE_AFTER_SEND, DrillMode.RESET_AFTER_WRITE, DrillMode.HTTP_500]
)
def test_answer_lost_after_send_is_unknown_then_reconciled_from_provider(
    mode, new_purchase, api_client, localstripe, drill
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, mode)
    op = services.operation_dispatch(operation_id=op.id)
    # The provider applied the charge; Verity does not know yet and says so.
    assert op.outcome == Outcome.UNKNOWN and op.purchase.status == PurchaseStatus.PAYMENT_UNKNOWN
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert Hold.objects.get(operation=op).state == HoldState.RESERVED  # unknown keeps it
    assert services.client_limits(api_client)["unknown_exposure"] == op.amount
    assert op.next_reconcile_at is not None
    # Never dispatched again: a second dispatch call sends nothing.
    services.operation_dispatch(operation_id=op.id)
    assert ProviderCall.objects.filter(operation=op, step="confirm").count() == 1

    op = services.operation_reconcile(operation_id=op.id)
    assert (op.outcome, op.grade, op.verification) == (
        Outcome.SUCCEEDED,
        Grade.CONFIRMED,
        Verification.PROVIDER,
    )
    assert op.purchase.status == PurchaseStatus.PAID
    assert Hold.objects.get(operation=op).state == HoldState.CONSUMED
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert len(localstripe.payment_intents_for(purchase.id)) == 1


def test_timeout_before_send_is_resent_with_the_same_key(
    new_purchase, api_client, localstripe, drill
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.TIMEOUT_BEFORE_SEND)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.SUCCEEDED
    confirms = list(
        ProviderCall.objects.filter(operation=op, step="confirm").values_list(
            "attempt", "classification", "key"
        )
    )
    assert [(a, c) for a, c, _ in confirms] == [(1, "not_sent"), (2, "ok")]
    assert confirms[0][2] == confirms[1][2] == f"{op.idempotency_key}:confirm"
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1


def test_never_sent_three_times_fails_provider_unreachable(
    new_purchase, api_client, localstripe, drill
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.TIMEOUT_BEFORE_SEND, times=3)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.FAILED and op.reason == "provider_unreachable"
    assert localstripe.succeeded_charges_for(purchase.id) == []
    assert Hold.objects.get(operation=op).state == HoldState.RELEASED


def test_http_409_on_confirm_stays_unknown_without_evidence(
    new_purchase, api_client, localstripe, drill
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.HTTP_409)
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    op = services.operation_reconcile(operation_id=op.id)
    # The PaymentIntent exists but was never confirmed: no verdict, so still unknown.
    assert op.outcome == Outcome.UNKNOWN and op.reconcile_attempts == 1
    assert localstripe.succeeded_charges_for(purchase.id) == []


def test_unknown_blocks_new_payments_whatever_the_key(new_purchase, api_client, drill):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    services.operation_dispatch(operation_id=op.id)
    with pytest.raises(services.DomainError) as err:
        _start(purchase, api_client)
    assert err.value.code == "payment_unresolved" and err.value.operation == op.id


def test_reconcile_with_provider_unavailable_keeps_unknown(
    new_purchase, api_client, drill, settings
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    op = services.operation_dispatch(operation_id=op.id)
    from payments.providers import stripe as adapter

    adapter.get_provider.cache_clear()
    settings.STRIPE_API_BASE = "http://127.0.0.1:1"  # nothing listens: read-back unavailable
    try:
        op = services.operation_reconcile(operation_id=op.id)
    finally:
        adapter.get_provider.cache_clear()
    assert op.outcome == Outcome.UNKNOWN
    assert op.provider_calls.filter(purpose="reconcile").last().classification == "not_sent"


def test_manual_resolution_needs_a_person_other_than_the_requester(
    new_purchase, api_client, drill, read_drill, django_user_model
):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.HTTP_409)
    op = services.operation_dispatch(operation_id=op.id)
    # The provider cannot be read: the person's word stands, graded acknowledged.
    read_drill(op.provider_reference, times=2)
    with pytest.raises(services.DomainError) as err:
        services.operation_resolve_manual(
            operation_id=op.id,
            outcome="failed",
            reason="x",
            actor=api_client.name,
            acting_client=api_client,
        )
    assert err.value.code == "resolver_is_requester"
    person = django_user_model.objects.create(username="op1")
    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome="failed",
        reason="provider shows no confirm",
        actor="op1",
        acting_user=person,
    )
    assert (op.outcome, op.grade, op.verification) == ("failed", "acknowledged", "manual")
    assert Hold.objects.get(operation=op).state == HoldState.RELEASED
    from support.models import AuditEntry, Resolution

    assert Resolution.objects.filter(operation_id=op.id).count() == 1
    assert AuditEntry.objects.filter(target_id=op.id, action="operation_resolve").count() == 1


def test_drills_are_refused_for_live_keys():
    provider = StripeProvider(api_key="sk_live_nope", api_base="http://127.0.0.1:1", drills=True)
    with pytest.raises(DrillRefused):
        provider.arm_drill(key_prefix="vk_x", step="confirm", mode=DrillMode.HTTP_500)


def test_provider_calls_under_a_drill_are_labelled(new_purchase, api_client, drill):
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
    services.operation_dispatch(operation_id=op.id)
    labels = dict(ProviderCall.objects.filter(operation=op).values_list("step", "fault_drill"))
    assert labels == {"create": "", "confirm": DrillMode.DROP_RESPONSE_AFTER_SEND}


def test_the_platform_account_is_read_on_each_use_not_kept_from_the_first(settings):
    """The provider is built once per process; the account it labels objects with is the
    setting of now, read on each use. Kept from the first build, one test's override
    (STRIPE_ACCOUNT = "acct_platform") would follow every later test of the worker: their
    payments would read back under a foreign account and stay unknown."""
    from payments.providers import stripe as adapter

    adapter.get_provider.cache_clear()
    try:
        settings.STRIPE_ACCOUNT = "acct_first_build"
        provider = adapter.get_provider()
        assert provider.account == "acct_first_build"
        settings.STRIPE_ACCOUNT = ""
        assert adapter.get_provider() is provider and provider.account == ""
    finally:
        adapter.get_provider.cache_clear()
