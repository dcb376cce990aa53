"""Verity's settings with config.early_webhook.EarlyWebhookMiddleware removed: the whole
chain, for gunicorn in tests/webhooks/test_early_webhook_gunicorn.py."""

from config.settings import *  # noqa: F401,F403
from config.settings import MIDDLEWARE as _SHIPPED

MIDDLEWARE = [m for m in _SHIPPED if m != "config.early_webhook.EarlyWebhookMiddleware"]
