"""Where a webhook may go, and the one POST that goes there.

Outbound URLs are checked at save time and again at send time: the host is resolved, every
address it resolves to must be public (no private, loopback, link-local, multicast or
reserved range; loopback only when WEBHOOK_ALLOW_LOOPBACK is on, for development), and
the connection is made to the address that was checked — never a second resolution, so a
name that rebinds between the check and the connect cannot reach an internal address.
No redirects, connect/read timeouts, and at most WEBHOOK_RESPONSE_BYTES of the answer read.
"""
from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import urllib3
from django.conf import settings


class DestinationRefused(ValueError):
    """The URL may not receive webhooks (scheme, host or address)."""


@dataclass(frozen=True)
class Destination:
    scheme: str
    host: str
    port: int
    path: str
    address: str  # the checked IP the connection goes to


def _allowed(ip: ipaddress._BaseAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return bool(settings.WEBHOOK_ALLOW_LOOPBACK)
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_link_local)


def destination_check(url: str) -> Destination:
    """Resolve and check `url`; the Destination names the address to connect to."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http"):
        raise DestinationRefused("the URL must be http or https")
    if parts.scheme == "http" and not settings.WEBHOOK_ALLOW_LOOPBACK:
        raise DestinationRefused("the URL must be https")
    if not parts.hostname or parts.username or parts.password:
        raise DestinationRefused("the URL needs a host and no credentials")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise DestinationRefused("the URL's port is not valid") from None
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise DestinationRefused("the URL's host does not resolve") from None
    addresses = sorted({info[4][0] for info in infos})
    if not addresses:
        raise DestinationRefused("the URL's host does not resolve")
    for address in addresses:
        if not _allowed(ipaddress.ip_address(address.split("%", 1)[0])):
            # Every address must pass: a name with one public and one private address
            # would otherwise be a coin toss between them.
            raise DestinationRefused("the URL resolves to a private, loopback or reserved "
                                     "address")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Destination(parts.scheme, parts.hostname, port, path, addresses[0])


@dataclass(frozen=True)
class PostResult:
    status: int | None
    error: str
    duration_ms: int

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def post_checked(url: str, *, body: bytes, headers: dict[str, str]) -> PostResult:
    """POST `body` to `url` after checking it (send-time check). Never raises."""
    started = time.monotonic()

    def took() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        dest = destination_check(url)
    except DestinationRefused as exc:
        return PostResult(None, f"refused: {exc}", took())
    timeout = urllib3.Timeout(connect=settings.WEBHOOK_CONNECT_TIMEOUT_SECONDS,
                              read=settings.WEBHOOK_READ_TIMEOUT_SECONDS)
    host_header = dest.host if dest.port in (80, 443) else f"{dest.host}:{dest.port}"
    if dest.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            dest.address, dest.port, timeout=timeout, retries=False, maxsize=1,
            server_hostname=dest.host, assert_hostname=dest.host, cert_reqs="CERT_REQUIRED")
    else:
        pool = urllib3.HTTPConnectionPool(dest.address, dest.port, timeout=timeout,
                                          retries=False, maxsize=1)
    try:
        response = pool.urlopen("POST", dest.path, body=body, redirect=False,
                                preload_content=False, assert_same_host=False,
                                headers={**headers, "Host": host_header,
                                         "Content-Type": "application/json",
                                         "User-Agent": "Verity-Webhooks/1"})
        try:
            response.read(settings.WEBHOOK_RESPONSE_BYTES)  # bounded; the rest is dropped
        finally:
            response.release_conn()
        return PostResult(response.status, "", took())
    except urllib3.exceptions.HTTPError as exc:
        # The kind of failure only: an exception's text may quote the URL's query.
        return PostResult(None, type(exc).__name__, took())
    except OSError as exc:
        return PostResult(None, type(exc).__name__, took())
    finally:
        pool.close()
