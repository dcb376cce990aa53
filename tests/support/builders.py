"""Direct model setup for preconditions only (states a test starts from)."""

from __future__ import annotations

from payments.enums import Grade, OperationKind, Outcome, PurchaseStatus, Stage, Verification
from payments.models import PaymentOperation
from recovery.models import Order
from tests.factories import PurchaseFactory, QuoteFactory


def purchase_in(
    status: str = PurchaseStatus.AWAITING_PAYMENT,
    *,
    ops=(),
    order: str | None = None,
    items=None,
    **kw,
):
    """A purchase in `status` with operations given as dicts of model fields."""
    quote = QuoteFactory(
        items=items or [{"sku": "LAMP-1", "name": "Desk lamp", "quantity": 2, "unit_price": 750}],
        amount=1500,
    )
    purchase = PurchaseFactory(quote=quote, status=status, **kw)
    for fields in ops:
        fields = dict(fields)
        fields.setdefault("kind", OperationKind.CHARGE)
        fields.setdefault("amount", purchase.amount)
        fields.setdefault("currency", purchase.currency)
        PaymentOperation.objects.create(purchase=purchase, **fields)
    if order:
        Order.objects.create(purchase_id=purchase.pk, reference=order)
    return purchase


SUCCEEDED = {
    "outcome": Outcome.SUCCEEDED,
    "stage": Stage.SETTLED,
    "grade": Grade.CONFIRMED,
    "verification": Verification.PROVIDER,
    "provider_reference": "pi_test_ok",
}
FAILED = {
    "outcome": Outcome.FAILED,
    "stage": Stage.SETTLED,
    "grade": Grade.CONFIRMED,
    "verification": Verification.PROVIDER,
    "reason": "card_declined",
    "provider_reference": "pi_test_declined",
}
UNKNOWN = {
    "outcome": Outcome.UNKNOWN,
    "stage": Stage.RECONCILING,
    "provider_reference": "pi_test_unknown",
}
