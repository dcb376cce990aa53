"""How Verity authenticates to a hosted x402 facilitator (docs/x402.md#hosted-facilitators).

Two shapes, one per kind of facilitator:

- a static bearer token, for facilitators that document one (X402_FACILITATOR_AUTH_TOKEN);
- a CDP API key (X402_FACILITATOR_API_KEY_ID / X402_FACILITATOR_API_KEY_SECRET), for
  Coinbase's hosted facilitator: a JWT minted for every request, bound to its method, host
  and path (the `uris` claim) and valid 120 s, signed ES256 (an EC P-256 key in PEM) or
  EdDSA (a base64 Ed25519 key, 64 bytes: seed then public key). The claim shape is the one
  Coinbase's own SDKs mint (cdp-sdk, `cdp/auth/utils/jwt.py`); cdp-sdk itself is not a
  dependency: importing it loads its whole wallet and Solana client (about 95 MB) for
  these few lines of PyJWT.

Neither secret is ever logged, stored or answered: the objects below print without it and
errors name the variable, never its value.
"""

from __future__ import annotations

import base64
import secrets
import time
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

JWT_LIFETIME_SECONDS = 120  # what the CDP facilitator accepts
JWT_ISSUER = "cdp"


# A CDP API key's private key: ES256 (EC P-256) or EdDSA (Ed25519).
ApiKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


class FacilitatorCredentialInvalid(ValueError):
    """The configured facilitator credential cannot be used (the message names the
    variable, never the secret)."""


class FacilitatorAuth(Protocol):
    def headers(self, *, method: str, url: str) -> dict[str, str]:
        """The headers that authenticate one request to `url`."""


@dataclass(frozen=True)
class NoAuth:
    def headers(self, *, method: str, url: str) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class StaticBearer:
    token: str = field(repr=False)

    def headers(self, *, method: str, url: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def parse_api_key_secret(secret: str) -> ApiKey:
    """A CDP API key secret as a private key: an EC P-256 key in PEM (literal `\\n` as an
    unquoted environment variable carries them are accepted) or a base64 Ed25519 key."""
    text = secret.strip().replace("\\n", "\n")
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_private_key(text.encode(), password=None)
        except (ValueError, TypeError) as exc:
            raise FacilitatorCredentialInvalid(
                "X402_FACILITATOR_API_KEY_SECRET is not a readable PEM private key"
            ) from exc
        if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
            return key
        raise FacilitatorCredentialInvalid(
            "X402_FACILITATOR_API_KEY_SECRET is a PEM key but not EC P-256 (ES256)"
        )
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise FacilitatorCredentialInvalid(
            "X402_FACILITATOR_API_KEY_SECRET is neither a PEM EC key nor a base64 Ed25519 key"
        ) from exc
    if len(raw) != 64:
        raise FacilitatorCredentialInvalid(
            "X402_FACILITATOR_API_KEY_SECRET is base64 but not a 64-byte Ed25519 key"
        )
    key = ed25519.Ed25519PrivateKey.from_private_bytes(raw[:32])
    public = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    if public != raw[32:]:
        raise FacilitatorCredentialInvalid(
            "X402_FACILITATOR_API_KEY_SECRET: the Ed25519 key's public half does not match its seed"
        )
    return key


def request_uri(method: str, url: str) -> str:
    """The `uris` claim's entry for one request: `METHOD host[:port]/path` (no scheme, no
    query), as the facilitator compares it with the request it receives."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]  # never a URL's user:password
    return f"{method.upper()} {host}{parts.path or '/'}"


def mint_cdp_jwt(
    *,
    key_id: str,
    key: ApiKey,
    method: str,
    url: str,
    now: int | None = None,
    lifetime: int = JWT_LIFETIME_SECONDS,
) -> str:
    """One bearer JWT for one request (method, host and path bound; `nbf` now, `exp`
    `lifetime` later; a random header nonce so no two are alike)."""
    issued = int(time.time()) if now is None else now
    algorithm = "EdDSA" if isinstance(key, ed25519.Ed25519PrivateKey) else "ES256"
    claims = {
        "sub": key_id,
        "iss": JWT_ISSUER,
        "nbf": issued,
        "exp": issued + lifetime,
        "uris": [request_uri(method, url)],
    }
    headers = {"kid": key_id, "typ": "JWT", "nonce": secrets.token_hex(16)}
    return jwt.encode(claims, key, algorithm=algorithm, headers=headers)


@dataclass(frozen=True)
class CdpApiKey:
    key_id: str
    key: ApiKey = field(repr=False)

    @classmethod
    def from_secret(cls, *, key_id: str, secret: str) -> CdpApiKey:
        return cls(key_id=key_id, key=parse_api_key_secret(secret))

    def headers(self, *, method: str, url: str) -> dict[str, str]:
        token = mint_cdp_jwt(key_id=self.key_id, key=self.key, method=method, url=url)
        return {"Authorization": f"Bearer {token}"}


def facilitator_auth(*, token: str, key_id: str, key_secret: str) -> FacilitatorAuth:
    """The credential the settings describe (config/settings/security.py refuses to start
    with both kinds, or half a key)."""
    if key_id and key_secret:
        return CdpApiKey.from_secret(key_id=key_id, secret=key_secret)
    if token:
        return StaticBearer(token)
    return NoAuth()
