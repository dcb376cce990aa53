"""Fixtures of the scratch attacks on the money path: the payments folder's own."""
from tests.payments.conftest import api_client, client_and_key, new_purchase  # noqa: F401
from tests.recovery.test_goods_follow_the_money import shop, webhook_secrets  # noqa: F401
