"""Fault-drill runner (python -m tools.drill): one fresh purchase per drill, test mode only."""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from . import services
from .clients import api_client_create
from .enums import Outcome, Rail, Verification
from .models import ApiClient, PaymentOperation, Product, PurchaseChannel
from .providers.stripe import DrillMode, StripeProvider

DRILLS = [
    DrillMode.DROP_RESPONSE_AFTER_SEND,
    DrillMode.TIMEOUT_BEFORE_SEND,
    DrillMode.RESET_AFTER_WRITE,
    DrillMode.HTTP_500,
    DrillMode.HTTP_409,
]


@dataclass
class DrillRow:
    drill: str
    purchase: str
    recorded: str
    charges: int
    after_reconcile: str
    verification: str
    violation: str = ""


def _drill_client() -> ApiClient:
    client = ApiClient.objects.filter(name="fault-drill", revoked=False).first()
    if client is None:
        client, _ = api_client_create(
            name="fault-drill", scopes=["purchases:write"], currency="usd"
        )
    return client


def drills_run(*, modes=DRILLS) -> list[DrillRow]:
    provider = services.provider_for_rail(Rail.STRIPE)
    assert isinstance(provider, StripeProvider)  # the Stripe rail's adapter arms drills
    client = _drill_client()
    product, _ = Product.objects.get_or_create(
        sku="DRILL-001", defaults={"name": "Fault drill item", "price": 1000, "stock": 10**9}
    )
    rows = []
    for mode in modes:
        quote = services.quote_create(
            api_client=client,
            items=[{"sku": product.sku, "quantity": 1}],
            currency=product.currency,
        )
        purchase = services.purchase_create(
            api_client=client,
            quote_id=quote.id,
            quote_version=quote.version,
            customer_reference=f"drill-{mode}-{timezone.now().timestamp():.0f}-{quote.id[-4:]}",
            channel=PurchaseChannel.DRILL,
        )
        op = services.payment_create(
            purchase_id=purchase.id, api_client=client, payment_method="pm_card_visa"
        )
        # The step that can move money: `pay` where the provider dedupes keys (one round
        # trip), else `confirm`.
        provider.arm_drill(
            key_prefix=op.idempotency_key, step=services.payment_money_step(op), mode=mode
        )
        op = services.operation_dispatch(operation_id=op.id)
        recorded = op.outcome
        if not op.is_terminal:
            op = services.operation_reconcile(operation_id=op.id, actor="drill")
        charges = provider.count_succeeded_for_purchase(purchase.id)
        row = DrillRow(mode, purchase.id, recorded, charges, op.outcome, op.verification)
        if charges > 1:
            row.violation = "more than one charge"
        elif op.outcome == Outcome.SUCCEEDED and charges != 1:
            row.violation = "succeeded without a provider charge"
        elif op.outcome == Outcome.FAILED and charges:
            row.violation = "failed but the provider charged"
        elif (
            recorded == Outcome.UNKNOWN
            and op.is_terminal
            and op.verification not in (Verification.PROVIDER, Verification.WEBHOOK)
        ):
            row.violation = "unknown settled without evidence"
        assert PaymentOperation.objects.filter(purchase=purchase).count() == 1
        rows.append(row)
    return rows
