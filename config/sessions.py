"""Console session lifetime (ASVS V3.3): a signed-in session ends 12 h after
login at most and after 30 minutes without a request, whatever the cookie says.

Django alone offers one age (absolute, or sliding with SESSION_SAVE_EVERY_REQUEST), not
both; so the two instants live in the session and are checked on every request. Only
signed-in sessions are touched: the API and the customer page carry none.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib.auth import SESSION_KEY, logout

LOGIN_AT = "_verity_login_at"
SEEN_AT = "_verity_seen_at"


class SessionLifetimeMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        # Only requests that carry a session cookie: the API and the customer page never
        # touch the session (so no `Vary: Cookie`, no session load).
        has_cookie = settings.SESSION_COOKIE_NAME in request.COOKIES
        if has_cookie and request.user.is_authenticated:
            now = time.time()
            login_at = request.session.get(LOGIN_AT, now)
            seen_at = request.session.get(SEEN_AT, now)
            if (
                now - login_at > settings.SESSION_MAX_AGE_SECONDS
                or now - seen_at > settings.SESSION_IDLE_SECONDS
            ):
                logout(request)  # flushes the session; the view sees an anonymous user
            else:
                request.session[LOGIN_AT] = login_at
                request.session[SEEN_AT] = now
        response = self.get_response(request)
        # (request.user may be DRF's API client here: read the session, not the user.)
        if (
            request.session.modified
            and SESSION_KEY in request.session
            and LOGIN_AT not in request.session
        ):
            # Just signed in (the login view rotated the session): the 12 h start now.
            now = time.time()
            request.session[LOGIN_AT] = now
            request.session[SEEN_AT] = now
        return response
