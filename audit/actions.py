"""The vocabulary of the audit log: every action an audit row can record, one member each.

A member *is* its string (StrEnum), so rows already written, reports that filter on a
literal and callers not yet moved to the enum all keep working; a new action is a new
member, never a renamed one (stored rows keep the old value). A refused console action is
recorded as `<action>.refused`.
"""

from __future__ import annotations

from enum import StrEnum


class AuditAction(StrEnum):
    # -- by the owning app's services (payments, recovery, webhooks)
    DISCREPANCY_RESOLVE = "discrepancy_resolve"
    EXTERNAL_OPERATION_REVIEW = "external_operation_review"
    EXTERNAL_OPERATION_RECORDED = "external_operation_recorded"
    HALT_CLEAR = "halt_clear"
    HALT_SET = "halt_set"
    OPERATION_CANCEL_AT_PROVIDER = "operation_cancel_at_provider"
    OPERATION_CANCEL_UNAPPLIED = "operation_cancel_unapplied"
    OPERATION_RESOLVE = "operation_resolve"
    OUTBOX_RETRY_NOW = "outbox_retry_now"
    OVERTURN_REVIEW = "overturn_review"
    REFUND_APPROVE = "refund_approve"
    REFUND_DECLINE = "refund_decline"
    STEP_RESOLVE = "step_resolve"
    WEBHOOK_EVENT_DISMISS = "webhook_event_dismiss"
    WEBHOOK_EVENT_RELEASE = "webhook_event_release"
    # -- by a person in the console (support), with the request's IP and what they saw
    CONSOLE_CANCEL = "console.cancel"
    CONSOLE_CANCEL_UNAPPLIED = "console.cancel_unapplied"
    CONSOLE_EXTERNAL_REVIEW = "console.external_review"
    CONSOLE_HALT_CLEAR = "console.halt_clear"
    CONSOLE_HALT_SET = "console.halt_set"
    CONSOLE_NOTE_ADD = "console.note_add"
    CONSOLE_OVERTURN_REVIEW = "console.overturn_review"
    CONSOLE_RECONCILE = "console.reconcile"
    CONSOLE_REFUND_APPROVE = "console.refund_approve"
    CONSOLE_REFUND_DECLINE = "console.refund_decline"
    CONSOLE_REFUND_REQUEST = "console.refund_request"
    CONSOLE_REPLAY = "console.replay"
    CONSOLE_RESOLVE = "console.resolve"
    CONSOLE_VOID = "console.void"
    INCIDENT_ATTACH = "incident.attach"
    INCIDENT_CLOSE = "incident.close"
    INCIDENT_HALT_SET = "incident.halt_set"
    INCIDENT_OPEN = "incident.open"
    INCIDENT_OUTCOME = "incident.outcome"
