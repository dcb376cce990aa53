"""HTTP plumbing shared by the console and the customer page: security headers, the
one permission gate for console views, client IP, static assets served by Verity.

No inline script or style anywhere: the Content-Security-Policy below forbids them, and
every asset is served from this origin (no third-party hosts).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from functools import wraps
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import render
from django.views.decorators.http import require_GET

from config.client_address import client_address
from config.db_router import replica_configured, replica_reads
from support import access

_CSP_BASE = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)


def content_security_policy(*, form_targets: tuple[str, ...] = ()) -> str:
    # form-action also governs where a form's redirect may land (Chromium enforces it),
    # so the customer page adds the storefront's origin for "pay again".
    targets = " ".join(("'self'", *form_targets))
    return f"{_CSP_BASE}; form-action {targets}"


def storefront_origin() -> str | None:
    parts = urlsplit(getattr(settings, "STOREFRONT_CHECKOUT_URL", "") or "")
    if parts.scheme in ("http", "https") and parts.netloc:
        return f"{parts.scheme}://{parts.netloc}"
    return None


def secure_headers(
    response: HttpResponse,
    *,
    form_targets: tuple[str, ...] = (),
    cache: str = "no-store",
    referrer: str = "same-origin",
) -> HttpResponse:
    # setdefault: a response that is not a page (a chart image) may bring a stricter one.
    response.setdefault(
        "Content-Security-Policy", content_security_policy(form_targets=form_targets)
    )
    response["X-Content-Type-Options"] = "nosniff"
    # same-origin, not no-referrer: with no-referrer browsers send `Origin: null` on form
    # posts and Django's CSRF origin check (rightly) refuses them.
    response["Referrer-Policy"] = referrer
    response["X-Frame-Options"] = "DENY"
    response["Cross-Origin-Opener-Policy"] = "same-origin"
    response["Permissions-Policy"] = "camera=(), microphone=(), geolocation=(), payment=()"
    if cache:
        response["Cache-Control"] = cache
    return response


def client_ip(request) -> str | None:
    # REMOTE_ADDR, or the address TRUSTED_PROXY_COUNT proxies vouch for (never a
    # client-written X-Forwarded-For entry): it keys the lockout and goes into the audit log.
    return client_address(request)


def console_view(action: access.Action, *, post: bool = False):
    """The one gate for console views: login, then access.require(action), then headers.

    Anonymous users are sent to the login page; a signed-in user whose roles lack the
    action gets 403 (the button being hidden is not the protection).
    """

    def decorator(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return secure_headers(redirect_to_login(request.get_full_path()))
            if post and request.method != "POST":
                return secure_headers(HttpResponseNotAllowed(["POST"]))
            try:
                access.require(request.user, action)
                response = console_read(view, request, post, *args, **kwargs)
            except PermissionDenied:
                response = not_allowed(request, action)
            except Http404:
                response = render(request, "console/404.html", status=404)
            return pin_primary_after_post(secure_headers(response), request, post=post)

        wrapper.console_action = action
        return wrapper

    return decorator


# After an action, this browser's pages read the primary for a while, so the page the action
# redirects to shows the action even while the replica replays it (read-your-writes).
PRIMARY_PIN_COOKIE = "verity_primary_until"
PRIMARY_PIN_SECONDS = 15


def console_reads(request, *, post: bool):
    """A console page (GET) reads the streaming replica when one is configured and fresh
    (config/db_router.py); an action (POST) — and every page for PRIMARY_PIN_SECONDS after
    this browser's last action — reads the primary. Permissions were checked before, on the
    primary. Actions decide on the primary under their own locks, whatever a page showed."""
    if post or request.method not in ("GET", "HEAD") or not replica_configured():
        return nullcontext()
    try:
        if float(request.COOKIES.get(PRIMARY_PIN_COOKIE, "0")) > time.time():
            return nullcontext()
    except ValueError:
        pass  # a mangled cookie only decides where this browser's reads go
    return replica_reads()


def console_read(view, request, post: bool, *args, **kwargs):
    reads = console_reads(request, post=post)
    if isinstance(reads, nullcontext):
        return view(request, *args, **kwargs)
    try:
        with reads:
            return view(request, *args, **kwargs)
    except Http404:
        # Not on the replica yet (created within its lag, e.g. the link in a fresh alert):
        # the primary decides whether it exists.
        return view(request, *args, **kwargs)


def pin_primary_after_post(response, request, *, post: bool):
    if post and replica_configured():
        response.set_cookie(
            PRIMARY_PIN_COOKIE,
            str(int(time.time()) + PRIMARY_PIN_SECONDS),
            max_age=PRIMARY_PIN_SECONDS,
            path="/console/",
            httponly=True,
            samesite="Lax",
            secure=settings.SESSION_COOKIE_SECURE,
        )
    return response


ASSET_DIR = Path(__file__).resolve().parent / "assets"
ASSETS = {
    "console.css": "text/css; charset=utf-8",
    "status.css": "text/css; charset=utf-8",
    "status.js": "text/javascript; charset=utf-8",
}


@require_GET
def asset(request, name: str):
    content_type = ASSETS.get(name)
    if content_type is None:
        raise Http404
    body = (ASSET_DIR / name).read_bytes()
    response = HttpResponse(body, content_type=content_type)
    return secure_headers(response, cache="public, max-age=300")


def not_allowed(request, action: access.Action):
    """403 that names the roles which can open the page or do the action."""
    roles = [r.value for r in access.roles_with(action)]
    return render(request, "console/403.html", {"roles": roles}, status=403)


def page_not_found(request, exception=None):
    """handler404: Verity's own page (or a problem document for the API), never Django's
    default. A status link answers the same page whatever the token looked like."""
    path = request.path
    if path.startswith("/api/"):
        response = HttpResponse(
            '{"type": "about:blank", "title": "Not found", "status": 404, '
            '"code": "not_found", "detail": "No such resource."}',
            content_type="application/problem+json",
            status=404,
        )
        return secure_headers(response)
    if path.startswith("/status/"):
        return secure_headers(
            render(request, "status/not_found.html", status=404), referrer="no-referrer"
        )
    return secure_headers(render(request, "console/404.html", status=404))


def csrf_failure(request, reason: str = ""):
    """CSRF_FAILURE_VIEW: a stale or missing form token (an old tab, a new login) gets a
    page that says nothing changed and what to do, not Django's debug text."""
    template = "status/csrf.html" if request.path.startswith("/status/") else "console/csrf.html"
    return secure_headers(render(request, template, status=403))
