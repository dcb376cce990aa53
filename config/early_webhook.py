"""The provider's webhook answered before the middleware it never uses.

A delivery is a cookie-less POST, CSRF-exempt, authenticated by its own signature over
the body (webhooks.views): the session, CSRF, authentication, session-lifetime and
messages middleware do nothing for it but cost CPU on every delivery. This middleware
sits where payments.api.fast_path.FastPathMiddleware does — after Security, WhiteNoise,
Common and XFrameOptions, whose checks and headers every answer keeps — and calls the
webhook view itself for a cookie-less POST that resolves to it. Everything else goes on
down the chain unchanged, and so does every request under DEBUG.

DatabaseUnavailableMiddleware, innermost in the chain, is skipped too, so its answer is
given here: a database error from the view is the same 503 + Retry-After
(config.db_unavailable.database_unavailable_response); any other error propagates as it
would from the chain (Django's handler makes it a 500). The view runs once either way:
a declined or failed request is never handed on to the chain.
"""

from __future__ import annotations

import functools

from django.conf import settings
from django.urls import Resolver404, get_resolver, get_urlconf

from .db_unavailable import database_unavailable_response

# The views answered here, by URL name: plain Django views that need no session, CSRF
# token, user or message (webhooks.views.stripe_webhook checks the provider's signature).
EARLY_VIEWS = frozenset({"webhooks:stripe"})


class EarlyWebhookMiddleware:
    _PREFIX = "/webhooks/"

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        # Not under DEBUG: Django's technical error page reads request.user, which only the
        # chain sets (it loads the session: `Vary: Cookie`); a developer's error page is
        # the chain's, byte for byte.
        if (
            request.method == "POST"
            and request.path_info.startswith(self._PREFIX)
            and not request.COOKIES
            and not settings.DEBUG
        ):
            match = _early_match(get_resolver(get_urlconf()), request.path_info)
            if match is not None:
                request.resolver_match = match  # as Django's handler sets it
                try:
                    return match.func(request, *match.args, **match.kwargs)
                except Exception as exc:
                    response = database_unavailable_response(request, exc)
                    if response is None:
                        raise
                    return response
        return self.get_response(request)


@functools.lru_cache(maxsize=64)
def _early_match(resolver, path_info: str):
    """The ResolverMatch of `path_info` when its view is one of EARLY_VIEWS, else None; per
    resolver (a changed ROOT_URLCONF or `clear_url_caches()` gives a new one)."""
    try:
        match = resolver.resolve(path_info)
    except Resolver404:
        return None
    return match if match.view_name in EARLY_VIEWS else None


__all__ = ["EARLY_VIEWS", "EarlyWebhookMiddleware"]
