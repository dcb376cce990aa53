"""Django's admin behind the console's login lockout.

The admin login used to be outside the console throttle: unlimited guesses, no failure
rows. Its site now checks and records failures through the same support.services
functions as the console login, keyed on the same normalised username and client IP.
"""

from __future__ import annotations

import math

from django.contrib import admin
from django.http import HttpResponse

from support import services
from support.web import client_ip, secure_headers


def lockout_message(seconds: int) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return f"Too many failed attempts. Try again in {minutes} minute{'' if minutes == 1 else 's'}."


class LockedAdminSite(admin.AdminSite):
    def login(self, request, extra_context=None):
        if request.method != "POST":
            return super().login(request, extra_context)
        ip, username = client_ip(request), request.POST.get("username", "")
        wait = services.login_lockout_seconds(ip=ip, username=username)
        if wait:
            response = HttpResponse(
                lockout_message(wait), status=429, content_type="text/plain; charset=utf-8"
            )
            response["Retry-After"] = str(wait)
            return secure_headers(response)
        response = super().login(request, extra_context)
        # A successful admin login sets request.user to an active staff user; anything
        # else that answered the POST was a failed attempt.
        user = getattr(request, "user", None)
        if not (user and user.is_authenticated and user.is_active and user.is_staff):
            services.login_failure_record(ip=ip, username=username)
        return response
