"""Reads of recovery's own rows that the payments core shows (the API's purchase view).

A leaf beside recovery.models: it imports no app, so the core may read it.
"""
from __future__ import annotations

from .models import STEP_ORDER, StepName, StepRun, StepState


def steps_for_purchase(purchase_id: str) -> dict[str, str]:
    """{step: state} for every step of the purchase; steps not started yet are `pending`.

    The API's purchase view (fulfillment{...}) reads this. `deliverable` appears only when
    it exists for the purchase (digital goods).
    """
    rows = dict(StepRun.objects.filter(purchase_id=purchase_id).values_list("step", "state"))
    out = {step.value: rows.get(step.value, StepState.PENDING.value) for step in STEP_ORDER}
    if StepName.DELIVERABLE.value in rows:
        out[StepName.DELIVERABLE.value] = rows[StepName.DELIVERABLE.value]
    return out
