"""Liveness and readiness probes (no auth; they reveal nothing but up/down).

The broker check is bounded and cached: a probe must never hold a web
worker for seconds while Redis is unreachable, or a broker outage becomes a web outage.
One check per READYZ_CACHE_SECONDS per process and broker URL, each with a timeout of
READYZ_BROKER_TIMEOUT seconds; concurrent probes wait for the one in flight, not a new one.
"""

import threading
import time
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from kombu import Connection

_broker_lock = threading.Lock()
_broker_checked: dict[str, tuple[float, str]] = {}


def healthz(request):
    return JsonResponse({"status": "ok"})


def _broker_probe(url: str, timeout: float) -> str:
    try:
        if urlsplit(url).scheme in ("redis", "rediss"):
            import redis

            client = redis.Redis.from_url(
                url, socket_connect_timeout=timeout, socket_timeout=timeout, retry_on_timeout=False
            )
            try:
                client.ping()
            finally:
                client.close()
        else:
            with Connection(
                url,
                transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
                connect_timeout=timeout,
            ) as conn:
                conn.ensure_connection(max_retries=0, timeout=timeout)
        return "ok"
    except Exception:  # any failure means not ready; the reason stays in logs
        return "unavailable"


def broker_status() -> str:
    url = settings.CELERY_BROKER_URL
    ttl = getattr(settings, "READYZ_CACHE_SECONDS", 5.0)
    with _broker_lock:
        seen = _broker_checked.get(url)
        if seen and time.monotonic() - seen[0] < ttl:
            return seen[1]
        status = _broker_probe(url, getattr(settings, "READYZ_BROKER_TIMEOUT", 0.5))
        _broker_checked[url] = (time.monotonic(), status)
        return status


def readyz(request):
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception:  # any failure means not ready; the reason stays in logs
        checks["database"] = "unavailable"
    checks["broker"] = broker_status()
    ready = all(v == "ok" for v in checks.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503
    )
