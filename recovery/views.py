"""GET /metrics: Prometheus text format from the default registry. It reveals counts and
ages (business volume), never ids, amounts per customer or payloads — and each scrape
queries the database — so it answers only a scraper that presents METRICS_TOKEN as a
bearer token or comes from METRICS_ALLOWED_NETWORKS (default: loopback). Others get 404,
before any query."""

import hmac
import ipaddress

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from config.client_address import client_address
from config.db_router import replica_reads

from .metrics import register_database_collector
from .retention import register_retention_collector


def _scraper_allowed(request: HttpRequest) -> bool:
    token = getattr(settings, "METRICS_TOKEN", "")
    if token:
        sent = request.headers.get("Authorization", "")
        if sent.startswith("Bearer ") and hmac.compare_digest(sent[7:].encode(), token.encode()):
            return True
    address = client_address(request)
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(
        ip in ipaddress.ip_network(net, strict=False)
        for net in getattr(settings, "METRICS_ALLOWED_NETWORKS", ())
    )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _scraper_allowed(request):
        raise Http404
    register_database_collector()
    register_retention_collector()
    # Counts and ages for dashboards and alerts: from the streaming replica when one is
    # configured and fresh (config/db_router.py); nothing here decides money.
    with replica_reads():
        body = generate_latest(REGISTRY)
    response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
