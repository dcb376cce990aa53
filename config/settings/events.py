"""Storefront events and webhook endpoints (docs/events.md)."""

from config.env import env

from .base import DEBUG, SECRET_KEY

# Webhook signing secrets are derived from this key and a per-endpoint salt (events.secrets):
# the database alone holds no usable secret. Changing it changes every endpoint's secret.
EVENTS_SECRET_KEY = env("EVENTS_SECRET_KEY", default="") or SECRET_KEY
# Retries stop this long after an event's first attempt (Stripe's window: 3 days).
WEBHOOK_RETRY_SECONDS = env.int("WEBHOOK_RETRY_SECONDS", default=3 * 86400)
# Delay before attempt n+1 (the last value repeats): 5 s, 5 min, 30 min, 2 h, 5 h, 10 h.
WEBHOOK_RETRY_SCHEDULE_SECONDS = env.list(
    "WEBHOOK_RETRY_SCHEDULE_SECONDS", cast=float, default=[5, 300, 1800, 7200, 18000, 36000]
)
# An endpoint whose every attempt has failed for this long is disabled, its owner told.
WEBHOOK_DISABLE_AFTER_SECONDS = env.int("WEBHOOK_DISABLE_AFTER_SECONDS", default=3 * 86400)
WEBHOOK_CONNECT_TIMEOUT_SECONDS = env.float("WEBHOOK_CONNECT_TIMEOUT_SECONDS", default=3.0)
WEBHOOK_READ_TIMEOUT_SECONDS = env.float("WEBHOOK_READ_TIMEOUT_SECONDS", default=10.0)
# What is read of a receiver's answer (the rest is dropped unread).
WEBHOOK_RESPONSE_BYTES = env.int("WEBHOOK_RESPONSE_BYTES", default=4096)
# A claimed delivery is taken again after this long (a worker that died mid-send).
WEBHOOK_LEASE_SECONDS = env.int("WEBHOOK_LEASE_SECONDS", default=60)
# Deliveries sent side by side by one worker (each endpoint keeps its own bound too).
WEBHOOK_SEND_THREADS = env.int("WEBHOOK_SEND_THREADS", default=8)
# Development and tests only: receivers on 127.0.0.1/::1 are allowed. Private, link-local
# and other reserved addresses stay refused whatever this says.
WEBHOOK_ALLOW_LOOPBACK = env.bool("WEBHOOK_ALLOW_LOOPBACK", default=DEBUG)
# Events older than this are pruned (the feed keeps them as long: docs/events.md).
EVENTS_RETENTION_DAYS = env.int("EVENTS_RETENTION_DAYS", default=30)
# The feed shows events at least this old: a transaction that committed late cannot have
# an event behind a cursor a reader already passed (money transactions are short).
EVENTS_FEED_SETTLE_SECONDS = env.float("EVENTS_FEED_SETTLE_SECONDS", default=1.0)
# The longest a long-poll (GET /api/v1/events?wait=, the MCP wait tool) holds a request.
EVENTS_WAIT_MAX_SECONDS = env.float("EVENTS_WAIT_MAX_SECONDS", default=25.0)
