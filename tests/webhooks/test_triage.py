"""Quarantine triage for the console: release (re-process) and dismiss, audited."""

import pytest
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied

from payments.enums import OperationKind, Outcome
from payments.models import PaymentOperation
from payments.services import DomainError
from recovery.models import OutboxCategory, OutboxMessage
from support.access import Role, ensure_groups
from support.models import AuditEntry
from support.services import event_triage_by_user
from tests.factories import PurchaseFactory
from webhooks import selectors
from webhooks.models import EventResult, ProviderEvent
from webhooks.services import (
    HELD_MAX_ATTEMPTS,
    event_process,
    event_quarantine_dismiss,
    event_quarantine_release,
)

from .events import deliver_and_process, event_for

pytestmark = pytest.mark.django_db


def user(role: Role, name: str) -> User:
    ensure_groups()
    u = User.objects.create_user(name, password="x")
    u.groups.add(Group.objects.get(name=role.value))
    return u


def unmatched_event(client, *, pi_id="pi_orphan", op_id="op_orphan", pur_id="pur_orphan"):
    obj = {
        "id": pi_id,
        "object": "payment_intent",
        "status": "succeeded",
        "amount": 1500,
        "currency": "usd",
        "metadata": {
            "operation_id": op_id,
            "purchase_id": pur_id,
            "customer_reference": "c-orphan",
        },
    }
    event = event_for(obj, "payment_intent.succeeded")
    result = deliver_and_process(client, event)
    stored = ProviderEvent.objects.get(event_id=event["id"])
    while result == EventResult.HELD:
        result = event_process(event_id=stored.pk)
    stored.refresh_from_db()
    assert (stored.result, stored.result_reason) == (EventResult.QUARANTINED, "unmatched")
    return stored


def test_quarantined_events_are_listed_for_operators_and_on_the_purchase_timeline(client):
    event = unmatched_event(client)

    assert list(selectors.quarantined_events()) == [event]
    assert list(selectors.events_for_purchase("pur_orphan")) == [event]
    assert list(selectors.events_for_operation("op_orphan")) == []  # never matched


def test_release_reprocesses_and_applies_once_the_operation_exists(client):
    event = unmatched_event(client)
    operator = user(Role.OPERATOR, "olga")
    purchase = PurchaseFactory(id="pur_orphan", customer_reference="c-orphan")
    op = PaymentOperation.objects.create(  # setup only: the row the sync path committed late
        id="op_orphan",
        purchase=purchase,
        kind=OperationKind.CHARGE,
        amount=1500,
        currency="usd",
        provider_reference="pi_orphan",
        outcome=Outcome.UNKNOWN,
    )

    event_quarantine_release(
        event_id=event.pk,
        acting_user=operator,
        reason="operation committed after the retries ran out",
    )

    audit = AuditEntry.objects.get(action="webhook_event_release")
    assert (audit.actor, audit.target_id, audit.purchase_id) == (
        "olga",
        str(event.pk),
        "pur_orphan",
    )
    assert audit.detail["previous_reason"] == "unmatched"
    message = OutboxMessage.objects.get(
        category=OutboxCategory.PROCESS_EVENT, dedupe_key__contains=":release:"
    )
    assert message.payload == {"event": event.pk}
    assert event_process(event_id=event.pk) == EventResult.APPLIED
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.SUCCEEDED
    assert list(selectors.events_for_operation("op_orphan")) == [
        ProviderEvent.objects.get(pk=event.pk)
    ]
    assert HELD_MAX_ATTEMPTS > 1


def test_dismiss_closes_without_applying_and_is_audited(client):
    event = unmatched_event(client)
    operator = user(Role.OPERATOR, "omar")

    event_quarantine_dismiss(
        event_id=event.pk, acting_user=operator, reason="test event from the provider dashboard"
    )

    event.refresh_from_db()
    assert (event.result, event.result_reason) == (EventResult.IGNORED, "dismissed:unmatched")
    assert AuditEntry.objects.filter(action="webhook_event_dismiss", actor="omar").count() == 1
    assert list(selectors.quarantined_events()) == []
    with pytest.raises(DomainError) as err:  # only quarantined events can be triaged
        event_quarantine_dismiss(event_id=event.pk, acting_user=operator, reason="again")
    assert err.value.code == "event_not_quarantined"


@pytest.mark.parametrize("role", [Role.SUPPORT, Role.FINANCE])
def test_triage_needs_the_operator_role(client, role):
    event = unmatched_event(client)
    someone = user(role, f"user-{role.value}")

    # Permissions are checked at the edge: the console's service, before webhooks runs.
    for decision in ("release", "dismiss"):
        with pytest.raises(PermissionDenied):
            event_triage_by_user(
                event_pk=event.pk, decision=decision, user=someone, reason="because"
            )

    assert AuditEntry.objects.count() == 0
    assert ProviderEvent.objects.get(pk=event.pk).result == EventResult.QUARANTINED


def test_triage_needs_a_reason(client):
    event = unmatched_event(client)

    with pytest.raises(DomainError) as err:
        event_quarantine_dismiss(
            event_id=event.pk, acting_user=user(Role.OPERATOR, "o"), reason="  "
        )

    assert err.value.code == "reason_required"
    assert AuditEntry.objects.count() == 0
