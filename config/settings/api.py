from config.env import env

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["payments.api.parsers.BoundedJSONParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": ["payments.api.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["payments.api.authentication.HasScope"],
    "DEFAULT_THROTTLE_CLASSES": ["payments.api.authentication.ApiClientRateThrottle"],
    "EXCEPTION_HANDLER": "payments.api.problems.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
# Per API client. Generous: a storefront agent polls, and tests hammer the API.
API_THROTTLE_RATE = env("API_THROTTLE_RATE", default="6000/min")

# The throttle (and anything else cached) must be shared by every web process: Redis when
# REDIS_URL is set (compose, tests, production); per-process memory for `make run`.
_REDIS_URL = env("REDIS_URL", default="")
if _REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": _REDIS_URL,
            "KEY_PREFIX": "verity",
            "TIMEOUT": 300,
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

SPECTACULAR_SETTINGS = {
    "TITLE": "Verity storefront API",
    "DESCRIPTION": (
        "Purchases that stay honest when a payment's outcome is uncertain. Every POST that "
        "creates an effect needs an `Idempotency-Key` header; every error is an RFC 9457 "
        "problem document with a stable `code` and a `next_action` to follow literally."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "OutcomeEnum": "payments.enums.Outcome",
        "PurchaseStatusEnum": "payments.enums.PurchaseStatus",
        "ResolutionOutcomeEnum": [("succeeded", "succeeded"), ("failed", "failed")],
        "OwnerEnum": "payments.enums.Owner",
        "RetryAdviceEnum": "payments.enums.RetryAdvice",
        "StageEnum": "payments.enums.Stage",
        "VerificationEnum": "payments.enums.Verification",
        "EventTypeEnum": "events.models.EventType",
    },
}
API_KEY_CUSTOM_HEADER = "HTTP_AUTHORIZATION"
IDEMPOTENCY_LEASE_SECONDS = env.int("IDEMPOTENCY_LEASE_SECONDS", default=30)
# Automatic refunds (no approver) are capped per payment by the client's auto_refund_limit,
# cumulatively, and per client per period (its limit period, else 24 h) at this multiple.
AUTO_REFUND_PERIOD_MULTIPLE = env.int("AUTO_REFUND_PERIOD_MULTIPLE", default=10)
# Failed API-key authentications (payments.api.authentication): per client address and per key
# prefix in this window; past either limit, 429 with Retry-After.
API_AUTH_FAILURE_WINDOW_SECONDS = env.int("API_AUTH_FAILURE_WINDOW_SECONDS", default=900)
API_AUTH_FAILURES_PER_ADDRESS = env.int("API_AUTH_FAILURES_PER_ADDRESS", default=20)
API_AUTH_FAILURES_PER_PREFIX = env.int("API_AUTH_FAILURES_PER_PREFIX", default=50)

# One buyer, one charge (docs/walkthrough.md#api-rules-the-code-relies-on). The same customer
# and basket within this window of a
# paid or unresolved purchase is refused 409 probable_duplicate_purchase (per product:
# Product.duplicate_window_seconds / never_twice). A buyer lifts it on the status page.
DUPLICATE_PURCHASE_WINDOW_SECONDS = env.int("DUPLICATE_PURCHASE_WINDOW_SECONDS", default=24 * 3600)
BUYER_CONFIRMATION_TTL_SECONDS = env.int("BUYER_CONFIRMATION_TTL_SECONDS", default=1800)
# Payment attempts (the first payment plus its retries) per purchase; then support owns it.
PAYMENT_ATTEMPTS_MAX = env.int("PAYMENT_ATTEMPTS_MAX", default=3)
# A verified API client is kept per key prefix in each web process for this long
# (payments.client_cache): revocation in another process takes effect within it. 0 = off.
API_CLIENT_CACHE_SECONDS = env.float("API_CLIENT_CACHE_SECONDS", default=5.0)
