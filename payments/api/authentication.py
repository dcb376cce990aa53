"""`Authorization: Api-Key <key>` -> the ApiClient, plus scope permissions and throttling.

djangorestframework-api-key ships a *permission* class only; this authentication class
returns the ApiClient as both `request.user` and `request.auth`, so throttles, audit rows
and ownership checks key on the client (docs/architecture.md#stack-traps).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.cache import cache
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.throttling import SimpleRateThrottle

from config.client_address import client_address

from ..client_cache import api_client_cached, api_client_verified
from ..models import ApiClient
from .ratelimit import lockout_locked, rate_limit_hit

logger = logging.getLogger(__name__)

KEYWORD = "Api-Key"


def _failure_keys(request, key: str) -> list[tuple[str, int]]:
    """(cache key, limit) for each thing failed authentications are counted against: the
    client address (config.client_address: TRUSTED_PROXY_COUNT applies) and the key's
    prefix (the part before the dot, which names one ApiClient)."""
    keys = [
        (
            f"api-auth-fail:ip:{client_address(request) or '-'}",
            settings.API_AUTH_FAILURES_PER_ADDRESS,
        )
    ]
    prefix = key.partition(".")[0][:16] if "." in key else ""
    if prefix:
        keys.append((f"api-auth-fail:prefix:{prefix}", settings.API_AUTH_FAILURES_PER_PREFIX))
    return keys


def _refuse_if_too_many_failures(keys: list[tuple[str, int]]) -> None:
    try:
        locked = lockout_locked(keys)
    except Exception:  # noqa: BLE001 - the cache is Redis; an outage must not 500
        logger.warning("auth-failure cache unavailable; not throttled", exc_info=True)
        return
    if locked:
        raise lockout_refusal()


def lockout_refusal() -> exceptions.Throttled:
    return exceptions.Throttled(wait=settings.API_AUTH_FAILURE_WINDOW_SECONDS)


# Set on the DRF request when the lockout check is left to the throttle's round trip.
DEFERRED_LOCKOUT = "_verity_deferred_lockout"


def _throttled_by_us(request) -> bool:
    view = (getattr(request, "parser_context", None) or {}).get("view")
    return view is not None and ApiClientRateThrottle in getattr(view, "throttle_classes", ())


def refuse_deferred_lockout(request) -> None:
    """A request whose lockout check was deferred is refused for another reason first (a
    missing scope): check the lockout now, so a locked prefix still answers 429 first."""
    keys = getattr(request, DEFERRED_LOCKOUT, None)
    if keys:
        setattr(request, DEFERRED_LOCKOUT, None)
        _refuse_if_too_many_failures(keys)


def _record_failure(keys: list[tuple[str, int]]) -> None:
    window = settings.API_AUTH_FAILURE_WINDOW_SECONDS
    try:
        for k, _ in keys:
            cache.add(k, 0, timeout=window)  # the window starts at the first failure
            cache.incr(k)
    except Exception:  # noqa: BLE001
        logger.warning("auth-failure cache unavailable; failure not counted", exc_info=True)


class ApiKeyAuthentication(BaseAuthentication):
    """Failed authentications are throttled per address and per key prefix: past the
    limit the answer is 429 with Retry-After, before any hash is checked.
    A prefix over its limit is refused even with the right secret until the window ends —
    the usual lockout trade-off; limits are settings."""

    keyword = KEYWORD

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, key = header.partition(" ")
        key = key.strip()
        keys = _failure_keys(request, key)
        if scheme.lower() == self.keyword.lower() and key and _throttled_by_us(request):
            # A key verified within the cache window costs no query and no hash,
            # so the lockout check (which exists to stop hash checks and guesses) can wait
            # for the throttle's Redis round trip, the same script (payments.api.ratelimit);
            # a locked prefix is still refused 429 before anything else is answered.
            client = api_client_cached(key)
            if client is not None:
                setattr(request, DEFERRED_LOCKOUT, keys)
                return (client, client)
        _refuse_if_too_many_failures(keys)
        if scheme.lower() != self.keyword.lower() or not key:
            _record_failure(keys)
            raise exceptions.AuthenticationFailed()
        try:
            # get_from_key checks the hash, revocation and expiry (is_valid); a client
            # verified in the last few seconds comes from payments.client_cache.
            client = api_client_verified(key)
        except ApiClient.DoesNotExist:
            _record_failure(keys)
            raise exceptions.AuthenticationFailed() from None
        return (client, client)

    def authenticate_header(self, request):
        # Makes DRF answer 401 (not 403) when the header is missing or wrong.
        return f'{self.keyword} realm="api"'


def api_client_of(request) -> ApiClient | None:
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, ApiClient) else None


class HasScope(BasePermission):
    """Requires an authenticated ApiClient holding `view.required_scopes[method]`.

    Views declare e.g. `required_scopes = {"GET": "purchases:read"}`; a method missing from
    the map needs only authentication.
    """

    message = "This API key lacks the scope required for this request."

    def has_permission(self, request, view) -> bool:
        client = api_client_of(request)
        if client is None:
            return False  # DRF raises NotAuthenticated (no successful authenticator)
        scope = getattr(view, "required_scopes", {}).get(request.method)
        if scope and not client.has_scope(scope):
            refuse_deferred_lockout(request)
            self.message = f"This API key lacks the '{scope}' scope."
            return False
        return True


# Set on the Django request by payments.api.fast_path when it counted this request against the
# limit and then handed it to the DRF view: the limit is counted once.
COUNTED = "_verity_rate_decision"


class ApiClientRateThrottle(SimpleRateThrottle):
    """Per API client (or per address before authentication), in the shared cache.

    The default throttle cache is per process; CACHES["default"] is Redis when REDIS_URL is
    set, so every web process counts against the same window.
    """

    scope = "api_client"

    def get_rate(self):
        return settings.API_THROTTLE_RATE

    def allow_request(self, request, view):
        # Read the rate on every request so it can be changed by settings (and in tests).
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        # O(1): one pipelined Redis round trip (payments.api.ratelimit), not DRF's pickled
        # history of every request time in the window.
        decision = getattr(request, COUNTED, None)  # counted by the fast path already
        if decision is None:
            lock_keys = getattr(request, DEFERRED_LOCKOUT, None) or ()
            try:
                decision = rate_limit_hit(
                    ident=self.get_cache_key(request, view),
                    limit=self.num_requests,
                    window_seconds=self.duration,
                    lock_keys=lock_keys,
                )
            except Exception:  # noqa: BLE001 - the cache is Redis; an outage must not 500
                logger.warning("throttle cache unavailable; request allowed", exc_info=True)
                return True
        if decision.locked:
            raise lockout_refusal()
        self._wait = decision.wait_seconds
        return decision.allowed

    def wait(self):
        return getattr(self, "_wait", None)

    def get_cache_key(self, request, view):
        client = api_client_of(request)
        ident = f"client:{client.pk}" if client is not None else f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


try:  # documents the scheme in /api/schema/ (registration happens on import)
    from drf_spectacular.extensions import OpenApiAuthenticationExtension

    class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
        target_class = "payments.api.authentication.ApiKeyAuthentication"
        name = "ApiKey"

        def get_security_definition(self, auto_schema):
            return {
                "type": "apiKey",
                "in": "header",
                "name": "Authorization",
                "description": "`Api-Key <key>` (keys are shown once at creation).",
            }
except ImportError:  # pragma: no cover - drf-spectacular is a dependency
    pass
