"""Retention fixtures: real purchases and operations through the payments core."""
from tests.recovery.conftest import api_client, new_purchase  # noqa: F401  (fixtures)
