"""The one provider ingestion endpoint: verify, insert once, hand to the outbox, answer.

A plain Django view (not DRF: the signature is over the exact bytes of the body, which
must be read before anything parses it) and CSRF-exempt (the caller is Stripe, the
signature is the authentication). It is NOT wrapped in a request-wide transaction:
verification writes nothing, and the only writes (the event row and its outbox row)
are one explicit `atomic()` in `event_ingest`, so a refused delivery never opens one
and an accepted one commits before the 200 is sent.
"""

import logging

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from payments.providers.stripe.webhooks import WebhookVerificationError, verify_and_parse

from .metrics import (
    VERIFICATION_FAILURES,
    WEBHOOK_DUPLICATE,
    WEBHOOK_FAILURES,
    WEBHOOK_RECEIVED,
    WEBHOOK_RESULTS,
    WebhookFailure,
)
from .services import event_ingest

log = logging.getLogger(__name__)

# The two answers to an accepted delivery, encoded once (JsonResponse's bytes for the same
# dicts): every delivery gets one of them.
_ACCEPTED = {
    duplicate: JsonResponse({"received": True, "duplicate": duplicate}).content
    for duplicate in (False, True)
}


@csrf_exempt
@require_POST
def stripe_webhook(request):
    try:
        return _receive(request)
    except Exception:
        # A delivery Verity failed to store is a 500 (the provider retries it), and it is
        # counted: an endpoint that 500s every delivery must page, not go unnoticed.
        WEBHOOK_FAILURES.labels(reason=WebhookFailure.SERVER_ERROR.value).inc()
        raise


def _receive(request):
    try:
        event = verify_and_parse(
            request.body,
            # META, not request.headers (which builds a dict of every header first).
            request.META.get("HTTP_STRIPE_SIGNATURE"),
            settings.STRIPE_WEBHOOK_SECRETS,
            settings.STRIPE_WEBHOOK_TOLERANCE,
        )
    except WebhookVerificationError as exc:
        WEBHOOK_RESULTS.labels(result=exc.reason).inc()
        failure = VERIFICATION_FAILURES.get(exc.reason, WebhookFailure.MALFORMED)
        WEBHOOK_FAILURES.labels(reason=failure.value).inc()
        # Neither the body nor the header is logged: a forged body may carry anything.
        log.warning("webhook refused reason=%s", exc.reason)
        return JsonResponse({"error": exc.reason}, status=400)
    inserted = event_ingest(event=event)
    (WEBHOOK_RECEIVED if inserted else WEBHOOK_DUPLICATE).inc()
    log.info(
        "webhook accepted event=%s type=%s duplicate=%s", event["id"], event["type"], not inserted
    )
    return HttpResponse(_ACCEPTED[not inserted], content_type="application/json")
