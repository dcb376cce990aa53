"""Where a webhook may go, and the one POST that goes there.

Outbound URLs are checked at save time and again at send time: the host is resolved, every
address it resolves to must be public (no private, loopback, link-local, multicast or
reserved range; loopback only when WEBHOOK_ALLOW_LOOPBACK is on, for development), and
the connection is made to the address that was checked — never a second resolution, so a
name that rebinds between the check and the connect cannot reach an internal address.
No redirects, connect/read timeouts, and at most WEBHOOK_RESPONSE_BYTES of the answer read.

Connections are kept alive and reused, per checked destination: a pool is keyed by the
scheme, the host name, the port AND the address the check chose, so every send is still
checked first and a name that now resolves elsewhere gets a new pool (connecting to the
newly checked address), never a connection opened to the old one. An answer longer than
the bound is not read on: its connection is closed, not reused.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections import OrderedDict
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


def _allowed(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
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
    addresses = sorted({str(info[4][0]) for info in infos})
    if not addresses:
        raise DestinationRefused("the URL's host does not resolve")
    for address in addresses:
        if not _allowed(ipaddress.ip_address(address.split("%", 1)[0])):
            # Every address must pass: a name with one public and one private address
            # would otherwise be a coin toss between them.
            raise DestinationRefused("the URL resolves to a private, loopback or reserved address")
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


_POOLS: OrderedDict[tuple, urllib3.HTTPConnectionPool] = OrderedDict()
_POOLS_LOCK = threading.Lock()
MAX_POOLS = 256  # destinations kept open at once; the least recently used is closed


def _pool(dest: Destination) -> urllib3.HTTPConnectionPool:
    """The kept-alive pool of this checked destination (see the module docstring)."""
    key = (dest.scheme, dest.host, dest.port, dest.address)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is not None:
            _POOLS.move_to_end(key)
            return pool
        timeout = urllib3.Timeout(
            connect=settings.WEBHOOK_CONNECT_TIMEOUT_SECONDS,
            read=settings.WEBHOOK_READ_TIMEOUT_SECONDS,
        )
        size = max(1, settings.WEBHOOK_SEND_THREADS)
        if dest.scheme == "https":
            pool = urllib3.HTTPSConnectionPool(
                dest.address,
                dest.port,
                timeout=timeout,
                retries=False,
                maxsize=size,
                server_hostname=dest.host,
                assert_hostname=dest.host,
                cert_reqs="CERT_REQUIRED",
            )
        else:
            pool = urllib3.HTTPConnectionPool(
                dest.address, dest.port, timeout=timeout, retries=False, maxsize=size
            )
        _POOLS[key] = pool
        evicted = []
        while len(_POOLS) > MAX_POOLS:
            evicted.append(_POOLS.popitem(last=False)[1])
    for old in evicted:
        old.close()
    return pool


def pools_close() -> None:
    """Close every kept-alive connection (settings changed, a test's end)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


def post_checked(url: str, *, body: bytes, headers: dict[str, str]) -> PostResult:
    """POST `body` to `url` after checking it (send-time check). Never raises."""
    started = time.monotonic()

    def took() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        dest = destination_check(url)
    except DestinationRefused as exc:
        return PostResult(None, f"refused: {exc}", took())
    host_header = dest.host if dest.port in (80, 443) else f"{dest.host}:{dest.port}"
    # The timeouts are read per request: a settings change applies to a kept pool too.
    timeout = urllib3.Timeout(
        connect=settings.WEBHOOK_CONNECT_TIMEOUT_SECONDS, read=settings.WEBHOOK_READ_TIMEOUT_SECONDS
    )
    try:
        response = _pool(dest).urlopen(
            "POST",
            dest.path,
            body=body,
            redirect=False,
            preload_content=False,
            assert_same_host=False,
            timeout=timeout,
            retries=False,
            headers={
                **headers,
                "Host": host_header,
                "Content-Type": "application/json",
                "User-Agent": "Verity-Webhooks/1",
            },
        )
        try:
            limit = settings.WEBHOOK_RESPONSE_BYTES
            if len(response.read(limit + 1)) > limit:
                response.close()  # bounded: the rest is dropped with its connection
        except BaseException:
            response.close()
            raise
        finally:
            response.release_conn()
        return PostResult(response.status, "", took())
    except urllib3.exceptions.HTTPError as exc:
        # The kind of failure only: an exception's text may quote the URL's query.
        return PostResult(None, type(exc).__name__, took())
    except OSError as exc:
        return PostResult(None, type(exc).__name__, took())
