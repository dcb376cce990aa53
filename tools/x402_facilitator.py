"""The real x402 facilitator behind a small HTTP wrapper, for tests and `make run`.

The x402 SDK ships the facilitator's logic (`x402FacilitatorSync` with the EVM `exact`
scheme and `FacilitatorWeb3Signer`, which verifies EIP-3009 signatures and broadcasts
`transferWithAuthorization`) but no server. This wrapper exposes it the way a hosted
facilitator does: `GET /supported`, `POST /verify`, `POST /settle` (bodies as in the x402
v2 HTTP transport: {x402Version, paymentPayload, paymentRequirements}). Verification,
settlement and the `settlement_pending` answer are the SDK's own, unchanged.

One sandbox-only route plays a hosted facilitator's known quirks
(docs/x402.md#how-a-settle-is-classified): `POST
/_config` {"pending_status": 500} answers `settlement_pending` as HTTP 500 (with the body),
{"pending_status": 200} restores the SDK's plain 200; {"bearer": "<token>"} makes every
route but /_config require `Authorization: Bearer <token>` (401 otherwise), as a facilitator
with a documented static token does; {"bearer": ""} turns it off. {"cdp_key": {"id": KID,
"public_key": PEM}} plays Coinbase's hosted (CDP) facilitator: every route but /_config
requires a bearer JWT signed by that key (ES256 or EdDSA, `kid` and `sub` the key id, `iss`
"cdp"), minted for this request (its `uris` claim is exactly "METHOD host/path" of this
request), valid now and for at most 120 s, and never seen before (its header nonce);
anything else is a 401 whose `error` says why. {"cdp_key": null} turns it off. The check is
written from the claim shape, with PyJWT's decoder: it shares no code with Verity's minter.
Binds 127.0.0.1 only.

The signer key comes from the environment (X402_FACILITATOR_KEY), never an argument.
Usage: python -m tools.x402_facilitator --port P --rpc-url URL --network eip155:31337
       [--confirmation-timeout 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from x402 import x402FacilitatorSync
from x402.mechanisms.evm import FacilitatorWeb3Signer
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.schemas import PaymentPayload, PaymentRequirements

log = logging.getLogger("x402-facilitator")


class _State:
    pending_status = 200
    bearer = ""
    cdp_key: dict | None = None  # {"id": kid, "public_key": PEM}
    seen_nonces: set = set()
    lock = threading.Lock()


JWT_MAX_LIFETIME = 120


def cdp_jwt_refusal(
    authorization: str | None, *, key: dict, method: str, host: str, path: str, seen: set
) -> str:
    """Why a CDP facilitator would refuse this request's credential ("" when it accepts)."""
    if not authorization or not authorization.startswith("Bearer "):
        return "missing_bearer_jwt"
    token = authorization.removeprefix("Bearer ")
    public = serialization.load_pem_public_key(key["public_key"].encode())
    # The key decides the algorithm (never the token's own `alg`).
    algorithm = "ES256" if isinstance(public, ec.EllipticCurvePublicKey) else "EdDSA"
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(
            token,
            public,
            algorithms=[algorithm],
            issuer="cdp",
            options={"require": ["exp", "nbf", "sub", "iss"], "verify_aud": False},
        )
    except jwt.ExpiredSignatureError:
        return "jwt_expired"
    except jwt.PyJWTError as exc:
        return f"jwt_invalid: {type(exc).__name__}"
    if header.get("kid") != key["id"] or claims.get("sub") != key["id"]:
        return "jwt_wrong_key"
    if claims["exp"] - claims["nbf"] > JWT_MAX_LIFETIME:
        return "jwt_lifetime_too_long"
    if claims.get("uris") != [f"{method} {host}{path}"]:
        return "jwt_wrong_request"
    nonce = header.get("nonce")
    with _State.lock:
        if not nonce or nonce in seen:
            return "jwt_replayed"
        seen.add(nonce)
    return ""


def build(*, rpc_url: str, network: str, confirmation_timeout: float) -> x402FacilitatorSync:
    signer = FacilitatorWeb3Signer(
        private_key=os.environ["X402_FACILITATOR_KEY"],
        rpc_url=rpc_url,
        confirmation_timeout_seconds=confirmation_timeout,
    )
    return register_exact_evm_facilitator(x402FacilitatorSync(), signer, networks=network)


def make_handler(facilitator: x402FacilitatorSync):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # noqa: D401 - quiet, one line per request
            log.info("%s %s", self.command, fmt % args)

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def _authorized(self) -> bool:
            with _State.lock:
                bearer, cdp_key = _State.bearer, _State.cdp_key
            if bearer and self.headers.get("Authorization") != f"Bearer {bearer}":
                self._answer(401, {"error": "unauthorized"})
                return False
            if cdp_key:
                why = cdp_jwt_refusal(
                    self.headers.get("Authorization"),
                    key=cdp_key,
                    method=self.command,
                    host=self.headers.get("Host", ""),
                    path=self.path.split("?", 1)[0],
                    seen=_State.seen_nonces,
                )
                if why:
                    self._answer(401, {"error": "unauthorized", "reason": why})
                    return False
            return True

        def do_GET(self):
            if not self._authorized():
                return None
            if self.path == "/supported":
                return self._answer(
                    200, facilitator.get_supported().model_dump(by_alias=True, exclude_none=True)
                )
            return self._answer(404, {"error": "not_found"})

        def do_POST(self):
            try:
                body = self._body()
            except ValueError:
                return self._answer(400, {"error": "invalid_json"})
            if self.path == "/_config":
                with _State.lock:
                    _State.pending_status = int(body.get("pending_status", _State.pending_status))
                    _State.bearer = str(body.get("bearer", _State.bearer))
                    if "cdp_key" in body:
                        _State.cdp_key = body["cdp_key"] or None
                return self._answer(
                    200,
                    {
                        "pending_status": _State.pending_status,
                        "auth": bool(_State.bearer),
                        "cdp_key": bool(_State.cdp_key),
                    },
                )
            if not self._authorized():
                return None
            if self.path not in ("/verify", "/settle"):
                return self._answer(404, {"error": "not_found"})
            try:
                payload = PaymentPayload.model_validate(body["paymentPayload"])
                requirements = PaymentRequirements.model_validate(body["paymentRequirements"])
            except Exception as exc:  # noqa: BLE001 - a malformed request is a 400
                return self._answer(400, {"error": "invalid_request", "message": str(exc)[:200]})
            if self.path == "/verify":
                result = facilitator.verify(payload, requirements)
                return self._answer(200, result.model_dump(by_alias=True, exclude_none=True))
            result = facilitator.settle(payload, requirements)
            status = 200
            if result.error_reason == "settlement_pending":
                status = _State.pending_status
            return self._answer(status, result.model_dump(by_alias=True, exclude_none=True))

    return Handler


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8402)
    parser.add_argument("--rpc-url", required=True)
    parser.add_argument("--network", default="eip155:31337")
    parser.add_argument("--confirmation-timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    facilitator = build(
        rpc_url=args.rpc_url, network=args.network, confirmation_timeout=args.confirmation_timeout
    )
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(facilitator))
    log.info("x402 facilitator on 127.0.0.1:%d for %s", args.port, args.network)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
