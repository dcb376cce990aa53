"""Reads of recovery's own rows that the payments core shows (the API's purchase view).

Beside recovery.models: it imports no app above the payments core, so the core's
presenters may read it.
"""

from __future__ import annotations

from payments.view_queries import CompiledRead

from .models import STEP_ORDER, StepName, StepRun, StepState

# The purchase's step states, compiled once per process (a prepared statement on
# PostgreSQL: payments.view_queries.CompiledRead). The purchase view runs it in the same
# round trip as its other reads (payments.api.presenters).
STEP_STATES = CompiledRead(
    lambda purchase_id: StepRun.objects.filter(purchase_id=purchase_id).values_list(
        "step", "state"
    ),
    "\x01verity-purchase",
)


def steps_for_purchase(purchase_id: str) -> dict[str, str]:
    """{step: state} for every step of the purchase; steps not started yet are `pending`.

    The API's purchase view (fulfillment{...}) reads this. `deliverable` appears only when
    it exists for the purchase (digital goods).
    """
    return steps_of(STEP_STATES.rows(purchase_id))


def steps_of(rows: list[tuple[str, str]]) -> dict[str, str]:
    """`steps_for_purchase` of the (step, state) rows STEP_STATES read."""
    found = dict(rows)
    out = {step.value: found.get(step.value, StepState.PENDING.value) for step in STEP_ORDER}
    if StepName.DELIVERABLE.value in found:
        out[StepName.DELIVERABLE.value] = found[StepName.DELIVERABLE.value]
    return out
