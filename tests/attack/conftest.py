"""Fixtures of the attack tests (issue 30 part C): the payments folder's own."""
from tests.payments.conftest import api_client, client_and_key, new_purchase  # noqa: F401
