"""The MCP streamable HTTP transport, mounted in the Django app (`/mcp/`).

Verity's web process is WSGI (gunicorn), and the SDK's transport is an ASGI app. The
transport runs *stateless* with JSON responses: every POST carries one JSON-RPC message
and gets one JSON answer, so no session or stream outlives the request. That lets this
plain Django view run the SDK's own session manager for the one request, on a private
event loop, and return what it sent. Nothing about the protocol is reimplemented here.

Authentication happens first, in the view (`Authorization: Api-Key <key>`, the REST
API's scheme and keys): a request without a valid key is answered 401 before the MCP
layer sees it. Each tool call then re-resolves the key and checks its scope (a revoked
key or a missing scope is refused per call, with a structured answer).

Not atomic and CSRF-exempt on purpose: tools open their own short transactions and make
provider calls outside them (no lock held across a provider call); the caller is authenticated by
an API key, not a
cookie.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache

import anyio
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

# The bridge starts and stops a session manager per request; its INFO start/stop lines
# would be two log lines per tool call.
logging.getLogger("mcp.server.streamable_http_manager").setLevel(logging.WARNING)

_UNAUTHENTICATED = {
    "type": "urn:verity:problem:unauthenticated",
    "title": "Unauthenticated",
    "status": 401,
    "detail": "Send a valid key as 'Authorization: Api-Key <key>'.",
    "code": "unauthenticated",
}


@lru_cache(maxsize=1)
def _server():
    # One server definition per process; tools close their DB connection after each call
    # because each request runs on a fresh event loop (fresh worker threads). The MCP SDK
    # (about 0.4 s of CPU to import) is loaded by the first MCP request, not by every
    # process that loads the URLs.
    from .server import build_server

    return build_server(api_key=None, close_connections=True)


def _scope(request: HttpRequest) -> dict:
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in request.headers.items()
    ]
    server_port = int(request.get_port() or 80)
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.META.get("QUERY_STRING", "").encode("latin-1"),
        "headers": headers,
        "client": (request.META.get("REMOTE_ADDR", ""), 0),
        "server": (request.get_host().split(":")[0], server_port),
        "state": {},
    }


def _serve_asgi_once(request: HttpRequest) -> HttpResponse:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings

    scope, body = _scope(request), request.body
    messages: list[dict] = []

    async def run() -> None:
        done = anyio.Event()
        body_sent = False

        async def receive():
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            messages.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        manager = StreamableHTTPSessionManager(
            app=_server()._lowlevel_server,
            json_response=True,
            stateless=True,
            # Host/Origin checks: Django's ALLOWED_HOSTS already vetted the host, and a
            # browser cannot ride this endpoint (API key header, no cookies).
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        async with manager.run():
            await manager.handle_request(scope, receive, send)
            done.set()

    anyio.run(run)
    start = next((m for m in messages if m["type"] == "http.response.start"), None)
    if start is None:
        return HttpResponse(status=500)
    content = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    response = HttpResponse(content, status=start["status"])
    for name, value in start.get("headers", []):
        key = name.decode("latin-1")
        if key.lower() in ("content-length", "transfer-encoding", "connection"):
            continue
        response[key] = value.decode("latin-1")
    return response


@csrf_exempt
def mcp_endpoint(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        # No standalone server-sent event stream (GET) and no sessions (DELETE): the
        # transport is stateless JSON, and a WSGI worker must not hold a stream open.
        # 405 is how the MCP spec says "not offered"; clients carry on with POST.
        return HttpResponse(status=405, headers={"Allow": "POST"})
    from .server import authenticate_key, key_from_headers

    if authenticate_key(key_from_headers(request.headers)) is None:
        return HttpResponse(
            json.dumps(_UNAUTHENTICATED),
            status=401,
            content_type="application/problem+json",
            headers={"WWW-Authenticate": 'Api-Key realm="mcp"'},
        )
    return _serve_asgi_once(request)
