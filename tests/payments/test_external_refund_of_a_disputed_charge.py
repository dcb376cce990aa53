"""A refund made in the provider's dashboard of a charge the bank disputed (a chargeback
open, or lost) is a fact: money moved. The refundable room Verity asks refunds from is net
of chargebacks (the bank holds, or took, that money), but a refund the provider already
made is judged against what the provider itself can refund. It is recorded as an external
refund (never quarantined as an amount mismatch), and the ledger's provider balance for
the purchase is what localstripe's record says the provider holds for it (charge, refund,
chargeback withdrawal and fee)."""

import pytest
import requests
from django.conf import settings
from django.db.models import Sum

from payments.enums import OperationKind, Origin, Outcome
from payments.models import PaymentOperation
from recovery.models import LedgerEntry
from tests.localstripe import provider_object
from tests.outbox import settle
from tests.recovery.test_goods_follow_the_money import (  # noqa: F401  (fixtures)
    PRICE,
    _buy,
    _charge,
    _dispute,
    _event,
    _move,
    webhook_secrets,
)
from tests.webhooks.events import deliver_and_process, event_for
from webhooks.models import ProviderEvent

pytestmark = pytest.mark.django_db(transaction=True)

AUTH = (settings.STRIPE_API_KEY, "")


def _dashboard_refund(charge: str) -> dict:
    """What a person does in the provider's dashboard: no Verity key, no metadata."""
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/v1/refunds", data={"charge": charge}, auth=AUTH, timeout=10
    )
    r.raise_for_status()
    return r.json()


def _provider_net(purchase_id: str, dispute_id: str) -> int:
    """What the provider holds for the purchase, from its own record: the charge received,
    less its refunds, plus the chargeback's balance transactions (withdrawal and fee)."""
    [payment] = PaymentOperation.objects.filter(purchase_id=purchase_id, kind="charge")
    pi = provider_object("payment_intents", payment.provider_reference)
    refunds = requests.get(
        f"{settings.STRIPE_API_BASE}/v1/refunds",
        params={"payment_intent": pi["id"]},
        auth=AUTH,
        timeout=10,
    ).json()["data"]
    dispute = provider_object("disputes", dispute_id)
    return (
        (pi.get("amount_received") or pi["amount"] if pi["status"] == "succeeded" else 0)
        - sum(r["amount"] for r in refunds if r["status"] == "succeeded")
        + sum(bt["net"] for bt in dispute.get("balance_transactions") or [])
    )


def _ledger_net(purchase_id: str) -> int:
    return (
        LedgerEntry.objects.filter(purchase_id=purchase_id, account="provider_balance").aggregate(
            s=Sum("amount")
        )["s"]
        or 0
    )


@pytest.mark.parametrize("chargeback", ["open", "lost"])
def test_a_dashboard_refund_of_a_disputed_charge_is_recorded_and_booked(
    chargeback, client, auto_refund_shop
):
    # given a paid purchase whose charge the bank disputed (a chargeback, funds withdrawn)
    purchase_id, _ = _buy(auto_refund_shop)
    settle()
    charge = _charge(purchase_id)
    dispute = _dispute(charge)
    _event(client, dispute, "charge.dispute.created")
    if chargeback == "lost":
        _move(dispute, "lost")
        _event(client, dispute, "charge.dispute.closed")
    settle()

    # when a person refunds the charge in full in the provider's dashboard
    refund = _dashboard_refund(charge)
    assert refund["status"] == "succeeded" and refund["amount"] == PRICE
    event = event_for(provider_object("refunds", refund["id"]), "refund.created")
    deliver_and_process(client, event)
    settle()

    # then it is recorded once as the provider's refund, not quarantined
    stored = ProviderEvent.objects.get(event_id=event["id"])
    assert (stored.result, stored.result_reason) != ("quarantined", "mismatch:amount")
    [ext] = PaymentOperation.objects.filter(purchase_id=purchase_id, origin=Origin.PROVIDER)
    assert (ext.kind, ext.outcome, ext.amount, ext.provider_reference) == (
        OperationKind.REFUND,
        Outcome.SUCCEEDED,
        PRICE,
        refund["id"],
    )
    # and the ledger holds for the purchase what the provider holds for it
    assert _ledger_net(purchase_id) == _provider_net(purchase_id, dispute)
