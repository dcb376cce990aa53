"""Prometheus counters (default registry; /metrics is served by recovery.urls)."""

from enum import StrEnum

from prometheus_client import Counter

# result: ingestion (received, duplicate, missing_signature, bad_signature,
# stale_signature, malformed) and processing (applied, held, ignored, quarantined).
WEBHOOK_RESULTS = Counter(
    "verity_webhook_results",
    "Stripe webhook deliveries and processing results",
    ["result"],
)
# The two results every accepted delivery counts, bound once (labels() takes a lock and
# looks the series up on every call).
WEBHOOK_RECEIVED = WEBHOOK_RESULTS.labels(result="received")
WEBHOOK_DUPLICATE = WEBHOOK_RESULTS.labels(result="duplicate")


class WebhookFailure(StrEnum):
    """Why a webhook request was not accepted (the `reason` label; never renamed)."""

    BAD_SIGNATURE = "bad_signature"  # missing, unparsable or not matching any secret
    STALE = "stale"  # signed outside the tolerance (replay, or clock skew)
    MALFORMED = "malformed"  # signed, but not an event Verity can store
    SERVER_ERROR = "server_error"  # Verity failed (a 500): the provider retries, we page


# Refused (4xx) and failed (5xx) webhook requests, by reason. A per-process counter in the
# web process (a refused or failed request leaves no row to count at scrape time).
# Alerts: deploy/prometheus/alerts.yml (VerityWebhookServerErrors pages on any 500).
WEBHOOK_FAILURES = Counter(
    "verity_webhook_failures",
    "Webhook requests refused or failed, by reason",
    ["reason"],
)

for _reason in WebhookFailure:  # every series exists from the start (at 0) for increase()
    WEBHOOK_FAILURES.labels(reason=_reason.value)

VERIFICATION_FAILURES = {
    "missing_signature": WebhookFailure.BAD_SIGNATURE,
    "bad_signature": WebhookFailure.BAD_SIGNATURE,
    "stale_signature": WebhookFailure.STALE,
    "malformed": WebhookFailure.MALFORMED,
}
