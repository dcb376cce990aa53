"""Disputes: a charge disputed at the provider (localstripe's dispute resource, added by
tools/localstripe_server.py) reaches Verity as signed `charge.dispute.*` events built
from the provider's own Dispute object; the purchase says `disputed` everywhere, the
ledger follows the provider's balance to the unit, and late events never regress it."""

import copy

import pytest
import requests
from django.conf import settings
from django.db.models import Sum

from payments.enums import DisputeStatus, PurchaseStatus
from payments.models import Dispute, ProviderCall, Purchase
from recovery.models import LedgerEntry, SettlementDiscrepancy
from recovery.settlement import settlement_compare
from tests.localstripe import provider_object
from tests.outbox import settle
from webhooks.models import EventResult, ProviderEvent

from .events import deliver_and_process, event_for

pytestmark = pytest.mark.django_db(transaction=True)

DISPUTE_FEE = 1500


def finance_console(client):
    from django.contrib.auth.models import Group, User

    from support.access import ensure_groups

    ensure_groups()
    user = User.objects.create_user("finance-disputes", password="x")
    user.groups.add(Group.objects.get(name="finance"))
    client.force_login(user)
    return client


def open_dispute(charge: str, **fields) -> dict:
    """The card network's part: the provider opens a dispute and withdraws the funds."""
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/_config/disputes",
        data={"charge": charge, **fields},
        timeout=10,
    )
    r.raise_for_status()
    return r.json()


def move_dispute(dispute_id: str, status: str, **fields) -> dict:
    r = requests.post(
        f"{settings.STRIPE_API_BASE}/_config/disputes/{dispute_id}",
        data={"status": status, **fields},
        timeout=10,
    )
    r.raise_for_status()
    return r.json()


def dispute_event(dispute_id: str, type_: str) -> dict:
    return event_for(provider_object("disputes", dispute_id), type_)


def provider_net(localstripe, sources: set[str]) -> int:
    return sum(t["net"] for t in localstripe.list("balance_transactions") if t["source"] in sources)


def ledger_balance(purchase_id: str) -> int:
    return (
        LedgerEntry.objects.filter(purchase_id=purchase_id, account="provider_balance").aggregate(
            s=Sum("amount")
        )["s"]
        or 0
    )


def entries(purchase_id: str, entry_type: str) -> int:
    return LedgerEntry.objects.filter(purchase_id=purchase_id, entry_type=entry_type).count()


def paid_purchase(new_purchase, pay):
    purchase = new_purchase()
    op = pay(purchase)
    settle()  # fulfilment books the sale
    assert op.provider_charge.startswith("ch_")
    return purchase, op


def test_lost_dispute_is_disputed_everywhere_and_leaves_ledger_equal_to_provider(
    client, api, new_purchase, pay, localstripe
):
    purchase, op = paid_purchase(new_purchase, pay)
    dispute = open_dispute(op.provider_charge, reason="fraudulent")

    result = deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.created"))
    settle()  # the DISPUTE_CHANGED message: read-back, then the ledger

    assert result == EventResult.APPLIED
    body = api.get(f"/api/v1/purchases/{purchase.pk}").json()
    assert body["status"] == PurchaseStatus.DISPUTED
    assert body["next_action"]["code"] == "disputed"
    [shown] = body["disputes"]
    assert (shown["id"], shown["status"], shown["amount"], shown["currency"], shown["reason"]) == (
        dispute["id"],
        "needs_response",
        1500,
        "usd",
        "fraudulent",
    )
    assert shown["evidence_due_by"].startswith("20")
    page = client.get(f"/status/{purchase.status_token}/").content.decode()
    assert "being reviewed with your bank" in page and "Pay again" not in page
    console = finance_console(client).get("/console/queues/disputes/").content.decode()
    assert dispute["id"] in console and purchase.pk in console
    row = Dispute.objects.get(pk=dispute["id"])
    assert (row.funds_withdrawn, row.fees, row.verification) == (1500, DISPUTE_FEE, "provider")
    assert (
        ProviderCall.objects.filter(
            operation=op, purpose="reconcile", safe_fields__object="dispute"
        ).count()
        >= 1
    )
    assert entries(purchase.pk, "dispute_withdrawal") == 2
    assert entries(purchase.pk, "dispute_fee") == 2

    move_dispute(dispute["id"], "under_review")
    deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.updated"))
    move_dispute(dispute["id"], "lost")
    closed = dispute_event(dispute["id"], "charge.dispute.closed")
    assert deliver_and_process(client, closed) == EventResult.APPLIED
    settle()

    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.DISPUTE_LOST
    assert api.get(f"/api/v1/purchases/{purchase.pk}").json()["disputes"][0]["status"] == "lost"
    sources = {op.provider_charge, dispute["id"]}
    assert ledger_balance(purchase.pk) - provider_net(localstripe, sources) == 0
    assert ledger_balance(purchase.pk) == 1500 - 1500 - DISPUTE_FEE
    assert entries(purchase.pk, "dispute_loss") == 2
    settlement_compare(grace_seconds=0)
    assert not SettlementDiscrepancy.objects.filter(
        provider_reference__in=sources, resolved_at__isnull=True
    ).exists()
    # provider objects: one charge, one dispute, no refund
    assert len(localstripe.succeeded_charges_for(purchase.pk)) == 1
    assert len([d for d in localstripe.list("disputes") if d["charge"] == op.provider_charge]) == 1
    assert localstripe.refunds_for(op.provider_reference) == []


def test_won_dispute_reinstates_the_funds_and_the_purchase_says_so(
    client, api, new_purchase, pay, localstripe
):
    purchase, op = paid_purchase(new_purchase, pay)
    dispute = open_dispute(op.provider_charge, reason="product_not_received")
    deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.created"))
    move_dispute(dispute["id"], "won")

    assert (
        deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.closed"))
        == EventResult.APPLIED
    )
    settle()

    assert api.get(f"/api/v1/purchases/{purchase.pk}").json()["status"] == "dispute_won"
    row = Dispute.objects.get(pk=dispute["id"])
    assert (row.status, row.funds_withdrawn, row.funds_reinstated) == ("won", 1500, 1500)
    assert entries(purchase.pk, "dispute_reinstatement") == 2
    assert entries(purchase.pk, "dispute_loss") == 0
    sources = {op.provider_charge, dispute["id"]}
    # sale 1500, withdrawal -1500, fee -1500, reinstatement +1500 (the fee is not returned)
    assert ledger_balance(purchase.pk) == provider_net(localstripe, sources) == 1500 - DISPUTE_FEE


def test_late_and_repeated_events_never_regress_a_closed_dispute(
    client, new_purchase, pay, localstripe
):
    purchase, op = paid_purchase(new_purchase, pay)
    dispute = open_dispute(op.provider_charge)
    created = dispute_event(dispute["id"], "charge.dispute.created")  # built while open
    move_dispute(dispute["id"], "lost")
    closed = dispute_event(dispute["id"], "charge.dispute.closed")

    # the closing event arrives first, the opening one after it, then both again
    assert deliver_and_process(client, closed) == EventResult.APPLIED
    assert deliver_and_process(client, created) == EventResult.IGNORED
    settle()
    ledger_rows = LedgerEntry.objects.filter(purchase_id=purchase.pk).count()
    for event in (created, closed):
        again = copy.deepcopy(event)
        again["id"] = event["id"] + "_again"
        assert deliver_and_process(client, again) == EventResult.IGNORED
    settle()

    assert Dispute.objects.filter(purchase_id=purchase.pk).count() == 1
    assert Dispute.objects.get(pk=dispute["id"]).status == DisputeStatus.LOST
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.DISPUTE_LOST
    assert LedgerEntry.objects.filter(purchase_id=purchase.pk).count() == ledger_rows
    assert ledger_balance(purchase.pk) == provider_net(
        localstripe, {op.provider_charge, dispute["id"]}
    )


def test_a_dispute_that_disagrees_with_the_payment_is_quarantined_and_changes_nothing(
    client, new_purchase, pay
):
    purchase, op = paid_purchase(new_purchase, pay)
    dispute = open_dispute(op.provider_charge)
    event = dispute_event(dispute["id"], "charge.dispute.created")
    event["data"]["object"]["currency"] = "eur"
    ledger_rows = LedgerEntry.objects.filter(purchase_id=purchase.pk).count()

    assert deliver_and_process(client, event) == EventResult.QUARANTINED
    settle()

    assert ProviderEvent.objects.get(event_id=event["id"]).result_reason == "mismatch:currency"
    assert not Dispute.objects.filter(pk=dispute["id"]).exists()
    assert Purchase.objects.get(pk=purchase.pk).status != PurchaseStatus.DISPUTED
    assert LedgerEntry.objects.filter(purchase_id=purchase.pk).count() == ledger_rows


def test_a_dispute_on_a_charge_verity_does_not_know_is_held(client, new_purchase, pay):
    purchase, op = paid_purchase(new_purchase, pay)
    dispute = open_dispute(op.provider_charge)
    event = dispute_event(dispute["id"], "charge.dispute.created")
    event["data"]["object"]["payment_intent"] = "pi_someone_else"
    event["data"]["object"]["charge"] = "ch_someone_else"

    assert deliver_and_process(client, event) == EventResult.HELD
    assert not Dispute.objects.exists()


def test_a_missed_closing_event_is_caught_by_the_periodic_read_back(
    client, new_purchase, pay, localstripe
):
    from recovery.disputes import disputes_refresh_open

    purchase, op = paid_purchase(new_purchase, pay)
    dispute = open_dispute(op.provider_charge)
    deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.created"))
    settle()
    move_dispute(dispute["id"], "lost")  # charge.dispute.closed never arrives

    assert disputes_refresh_open() == 1
    settle()

    assert Dispute.objects.get(pk=dispute["id"]).status == DisputeStatus.LOST
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.DISPUTE_LOST
    assert ledger_balance(purchase.pk) == provider_net(
        localstripe, {op.provider_charge, dispute["id"]}
    )
    assert disputes_refresh_open() == 0  # nothing open is left to read


def test_a_dispute_opened_before_fulfilment_books_the_sale_it_withdraws(
    client, new_purchase, pay, localstripe
):
    # given a charge whose follow-up work (the ledger step) has not run yet
    purchase = new_purchase()
    op = pay(purchase)
    assert entries(purchase.pk, "sale") == 0
    dispute = open_dispute(op.provider_charge, reason="fraudulent")

    # when the card network disputes it before the orchestrator handled the purchase
    result = deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.created"))
    settle()

    # then the ledger holds what the provider holds (not -amount)
    assert result == EventResult.APPLIED
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.DISPUTED
    assert entries(purchase.pk, "sale") == 2
    sources = {op.provider_charge, dispute["id"]}
    assert ledger_balance(purchase.pk) - provider_net(localstripe, sources) == 0


def _fence_after_order():
    """Fulfilment stops after the order (the inventory step is halted): mid-fulfilment."""
    from recovery.halts import halt_set

    halt_set(name="step:inventory", reason="test fence: fulfilment mid-way", actor="test")


def _steps(purchase_id: str) -> dict[str, str]:
    from recovery.models import StepRun

    return dict(StepRun.objects.filter(purchase_id=purchase_id).values_list("step", "state"))


@pytest.mark.parametrize("opened", ["before_fulfilment", "mid_fulfilment"])
def test_a_won_dispute_resumes_the_fulfilment_it_paused(
    client, api, new_purchase, pay, localstripe, opened
):
    from recovery.models import EmailMessage, Order
    from tests.recovery.halt_fence import lift_halt_quietly

    # given a charge disputed before its steps ran, or after the order but before the rest
    purchase = new_purchase()
    if opened == "mid_fulfilment":
        _fence_after_order()
    op = pay(purchase)
    if opened == "mid_fulfilment":
        settle()
        assert _steps(purchase.pk)["order"] == "done"
        assert _steps(purchase.pk)["inventory"] == "pending"
    dispute = open_dispute(op.provider_charge, reason="product_not_received")
    deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.created"))
    lift_halt_quietly("step:inventory")
    settle()
    # while the dispute is open nothing more ships
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.DISPUTED
    assert EmailMessage.objects.filter(purchase_id=purchase.pk).count() == 0

    # when the merchant wins it
    move_dispute(dispute["id"], "won")
    assert (
        deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.closed"))
        == EventResult.APPLIED
    )
    settle()

    # then every remaining step ran, once; the purchase still says how the dispute ended
    assert set(_steps(purchase.pk).values()) == {"done"}
    assert Order.objects.filter(purchase_id=purchase.pk, cancelled_at__isnull=True).count() == 1
    assert (
        EmailMessage.objects.filter(
            purchase_id=purchase.pk, kind="confirmation", sent_at__isnull=False
        ).count()
        == 1
    )
    assert entries(purchase.pk, "sale") == 2
    assert api.get(f"/api/v1/purchases/{purchase.pk}").json()["status"] == "dispute_won"
    sources = {op.provider_charge, dispute["id"]}
    assert ledger_balance(purchase.pk) == provider_net(localstripe, sources) == 1500 - DISPUTE_FEE


def test_a_lost_dispute_mid_fulfilment_ships_nothing_more_and_cancels_the_order(
    client, new_purchase, pay, localstripe
):
    from recovery.models import EmailMessage, Order
    from tests.recovery.halt_fence import lift_halt_quietly

    purchase = new_purchase()
    _fence_after_order()
    op = pay(purchase)
    settle()
    dispute = open_dispute(op.provider_charge, reason="fraudulent")
    deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.created"))
    lift_halt_quietly("step:inventory")
    move_dispute(dispute["id"], "lost")
    deliver_and_process(client, dispute_event(dispute["id"], "charge.dispute.closed"))
    settle()

    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.DISPUTE_LOST
    assert Order.objects.get(purchase_id=purchase.pk).cancelled_at is not None
    # never "confirmed"; told once that the order is cancelled (goods follow the money)
    assert list(
        EmailMessage.objects.filter(purchase_id=purchase.pk).values_list("kind", flat=True)
    ) == ["cancellation"]
    assert _steps(purchase.pk)["inventory"] == "pending"
    sources = {op.provider_charge, dispute["id"]}
    assert ledger_balance(purchase.pk) - provider_net(localstripe, sources) == 0


def test_a_dispute_of_a_charge_whose_answer_verity_lost_waits_for_its_record(
    client, new_purchase, pay, localstripe
):
    from payments import services
    from payments.enums import Outcome

    # given a charge the provider applied but whose answer Verity lost (still unknown here)
    purchase = new_purchase()
    op = pay(purchase, drop_response=True)
    assert op.outcome == Outcome.UNKNOWN
    [intent] = localstripe.succeeded_charges_for(purchase.pk)
    charge = intent["latest_charge"]
    charge = (
        charge["id"] if isinstance(charge, dict) else charge or intent["charges"]["data"][0]["id"]
    )
    dispute = open_dispute(charge, reason="fraudulent")
    event = dispute_event(dispute["id"], "charge.dispute.created")

    # when the dispute's event arrives first, it waits (never quarantined as a mismatch)
    assert deliver_and_process(client, event) == EventResult.HELD
    assert ProviderEvent.objects.get(event_id=event["id"]).result_reason == "payment_not_settled"
    assert not Dispute.objects.filter(pk=dispute["id"]).exists()

    # then, once the reconciler settled the charge, the held event records the dispute
    assert services.operation_reconcile(operation_id=op.id).outcome == Outcome.SUCCEEDED
    settle()  # retried at once when the charge settled, not at its backoff
    assert ProviderEvent.objects.get(event_id=event["id"]).result == EventResult.APPLIED
    assert Purchase.objects.get(pk=purchase.pk).status == PurchaseStatus.DISPUTED
    assert Dispute.objects.get(pk=dispute["id"]).funds_withdrawn == 1500
    op.refresh_from_db()
    sources = {op.provider_charge, dispute["id"]}
    assert ledger_balance(purchase.pk) - provider_net(localstripe, sources) == 0
