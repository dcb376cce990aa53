"""Prometheus counters (default registry; /metrics is served by recovery.urls)."""
from prometheus_client import Counter

# result: ingestion (received, duplicate, missing_signature, bad_signature,
# stale_signature, malformed) and processing (applied, held, ignored, quarantined).
WEBHOOK_RESULTS = Counter(
    "verity_webhook_results", "Stripe webhook deliveries and processing results", ["result"],
)
