"""Demo: make one payment whose outcome is unknown, to follow through the API.

Uses the `drop_response_after_send` fault drill (test-mode keys only; refused for live
keys): the provider really applies the charge, Verity never sees the answer, so the
operation is `unknown` until a read-back settles it. Prints the ids to poll with curl.
"""

import secrets

from django.core.management.base import BaseCommand, CommandError

from payments import services
from payments.enums import Rail
from payments.models import ApiClient, Product, PurchaseChannel
from payments.providers.stripe import DrillMode, DrillRefused


class Command(BaseCommand):
    help = "Create a purchase whose payment outcome is unknown (fault drill, test mode only)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--client", default="demo-storefront", help="API client name that owns the purchase"
        )
        parser.add_argument("--sku", default=None, help="product sku (default: first)")

    def handle(self, *args, client, sku, **options):
        api_client = (
            ApiClient.objects.filter(name=client, revoked=False).order_by("-created").first()
        )
        if api_client is None:
            raise CommandError(f"no active API client named {client!r}")
        products = Product.objects.order_by("sku")
        product = products.filter(sku=sku).first() if sku else products.first()
        if product is None:
            raise CommandError("no product: run seed_demo first")
        quote = services.quote_create(
            api_client=api_client,
            currency=product.currency,
            items=[{"sku": product.sku, "quantity": 1}],
        )
        purchase = services.purchase_create(
            api_client=api_client,
            quote_id=quote.id,
            quote_version=quote.version,
            customer_reference=f"demo-{secrets.token_hex(4)}",
            customer_email="demo@example.com",
            channel=PurchaseChannel.DRILL,
        )
        op = services.payment_create(
            purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
        )
        try:
            services.provider_for_rail(Rail.STRIPE).arm_drill(
                key_prefix=op.idempotency_key,
                step="confirm",
                mode=DrillMode.DROP_RESPONSE_AFTER_SEND,
            )
        except DrillRefused as exc:
            raise CommandError(str(exc)) from exc
        op = services.operation_dispatch(operation_id=op.id)
        self.stdout.write(f"purchase  {purchase.id}")
        self.stdout.write(f"operation {op.id}  outcome={op.outcome}")
        self.stdout.write(f"follow:   GET /api/v1/operations/{op.id}")
