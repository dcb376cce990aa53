"""Settlement comparison: provider balance transactions at localstripe vs the ledger."""

import pytest

from recovery.halts import halt_clear, halt_set
from recovery.models import LedgerEntry, SettlementDiscrepancy
from recovery.settlement import settlement_compare
from tests.outbox import settle

pytestmark = pytest.mark.django_db(transaction=True)


def _open(reference):
    return set(
        SettlementDiscrepancy.objects.filter(
            provider_reference=reference, resolved_at__isnull=True
        ).values_list("kind", flat=True)
    )


def test_ledger_and_provider_differences_become_discrepancies(new_purchase, pay_now):
    matched, tampered = new_purchase(), new_purchase()
    for purchase in (matched, tampered):
        pay_now(purchase)
    settle()  # fulfilment books the sales
    [matched_sale] = LedgerEntry.objects.filter(
        purchase_id=matched.id, entry_type="sale", account="provider_balance"
    )
    [tampered_sale] = LedgerEntry.objects.filter(
        purchase_id=tampered.id, entry_type="sale", account="provider_balance"
    )
    assert matched_sale.provider_reference.startswith("ch_")

    settlement_compare(grace_seconds=0)
    assert _open(matched_sale.provider_reference) == set()
    assert _open(tampered_sale.provider_reference) == set()

    # The ledger books a different amount, and a sale the provider never saw.
    LedgerEntry.objects.filter(id=tampered_sale.id).update(amount=tampered_sale.amount + 100)
    LedgerEntry.objects.create(
        purchase_id=tampered.id,
        operation_id="op_ghost",
        provider_reference="ch_ghost",
        entry_type="sale",
        account="provider_balance",
        amount=999,
        currency="usd",
    )
    result = settlement_compare(grace_seconds=0)
    settlement_compare(grace_seconds=0)  # a repeated finding writes nothing new

    assert result.discrepancies >= 2
    assert _open(matched_sale.provider_reference) == set()
    assert _open(tampered_sale.provider_reference) == {"amount_differs"}
    row = SettlementDiscrepancy.objects.get(provider_reference=tampered_sale.provider_reference)
    assert (row.provider_amount, row.ledger_amount) == (1500, 1600)
    assert _open("ch_ghost") == {"missing_at_provider"}
    assert SettlementDiscrepancy.objects.filter(provider_reference="ch_ghost").count() == 1

    # Fixed in the ledger: the next comparison resolves the open row.
    LedgerEntry.objects.filter(id=tampered_sale.id).update(amount=tampered_sale.amount)
    settlement_compare(grace_seconds=0)
    assert _open(tampered_sale.provider_reference) == set()


def test_provider_money_unknown_to_the_ledger_is_flagged(new_purchase, pay_now):
    purchase = new_purchase()
    halt_set(name="step:ledger", reason="ledger writer down", actor="op1")
    op = pay_now(purchase)  # paid, but the ledger step waits
    settle()

    settlement_compare(grace_seconds=0)

    assert _open(op.provider_charge) == {"missing_locally"}
    halt_clear(name="step:ledger", actor="op1", reason="fixed")
    settle()
    settlement_compare(grace_seconds=0)
    assert _open(op.provider_charge) == set()
