import pytest

from payments import services
from tests.factories import ProductFactory, make_client


@pytest.fixture
def client_and_key(db):
    return make_client(limit=1_000_000)


@pytest.fixture
def api_client(client_and_key):
    return client_and_key[0]


@pytest.fixture
def new_purchase(api_client):
    """Factory: a purchase for a fresh customer through the real services."""
    counter = {"n": 0}

    def make(price=1500, quantity=1, customer=None):
        counter["n"] += 1
        product = ProductFactory(price=price)
        quote = services.quote_create(api_client=api_client,
                                      items=[{"sku": product.sku, "quantity": quantity}],
                                      currency="usd")
        return services.purchase_create(
            api_client=api_client, quote_id=quote.id, quote_version=quote.version,
            customer_reference=customer or f"cust-{counter['n']}-{quote.id[-6:]}",
            customer_email="buyer@example.com")

    return make


