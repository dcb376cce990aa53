"""Demo cases for `make run`: one purchase per customer-page state and at least one case
in every console queue, so a person can click through the console and the status page.

These rows are written directly (like test preconditions): at seed time no provider is
running, and some states (an escalated unknown, a quarantined event) take hours or a
misbehaving provider to reach for real. Every row is marked `demo-…`. Each seed starts by
removing the previous demo cases (`demo_cases_reset`), so a second `make run` shows the
demo as new even after someone approved, refunded or resolved its cases; rows a developer
made themselves are left alone, and the audit log keeps what was done (it is append-only).

Every case stays as seeded until a person acts: the sweeps of a running `make run`
(reconcile, stalled fulfilment, expiry) find nothing of theirs to do, because each case
carries the reason it waits for a person (a steps message the relay backed off for a
day, an e-mail that may have been sent), not a fulfilment the orchestrator would simply
finish. The one case
whose action reaches the provider, the refund awaiting approval, pays a real PaymentIntent
at localstripe once it is up (`demo_provider_payments_seed`, called by the banner).

Never run this against a production database: the command refuses unless DEBUG is on
or the provider key is a test key.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from payments.customers import basket_fingerprint, customer_key
from payments.enums import (
    OVERTURN_CAUSE,
    Grade,
    HoldState,
    OperationKind,
    Origin,
    Outcome,
    PurchaseStatus,
    Rail,
    Stage,
    Verification,
)
from payments.models import (
    ApiClient,
    Dispute,
    Hold,
    OperationTransition,
    PaymentOperation,
    Purchase,
    Quote,
)
from payments.providers.base import payment_provider
from payments.services.common import provider_for
from recovery.models import (
    Order,
    OutboxCategory,
    OutboxMessage,
    SettlementDiscrepancy,
    StepName,
    StepRun,
    StepState,
)
from support import services
from support.access import Role, ensure_groups
from support.models import Incident, IncidentItem
from webhooks.models import EventResult, ProviderEvent

S, Oc = PurchaseStatus, Outcome
_OK = {
    "outcome": Oc.SUCCEEDED,
    "stage": Stage.SETTLED,
    "grade": Grade.CONFIRMED,
    "verification": Verification.PROVIDER,
}
_UNKNOWN = {"outcome": Oc.UNKNOWN, "stage": Stage.RECONCILING}

# (name, purchase status, operations, order reference?)
STATE_CASES: list[tuple[str, str, list[dict[str, Any]], bool]] = [
    (
        "being-confirmed",
        S.PAYMENT_PENDING,
        [{"outcome": Oc.AWAITING_PROVIDER, "stage": Stage.RECONCILING}],
        False,
    ),
    (
        "needs-buyer-step",
        S.ACTION_REQUIRED,
        [{"outcome": Oc.AWAITING_BUYER, "stage": Stage.RECONCILING}],
        False,
    ),
    ("checking-with-provider", S.PAYMENT_UNKNOWN, [_UNKNOWN], False),
    ("paid-confirmation-delayed", S.PAID, [_OK], False),
    ("paid-with-order", S.FULFILLING, [_OK], True),
    (
        "failed",
        S.PAYMENT_FAILED,
        [
            {
                "outcome": Oc.FAILED,
                "stage": Stage.SETTLED,
                "grade": Grade.CONFIRMED,
                "verification": Verification.PROVIDER,
                "reason": "card_declined",
            }
        ],
        False,
    ),
    ("reversed", S.REFUNDED, [_OK, {"kind": OperationKind.REFUND, **_OK}], True),
    ("complete", S.COMPLETED, [_OK], True),
    ("under-review", S.MANUAL_REVIEW, [_OK], False),
    ("awaiting-payment", S.AWAITING_PAYMENT, [], False),
    ("disputed", S.DISPUTED, [_OK], True),
]


def _first(operations: QuerySet[PaymentOperation]) -> PaymentOperation:
    """The operation the demo case just made (so there is one)."""
    op = operations.first()
    assert op is not None
    return op


def _purchase(
    name: str, status: str, ops: list[dict], order: bool, client: ApiClient | None, **extra
) -> Purchase:
    ref = f"demo-{name}"
    existing = Purchase.objects.filter(customer_reference=ref).first()
    if existing:
        return existing
    quote = Quote.objects.create(
        api_client=client,
        amount=3050,
        currency="usd",
        items=[
            {
                "sku": "TEA-001",
                "name": "Sencha green tea, 100 g",
                "quantity": 1,
                "unit_price": 1250,
            },
            {"sku": "MUG-002", "name": "Stoneware mug", "quantity": 1, "unit_price": 1800},
        ],
        expires_at=timezone.now() + timedelta(days=365),
    )
    purchase = Purchase.objects.create(
        quote=quote,
        api_client=client,
        amount=3050,
        currency="usd",
        customer_reference=ref,
        customer_key=customer_key(ref),
        basket_fingerprint=basket_fingerprint(
            items=quote.items, amount=quote.amount, currency=quote.currency
        ),
        customer_email=f"{ref}@example.com",
        status=status,
        **extra,
    )
    for i, fields in enumerate(ops):
        fields = {"kind": OperationKind.CHARGE, **fields}
        if fields.get("stage") == Stage.SETTLED:
            # As the services write it: a settled operation has its settled time (the
            # queues that age by it showed "Oldest —" for the demo's rows).
            fields.setdefault("settled_at", timezone.now())
        PaymentOperation.objects.create(
            purchase=purchase,
            amount=3050,
            currency="usd",
            provider_reference=f"{'re' if fields['kind'] == 'refund' else 'pi'}_demo_{name}_{i}",
            **fields,
        )
    if order:
        # The same shape as the order writer's references (ord_…), so search finds it.
        Order.objects.create(purchase_id=purchase.pk, reference=f"ord_demo_{name}"[:40])
    return purchase


def _refuse_outside_development() -> None:
    key = getattr(settings, "STRIPE_API_KEY", "") or ""
    if not (settings.DEBUG or key.startswith("sk_test")):
        raise RuntimeError("demo cases are for development databases only")


def demo_cases_seed() -> list[tuple[str, str]]:
    """Create the demo cases (idempotent). Returns (state name, status page URL)."""
    _refuse_outside_development()
    client = ApiClient.objects.filter(revoked=False).order_by("created").first()
    base = getattr(settings, "PUBLIC_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
    links = []
    with transaction.atomic():
        demo_cases_reset()
        for name, status, ops, order in STATE_CASES:
            p = _purchase(name, status, ops, order, client)
            links.append((name, f"{base}/status/{p.status_token}/"))
        # Paid, and fulfilment waits for a person (the stalled-fulfilment sweep would
        # otherwise finish these within minutes and the states would be gone). Paid without
        # order: its steps message kept failing and the relay backed it off for a day (the
        # sweep's own put is absorbed by that pending row); an operator's "Retry now" in
        # the stuck-outbox queue runs it. With an order: the confirmation e-mail may have
        # been sent (never resent without review).
        delayed = Purchase.objects.get(customer_reference="demo-paid-confirmation-delayed")
        OutboxMessage.objects.create(
            category=OutboxCategory.RUN_STEPS,
            payload={"purchase": delayed.pk},
            dedupe_key=f"steps:{delayed.pk}",
            attempts=7,
            available_at=timezone.now() + timedelta(days=1),
            last_error="demo: the order writer timed out seven times; backed off",
        )
        _steps_wait_for_a_person(
            "demo-paid-with-order",
            done=(StepName.ORDER, StepName.INVENTORY, StepName.LEDGER),
            step=StepName.CONFIRMATION,
            state=StepState.UNKNOWN,
            error="demo: the mail server timed out after accepting the message; it may "
            "have been sent",
        )
        # Paid an hour ago and still no order: past the paid-without-order grace period.
        Purchase.objects.filter(customer_reference="demo-paid-confirmation-delayed").update(
            updated_at=timezone.now() - timedelta(hours=1)
        )

        # Unknown exposure (money at risk): the unknown payment holds its reservation.
        unknown = Purchase.objects.get(customer_reference="demo-checking-with-provider")
        op = unknown.operations.first()
        if client is not None and op is not None and not Hold.objects.filter(operation=op).exists():
            Hold.objects.create(
                api_client=client,
                operation=op,
                amount=op.amount,
                currency=op.currency,
                state=HoldState.RESERVED,
            )
        # Escalated to a recovery owner.
        _purchase(
            "escalated",
            S.PAYMENT_UNKNOWN,
            [
                {
                    **_UNKNOWN,
                    "stage": Stage.ESCALATED,
                    "escalated_at": timezone.now() - timedelta(hours=2),
                }
            ],
            False,
            client,
            recovery_owner=getattr(settings, "RECOVERY_OWNER_DEFAULT", "payments-oncall"),
        )
        # Compensation needed: a step a person must decide on.
        comp = _purchase("compensation-needed", S.FULFILLING, [_OK], True, client)
        StepRun.objects.get_or_create(
            purchase_id=comp.pk,
            step=StepName.LEDGER,
            defaults={
                "state": StepState.MANUAL,
                "key": f"demo:{comp.pk}:ledger",
                "attempts": 5,
                "last_error": "demo: ledger writer refused the entry",
            },
        )
        # Quarantined events: one amount mismatch (its own queue and runbook), naming a
        # purchase under review, and one for an object Verity never created.
        mismatch = _purchase("amount-mismatch", S.MANUAL_REVIEW, [_OK], False, client)
        ProviderEvent.objects.get_or_create(
            event_id="evt_demo_quarantined",
            defaults={
                "type": "payment_intent.succeeded",
                "object_id": "pi_demo_amount-mismatch_0",
                "payload": {
                    "id": "pi_demo_amount-mismatch_0",
                    "status": "succeeded",
                    "amount": 999,
                    "currency": "usd",
                },
                "operation_id": _first(mismatch.operations.all()).pk,
                "purchase_id": mismatch.pk,
                "result": EventResult.QUARANTINED,
                "result_reason": "mismatch:amount",
            },
        )
        ProviderEvent.objects.get_or_create(
            event_id="evt_demo_unmatched",
            defaults={
                "type": "payment_intent.succeeded",
                "object_id": "pi_demo_foreign",
                "payload": {
                    "id": "pi_demo_foreign",
                    "status": "succeeded",
                    "amount": 3050,
                    "currency": "usd",
                },
                "result": EventResult.QUARANTINED,
                "result_reason": "unknown_object",
            },
        )
        # Held: a dispute waiting for the record of the payment it names to settle.
        ProviderEvent.objects.get_or_create(
            event_id="evt_demo_held",
            defaults={
                "type": "charge.dispute.created",
                "object_id": "dp_demo_held",
                "payload": {
                    "id": "dp_demo_held",
                    "status": "needs_response",
                    "amount": 3050,
                    "currency": "usd",
                },
                "attempts": 4,
                "result": EventResult.HELD,
                "result_reason": "payment_not_settled",
            },
        )
        # Stuck outbox: retried and backed off far into the future (the relay leaves it).
        if not OutboxMessage.objects.filter(
            dedupe_key="demo:stuck", processed_at__isnull=True
        ).exists():
            OutboxMessage.objects.create(
                category=OutboxCategory.NOOP,
                payload={},
                dedupe_key="demo:stuck",
                attempts=7,
                available_at=timezone.now() + timedelta(days=1),
                last_error="demo: handler kept failing",
            )
        # Settlement discrepancy.
        # A balance transaction's source is the charge (ch_…): the demo "complete"
        # purchase's, so the queue row links to it and searching the charge finds it.
        PaymentOperation.objects.filter(provider_reference="pi_demo_complete_0").update(
            provider_charge="ch_demo_complete_0"
        )
        if not SettlementDiscrepancy.objects.filter(
            provider_reference="ch_demo_complete_0", resolved_at__isnull=True
        ).exists():
            SettlementDiscrepancy.objects.create(
                provider_reference="ch_demo_complete_0",
                kind="missing_locally",
                provider_amount=3050,
                ledger_amount=None,
                currency="usd",
                detail="demo: a provider balance transaction with no ledger entry",
            )
        # Refund awaiting approval (requested through the API).
        ref_p = _purchase("refund-awaiting-approval", S.COMPLETED, [_OK], True, client)
        if not ref_p.operations.filter(kind=OperationKind.REFUND).exists():
            PaymentOperation.objects.create(
                purchase=ref_p,
                kind=OperationKind.REFUND,
                amount=1250,
                currency="usd",
                outcome=Oc.AWAITING_APPROVAL,
                requested_by_client=client,
                parent=ref_p.operations.first(),
            )
        # A dispute whose evidence is due tomorrow (the disputes queue), and a refund made
        # in the provider's dashboard waiting to be reviewed (made outside Verity).
        disputed = Purchase.objects.get(customer_reference="demo-disputed")
        Dispute.objects.get_or_create(
            id="dp_demo_disputed",
            defaults={
                "purchase": disputed,
                "payment": _first(disputed.operations.all()),
                "charge": "ch_demo_disputed",
                "payment_intent": "pi_demo_disputed_0",
                "amount": 3050,
                "currency": "usd",
                "reason": "product_not_received",
                "status": "needs_response",
                "funds_withdrawn": 3050,
                "fees": 1500,
                "evidence_due_by": timezone.now() + timedelta(hours=30),
                "purchase_status_before": S.COMPLETED,
            },
        )
        outside = _purchase("refunded-outside-verity", S.REFUNDED, [_OK], True, client)
        if not outside.operations.filter(origin=Origin.PROVIDER).exists():
            PaymentOperation.objects.create(
                purchase=outside,
                kind=OperationKind.REFUND,
                amount=3050,
                currency="usd",
                origin=Origin.PROVIDER,
                provider_reference="re_demo_dashboard",
                parent=outside.operations.first(),
                **_OK,
            )
        # A manual resolution overturned by the provider's record (its own queue), and a
        # duplicate charge with the refund returning it.
        # Fulfilled (completed): what waits for a person here is the payment, not the order.
        over = _purchase("manual-resolution-overturned", S.COMPLETED, [_OK], True, client)
        op = _first(over.operations.all())
        if not op.transitions.filter(cause=OVERTURN_CAUSE).exists():
            PaymentOperation.objects.filter(pk=op.pk).update(next_action_owner="support")
            OperationTransition.objects.create(
                purchase=over,
                operation=op,
                field="outcome",
                source=Oc.FAILED,
                target=Oc.SUCCEEDED,
                cause=OVERTURN_CAUSE,
                actor="webhook:evt_demo_overturn",
                evidence={
                    "overturned": {
                        "outcome": "failed",
                        "actor": "demo-operator",
                        "reason": "demo: buyer said declined",
                    }
                },
            )
        # An x402 payment whose transfer the chain took back after delivery (its queue).
        _purchase(
            "x402-transfer-reversed",
            S.MANUAL_REVIEW,
            [
                {
                    "outcome": Oc.FAILED,
                    "stage": Stage.SETTLED,
                    "grade": Grade.CONFIRMED,
                    "verification": Verification.PROVIDER,
                    "rail": "x402",
                    "reason": "transfer_reversed_on_chain",
                    "next_action_owner": "support",
                    "settled_at": timezone.now(),
                }
            ],
            False,
            client,
        )
        dup = _purchase(
            "duplicate-charge", S.COMPLETED, [_OK, {**_OK, "is_duplicate": True}], True, client
        )
        dup_op = _first(dup.operations.filter(is_duplicate=True))
        if not dup.operations.filter(kind=OperationKind.REFUND).exists():
            PaymentOperation.objects.create(
                purchase=dup,
                kind=OperationKind.REFUND,
                amount=dup_op.amount,
                currency="usd",
                outcome=Oc.PENDING,
                is_compensation=True,
                parent=dup_op,
            )
        _demo_incident()
    return links


def _steps_wait_for_a_person(ref: str, *, done, step: str, state: str, error: str) -> None:
    purchase = Purchase.objects.get(customer_reference=ref)
    order = Order.objects.filter(purchase_id=purchase.pk).first()
    for name in done:
        StepRun.objects.create(
            purchase_id=purchase.pk,
            step=name,
            state=StepState.DONE,
            key=f"demo:{purchase.pk}:{name}",
            attempts=1,
            external_reference=order.reference if (order and name == StepName.ORDER) else "",
            completed_at=timezone.now(),
        )
    StepRun.objects.create(
        purchase_id=purchase.pk,
        step=step,
        state=state,
        key=f"demo:{purchase.pk}:{step}",
        attempts=settings.STEP_MAX_ATTEMPTS,
        last_error=error,
    )


def _demo_purchase_ids() -> list[str]:
    return list(
        Purchase.objects.filter(customer_reference__startswith="demo-").values_list("pk", flat=True)
    )


def demo_cases_reset() -> int:
    """Remove the demo cases of an earlier seed (and what the workflow did to them since),
    so the next seed starts the demo anew. Only `demo-…` purchases and the demo's own
    events, outbox row, discrepancy and incident are touched; the audit log is append-only
    and keeps the history. Returns how many demo purchases were removed."""
    _refuse_outside_development()
    purchase_ids = _demo_purchase_ids()
    op_ids = list(
        PaymentOperation.objects.filter(purchase_id__in=purchase_ids).values_list("pk", flat=True)
    )
    keep_apps = {"audit"}  # append-only: history of what people did to the demo
    with transaction.atomic():
        IncidentItem.objects.filter(incident__title=DEMO_INCIDENT_TITLE).delete()
        Incident.objects.filter(title=DEMO_INCIDENT_TITLE).delete()
        ProviderEvent.objects.filter(event_id__startswith="evt_demo_").delete()
        OutboxMessage.objects.filter(dedupe_key__startswith="demo:").delete()
        SettlementDiscrepancy.objects.filter(provider_reference__startswith="ch_demo_").delete()
        quote_ids = list(
            Purchase.objects.filter(pk__in=purchase_ids).values_list("quote_id", flat=True)
        )
        # Rows that name a demo purchase or operation: by foreign key (payments) or by id
        # (recovery, webhooks, support keep plain ids across app boundaries).
        for model in apps.get_models():
            if model._meta.app_label in keep_apps or model in (Purchase, PaymentOperation):
                continue
            for field in model._meta.concrete_fields:
                target = getattr(field, "related_model", None)
                if target is Purchase or field.name == "purchase_id":
                    model._default_manager.filter(**{f"{field.attname}__in": purchase_ids}).delete()
                elif target is PaymentOperation or field.name in (
                    "operation_id",
                    "compensation_operation_id",
                ):
                    model._default_manager.filter(**{f"{field.attname}__in": op_ids}).delete()
        # Outbox messages carry ids in their payload.
        OutboxMessage.objects.filter(payload__purchase__in=purchase_ids).delete()
        OutboxMessage.objects.filter(payload__operation__in=op_ids).delete()
        ops = PaymentOperation.objects.filter(pk__in=op_ids)
        while ops.exists():  # children (refunds, retries) before the payments they name
            ops.exclude(
                pk__in=PaymentOperation.objects.filter(pk__in=op_ids)
                .exclude(parent=None)
                .values("parent_id")
            ).exclude(
                pk__in=PaymentOperation.objects.filter(pk__in=op_ids)
                .exclude(retry_of=None)
                .values("retry_of_id")
            ).delete()
        Purchase.objects.filter(pk__in=purchase_ids).delete()
        Quote.objects.filter(pk__in=quote_ids).exclude(purchases__isnull=False).delete()
    return len(purchase_ids)


DEMO_INCIDENT_TITLE = "Demo: provider timeouts on payment confirmation"


def _demo_incident() -> None:
    """An open incident with the unknown and escalated demo purchases attached, opened
    through support.services (so it has its audit rows like a real one)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    if Incident.objects.filter(title=DEMO_INCIDENT_TITLE).exists():
        return
    ensure_groups()
    User = get_user_model()
    user = User.objects.filter(username="operator1").first()  # seed_demo's operator
    if user is None:
        user, created = User.objects.get_or_create(username="demo-incident-operator")
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
    user.groups.add(Group.objects.get(name=Role.OPERATOR))
    incident = services.incident_open(
        user=user,
        title=DEMO_INCIDENT_TITLE,
        reason="demo: confirm calls time out after sending; two payments are unknown and "
        "one passed its reconciliation deadline.",
    )
    for ref in ("demo-checking-with-provider", "demo-escalated"):
        purchase = Purchase.objects.get(customer_reference=ref)
        services.incident_attach(
            incident_id=incident.pk,
            ref=purchase.pk,
            user=user,
            reason="demo: affected by the provider timeouts",
        )


DEMO_REFUND_CASE = "demo-refund-awaiting-approval"


def demo_provider_payments_seed() -> str | None:
    """Pay the refund-awaiting-approval case's charge for real at the provider (localstripe
    in `make run`), so finance's approval sends a refund the provider accepts and the page
    ends "refunded", not "refused: no such payment". The seed cannot do it: it runs before
    localstripe starts, and localstripe keeps nothing across runs. Idempotent: a charge
    already backed by a PaymentIntent the provider knows is left alone.

    The PaymentIntent is created (unconfirmed), its id stored, then confirmed, so the
    provider's `payment_intent.succeeded` webhook names an operation Verity already knows
    (like a real dispatch: the id is stored before money can move). Returns its id."""
    _refuse_outside_development()
    op = (
        PaymentOperation.objects.filter(
            purchase__customer_reference=DEMO_REFUND_CASE,
            kind=OperationKind.CHARGE,
            rail=Rail.STRIPE,
        )
        .select_related("purchase")
        .first()
    )
    if op is None:
        return None
    provider = payment_provider(provider_for(op))
    if op.provider_reference and not op.provider_reference.startswith("pi_demo_"):
        found = provider.retrieve_payment_intent(op.provider_reference)
        if found.object is not None and found.object.succeeded:
            return op.provider_reference
    # The metadata Verity's own dispatch writes: the webhook check compares every field.
    metadata = {
        "operation_id": op.pk,
        "purchase_id": op.purchase_id,
        "customer_reference": op.purchase.customer_reference,
    }
    created = provider.create_payment_intent(
        key=f"demo:{op.pk}:{timezone.now().timestamp()}:create",
        amount=op.amount,
        currency=op.currency,
        payment_method="pm_card_visa",
        capture_method="automatic",
        metadata=metadata,
    )
    if created.object is None:
        raise RuntimeError(f"the provider refused the demo payment: {created.error_code}")
    PaymentOperation.objects.filter(pk=op.pk).update(provider_reference=created.object.id)
    confirmed = provider.confirm_payment_intent(
        key=f"demo:{op.pk}:{created.object.id}:confirm", intent_id=created.object.id
    )
    if confirmed.object is None or not confirmed.object.succeeded:
        raise RuntimeError(f"the demo payment did not succeed: {confirmed.error_code}")
    PaymentOperation.objects.filter(pk=op.pk).update(
        provider_charge=confirmed.object.latest_charge or ""
    )
    return created.object.id
