"""Liveness and readiness probes (no auth; they reveal nothing but up/down)."""
from django.conf import settings
from django.db import connection
from kombu import Connection
from django.http import JsonResponse


def healthz(request):
    return JsonResponse({"status": "ok"})


def readyz(request):
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception:  # any failure means not ready; the reason stays in logs
        checks["database"] = "unavailable"
    try:
        with Connection(settings.CELERY_BROKER_URL,
                        transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
                        connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
    except Exception:
        checks["broker"] = "unavailable"
    ready = all(v == "ok" for v in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks},
                        status=200 if ready else 503)
