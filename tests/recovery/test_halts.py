"""Workflow and step halts: stored rows, audited, read at every use."""

import pytest
from django.core.management import call_command

from payments import services as pay
from payments.services import DomainError
from recovery.halts import HaltError, halt_clear, halt_set, is_halted
from recovery.models import WorkflowHalt
from support.models import AuditEntry

pytestmark = pytest.mark.django_db(transaction=True)


def test_halt_set_and_clear_are_audited_and_read_at_once():
    assert not is_halted("refunds")

    halt_set(name="refunds", reason="provider incident", actor="op1")
    halt_set(name="refunds", reason="provider incident", actor="op1")  # idempotent

    assert is_halted("refunds") and not is_halted("checkout")
    assert WorkflowHalt.objects.get().halted_by == "op1"
    assert halt_clear(name="refunds", actor="op2", reason="incident over")
    assert not halt_clear(name="refunds", actor="op2", reason="again")
    assert not is_halted("refunds")
    audit = list(AuditEntry.objects.values_list("action", "actor", "target_id", "reason"))
    assert audit == [
        ("halt_set", "op1", "refunds", "provider incident"),
        ("halt_clear", "op2", "refunds", "incident over"),
    ]


@pytest.mark.parametrize(
    "name,reason,actor", [("everything", "r", "a"), ("checkout", " ", "a"), ("checkout", "r", "")]
)
def test_halt_needs_a_known_name_a_reason_and_an_actor(name, reason, actor):
    with pytest.raises(HaltError):
        halt_set(name=name, reason=reason, actor=actor)
    assert not WorkflowHalt.objects.exists() and not AuditEntry.objects.exists()


def test_management_command_switches_halts(capsys):
    call_command("halt", "set", "step:order", "--reason", "order writer down", "--actor", "cli")
    assert is_halted("step:order")
    call_command("halt", "list")
    assert "step:order" in capsys.readouterr().out
    call_command("halt", "clear", "step:order", "--reason", "fixed", "--actor", "cli")
    assert not is_halted("step:order")
    assert AuditEntry.objects.filter(actor="cli").count() == 2


def test_checkout_halt_refuses_new_charges_and_refund_halt_refuses_compensation(
    new_purchase, pay_now, localstripe
):
    purchase = new_purchase()
    halt_set(name="checkout", reason="incident", actor="op1")

    with pytest.raises(DomainError) as refused:
        pay_now(purchase)
    assert refused.value.code == "workflow_halted" and refused.value.status == 503
    assert localstripe.payment_intents_for(purchase.id) == []

    halt_clear(name="checkout", actor="op1", reason="over")
    pay_now(purchase)
    halt_set(name="refunds", reason="incident", actor="op1")
    with pytest.raises(DomainError) as refused:
        pay.refund_request(purchase_id=purchase.id, compensation=True)
    assert refused.value.code == "workflow_halted"


def test_a_caller_writing_its_own_audit_row_can_skip_ours():
    halt_set(name="checkout", reason="incident", actor="olga", audit=False)
    assert is_halted("checkout") and not AuditEntry.objects.exists()
    assert halt_clear(name="checkout", actor="olga", reason="over", audit=False)
    assert not AuditEntry.objects.exists()
