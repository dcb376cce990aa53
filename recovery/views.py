"""GET /metrics: Prometheus text format from the default registry (no auth: it reveals
counts and ages, never ids, amounts per customer or payloads). Restrict at the proxy."""
from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from .metrics import register_database_collector


@require_GET
def metrics(request):
    register_database_collector()
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
