"""The client's address, for lockouts, throttles and the audit log.

`REMOTE_ADDR` is the peer; behind a reverse proxy that is the proxy, so a per-IP lockout
would lock everyone out at once. `X-Forwarded-For` is client-controlled except for the
entries the proxies in front of Verity appended themselves: with TRUSTED_PROXY_COUNT = N
(each proxy appends the address it received the request from), the client is the N-th
entry from the right. Anything to its left was sent by the client and is ignored; a header
too short or not an IP address falls back to `REMOTE_ADDR`.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings


def client_address(request) -> str | None:
    peer = request.META.get("REMOTE_ADDR") or None
    hops = getattr(settings, "TRUSTED_PROXY_COUNT", 0)
    if hops <= 0:
        return peer
    entries = [e.strip() for e in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    entries = [e for e in entries if e]
    if len(entries) < hops:
        return peer
    candidate = entries[-hops]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return peer
