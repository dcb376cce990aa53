"""Start-up refusals: settings that would be unsafe in production
stop the process at import, with a message naming the variable to set. Development is
DEBUG on (`make run`, compose); the test stack sets its own key and mail backend."""

import hashlib
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from .base import BASE_DIR, DEBUG, SECRET_KEY
from .provider import (
    PROVIDER_READ_CLOCK_MARGIN_SECONDS,
    STRIPE_API_BASE,
    STRIPE_API_KEY,
    STRIPE_DEDUPES_KEYS,
    STRIPE_IDEMPOTENCY_WINDOW_SECONDS,
    STRIPE_RESEND_MARGIN_SECONDS,
)
from .queue import EMAIL_BACKEND
from .x402 import (
    X402_ASSET,
    X402_CONFIRMATIONS,
    X402_ENABLED,
    X402_FACILITATOR_API_KEY_ID,
    X402_FACILITATOR_API_KEY_SECRET,
    X402_FACILITATOR_AUTH_TOKEN,
    X402_FACILITATOR_URL,
    X402_LOCAL_CHAIN,
    X402_NETWORK,
    X402_PAY_TO,
    X402_REFUND_PRIVATE_KEY,
)

DEFAULT_SECRET_KEY = "dev-insecure-secret-key-change-me"
CONSOLE_EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

# x402: `make run`'s throwaway chain. Its keys are derived from public labels
# (tools.x402_chain.local_key), so on any other network they are anyone's: its pay_to,
# token, refund account and refund key (as a SHA-256, never the key) must never reach a
# real network. tests/security/test_startup_refusals.py checks these against
# tools.x402_chain.
LOCAL_X402_NETWORK = "eip155:31337"
MAKE_RUN_X402_ADDRESSES = frozenset(
    {
        "0xc656a39478289cfa73689e64b61c9c57d16d40b3",  # pay_to
        "0xe7f1725e7734ce288f8367e1bb143e90bb3f0512",  # the token anvil's admin deploys
        "0x2d46c183fac59ddf193a2ae988a37575fc737ae3",  # the refund account
    }
)
MAKE_RUN_X402_KEY_SHA256 = frozenset(
    {
        "c8582ea3e24ffa10b46c57478b607068cbe04b3946ec931023cf5cfe90428c26",  # the refund key
        # pay_to's key: `make run` once exported it as the refund key.
        "6ddcd8a3bcfc229711d38a70a18c2cd4d500df17e8c299358d4e2402631a4772",
    }
)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def key_digest(key: str) -> str:
    return hashlib.sha256(key.lower().removeprefix("0x").encode()).hexdigest()


def key_address(key: str) -> str:
    """The account of a private key ("" when it is not one). eth_keys (the secp256k1 key
    library under eth_account) only: the settings import nothing of the chain client, and
    only when x402 is on with a refund key."""
    from eth_keys import keys

    try:
        return (
            keys.PrivateKey(bytes.fromhex(key.removeprefix("0x"))).public_key.to_address().lower()
        )
    except Exception:  # noqa: BLE001 - a malformed key: refunds fail loudly when used
        return ""


# Off the local chain, a succeeded x402 payment needs its block this deep: below it a
# reorg can take the transfer away after the deliverable went out. Per network (CAIP-2);
# any other network: X402_DEFAULT_CONFIRMATIONS_FLOOR.
X402_CONFIRMATIONS_FLOOR = {"eip155:1": 12, "eip155:8453": 10, "eip155:84532": 5}
X402_DEFAULT_CONFIRMATIONS_FLOOR = 12


def x402_refusals(
    *,
    enabled: bool,
    network: str,
    pay_to: str,
    asset: str,
    refund_key: str,
    facilitator_url: str,
    local_chain: bool = False,
    confirmations: int | None = None,
) -> list[str]:
    if not enabled:
        return []
    found = []
    if local_chain and network != LOCAL_X402_NETWORK:
        # The throwaway chain's flag on a real network would let development shortcuts
        # stand for money: refused (the receipt is read on every chain regardless).
        found.append(
            f"X402_LOCAL_CHAIN is set but X402_NETWORK is {network!r}: the flag is "
            f"for `make run`'s throwaway chain ({LOCAL_X402_NETWORK}) only"
        )
    floor = X402_CONFIRMATIONS_FLOOR.get(network, X402_DEFAULT_CONFIRMATIONS_FLOOR)
    if network != LOCAL_X402_NETWORK and confirmations is not None and confirmations < floor:
        found.append(
            f"X402_CONFIRMATIONS is {confirmations} on {network}: below {floor} a "
            "reorg can take a transfer away after the deliverable went out; set it "
            f"to at least {floor}"
        )
    refund_account = key_address(refund_key) if refund_key else ""
    if refund_account and pay_to and refund_account == pay_to.lower():
        # The refund key sits in every web, worker and beat process; the
        # receiving account's key must not (on any network): refunds come from a separate
        # account with a small float that finance tops up.
        found.append(
            "X402_REFUND_PRIVATE_KEY is the key of X402_PAY_TO (the receiving "
            "account): refunds must be sent from a separate refund account with a "
            "small float (docs/runbooks/x402-refund-float.md); keep pay_to's key "
            "out of Verity"
        )
    if network != LOCAL_X402_NETWORK:
        used = sorted({pay_to.lower(), asset.lower(), refund_account} & MAKE_RUN_X402_ADDRESSES)
        if used or (refund_key and key_digest(refund_key) in MAKE_RUN_X402_KEY_SHA256):
            found.append(
                f"X402_NETWORK is {network!r} but X402_PAY_TO / X402_ASSET / "
                "X402_REFUND_PRIVATE_KEY are `make run`'s throwaway-chain values "
                f"({', '.join(used) or 'the refund key'}): anyone can derive their "
                "keys; set this network's own"
            )
    parts = urlsplit(facilitator_url)
    if parts.scheme != "https" and parts.hostname not in _LOOPBACK:
        found.append(
            f"X402_FACILITATOR_URL {facilitator_url!r} is a remote facilitator "
            "without TLS: payment authorizations would travel in clear; use https://"
        )
    return found


def facilitator_credential_refusals(*, token: str, key_id: str, key_secret: str) -> list[str]:
    """A hosted facilitator takes one kind of credential: a static bearer token or a CDP API
    key (id and secret, a JWT minted per request). Both at once, or half a key, is a
    deployment mistake that would otherwise show only as refused payments. Names only,
    never the values."""
    found = []
    if token and (key_id or key_secret):
        found.append(
            "X402_FACILITATOR_AUTH_TOKEN and X402_FACILITATOR_API_KEY_ID / "
            "X402_FACILITATOR_API_KEY_SECRET are both set: a facilitator takes one "
            "credential; keep the static token only for a facilitator that documents "
            "one, the API key for Coinbase's (CDP) facilitator"
        )
    elif bool(key_id) != bool(key_secret):
        have, missing = (
            ("X402_FACILITATOR_API_KEY_ID", "X402_FACILITATOR_API_KEY_SECRET")
            if key_id
            else ("X402_FACILITATOR_API_KEY_SECRET", "X402_FACILITATOR_API_KEY_ID")
        )
        found.append(
            f"{have} is set without {missing}: the facilitator's API key needs both "
            "(its id and its secret)"
        )
    return found


# How long Stripe documents it keeps an idempotency key ("at least 24 hours"): a one-call
# payment's lost answer is re-sent under its key only inside this.
STRIPE_KEY_RETENTION_SECONDS = 24 * 3600


def _is_localstripe(api_base: str | None) -> bool:
    """The development/test provider: plain http on loopback (`make run`, the test stack)."""
    if not api_base:
        return False  # api.stripe.com
    parts = urlsplit(api_base)
    return parts.scheme == "http" and parts.hostname in _LOOPBACK


def idempotency_window_refusals(
    *, dedupes_keys: bool, window_seconds: int, margin_seconds: int, api_base: str | None
) -> list[str]:
    """Where a card payment is one round trip (the provider dedupes keys), a lost answer is
    re-sent under its key while the first send is younger than the window minus the
    margin. A window longer than the provider keeps keys, or no margin, re-sends after the
    provider may have forgotten the key: a second payment. localstripe (tests, `make run`)
    keeps keys as long as it is told, so short windows and a zero margin stay allowed there."""
    if not dedupes_keys or _is_localstripe(api_base):
        return []
    found = []
    if window_seconds > STRIPE_KEY_RETENTION_SECONDS:
        found.append(
            f"STRIPE_IDEMPOTENCY_WINDOW_SECONDS={window_seconds} is longer than Stripe "
            f"keeps idempotency keys ({STRIPE_KEY_RETENTION_SECONDS} s): a lost "
            "answer re-sent after the key expired pays twice; set it to at most "
            f"{STRIPE_KEY_RETENTION_SECONDS}"
        )
    if margin_seconds <= 0:
        found.append(
            f"STRIPE_RESEND_MARGIN_SECONDS={margin_seconds} leaves no margin before "
            "the provider's key window ends (clock skew, early pruning): set it above "
            "0 (default 3600)"
        )
    return found


# The read by metadata says "none" only while the provider's Date agrees with the
# database's clock within max(margin / 2, 2 s); below twice that floor the window, widened
# by the margin alone, cannot hold the skew the check lets through.
READ_CLOCK_MARGIN_FLOOR_SECONDS = 4


def read_margin_refusals(*, margin_seconds: int) -> list[str]:
    if margin_seconds >= READ_CLOCK_MARGIN_FLOOR_SECONDS:
        return []
    return [
        f"PROVIDER_READ_CLOCK_MARGIN_SECONDS={margin_seconds} is below "
        f"{READ_CLOCK_MARGIN_FLOOR_SECONDS} s: the provider-clock check (2 s at least) "
        "would pass clocks the read's window cannot hold, and a read could say 'none' "
        f"beside an object the provider made; set it to at least {READ_CLOCK_MARGIN_FLOOR_SECONDS} "
        "(default 60)"
    ]


def refusals(
    *,
    debug: bool,
    secret_key: str,
    stripe_api_key: str,
    stripe_api_base: str | None,
    email_backend: str,
) -> list[str]:
    found = []
    if not debug and (not secret_key or secret_key == DEFAULT_SECRET_KEY):
        found.append(
            "SECRET_KEY is the development default and DEBUG is off: set SECRET_KEY "
            "to a long random value"
        )
    if (
        stripe_api_key.startswith(("sk_live", "rk_live"))
        and stripe_api_base
        and not stripe_api_base.startswith("https://")
    ):
        found.append(
            f"a live STRIPE_API_KEY would be sent to {stripe_api_base!r} without "
            "TLS: set STRIPE_API_BASE empty (api.stripe.com) or to an https:// URL"
        )
    if not debug and email_backend == CONSOLE_EMAIL_BACKEND:
        found.append(
            "EMAIL_BACKEND is the console backend and DEBUG is off: customers would "
            "never receive their e-mails (and the worker's output would hold their "
            "addresses and status links); set EMAIL_BACKEND (and EMAIL_HOST…)"
        )
    return found


_refused = refusals(
    debug=DEBUG,
    secret_key=SECRET_KEY,
    stripe_api_key=STRIPE_API_KEY,
    stripe_api_base=STRIPE_API_BASE,
    email_backend=EMAIL_BACKEND,
)
_refused += x402_refusals(
    enabled=X402_ENABLED,
    network=X402_NETWORK,
    pay_to=X402_PAY_TO,
    asset=X402_ASSET,
    refund_key=X402_REFUND_PRIVATE_KEY,
    facilitator_url=X402_FACILITATOR_URL,
    local_chain=X402_LOCAL_CHAIN,
    confirmations=X402_CONFIRMATIONS,
)
_refused += idempotency_window_refusals(
    dedupes_keys=STRIPE_DEDUPES_KEYS,
    window_seconds=STRIPE_IDEMPOTENCY_WINDOW_SECONDS,
    margin_seconds=STRIPE_RESEND_MARGIN_SECONDS,
    api_base=STRIPE_API_BASE,
)
_refused += read_margin_refusals(margin_seconds=PROVIDER_READ_CLOCK_MARGIN_SECONDS)
_refused += facilitator_credential_refusals(
    token=X402_FACILITATOR_AUTH_TOKEN,
    key_id=X402_FACILITATOR_API_KEY_ID,
    key_secret=X402_FACILITATOR_API_KEY_SECRET,
)
if _refused:
    # In a development checkout (the production image has no tools/) the likely reader is
    # a developer whose shell lacks what `make run` set: say that first.
    _hint = (
        " — developing in this checkout? Start `make run` first: it writes "
        "var/.env (DEBUG=true and its URLs), which commands typed in your shell read"
        if not DEBUG and (BASE_DIR / "tools").is_dir()
        else ""
    )
    raise ImproperlyConfigured("Verity refuses to start: " + "; ".join(_refused) + _hint)
