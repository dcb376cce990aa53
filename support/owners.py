"""One name per owner on every console screen: the purchase card, each operation card and
each queue row name the next owner the same way. payments.next_action decides who acts;
this only renames it for staff."""

from __future__ import annotations

from payments.enums import Owner
from payments.models import Purchase
from payments.next_action import NextStep, Situation


def staff_owner(step: NextStep, purchase: Purchase) -> str:
    """The owner of a step as the console names it, for the purchase card and every
    operation card alike (one name per thing): payments.next_action decides the owner;
    this only renames it."""
    if step.situation == Situation.AWAITING_APPROVAL:
        return "finance"  # a renaming: finance is the support role that approves refunds
    if step.owner == Owner.SUPPORT and purchase.recovery_owner:
        return purchase.recovery_owner  # the person support assigned
    return str(step.owner)
