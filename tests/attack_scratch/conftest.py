"""Fixtures of the scratch attacks on the one-call payment: the payments folder's own."""
from tests.payments.conftest import api_client, client_and_key, new_purchase  # noqa: F401
