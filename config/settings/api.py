from config.env import env

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Verity storefront API",
    "DESCRIPTION": "Purchases that stay honest when a payment's outcome is uncertain.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
}
API_KEY_CUSTOM_HEADER = "HTTP_AUTHORIZATION"
IDEMPOTENCY_LEASE_SECONDS = env.int("IDEMPOTENCY_LEASE_SECONDS", default=30)
