"""factory-boy factories shared by every test package."""

from datetime import timedelta

import factory
from django.utils import timezone

from payments.clients import api_client_create
from payments.models import Product, Purchase, Quote


def make_client(
    *,
    scopes=("purchases:read", "purchases:write", "refunds:write"),
    limit=1_000_000,
    currency="usd",
    name="storefront",
    **kw,
):
    """Returns (ApiClient, plaintext key)."""
    return api_client_create(name=name, scopes=list(scopes), limit=limit, currency=currency, **kw)


class ProductFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Product

    sku = factory.Sequence(lambda n: f"SKU-{n:04d}")
    name = factory.LazyAttribute(lambda o: f"Product {o.sku}")
    price = 1500
    currency = "usd"
    stock = 100


class QuoteFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Quote

    items = factory.LazyFunction(
        lambda: [{"sku": "SKU-X", "name": "X", "quantity": 1, "unit_price": 1500}]
    )
    amount = 1500
    currency = "usd"
    version = 1
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=30))


class PurchaseFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Purchase

    quote = factory.SubFactory(QuoteFactory)
    amount = factory.SelfAttribute("quote.amount")
    currency = factory.SelfAttribute("quote.currency")
    customer_reference = factory.Sequence(lambda n: f"cust-{n}")
    customer_email = factory.LazyAttribute(lambda o: f"{o.customer_reference}@example.com")
