"""Stripe SDK calls: the only module that calls the Stripe SDK for money movements.

It maps SDK answers and errors to Verity's own classification (see
docs/reliability.md#outcome-classification):
  - 2xx                                   -> OK with the object's safe fields
  - 402 card error                        -> DECLINED
  - other 4xx                             -> REJECTED (the service reads back on non-create)
  - no connection was ever established    -> NOT_SENT (safe to resend with the same key)
  - timeout/reset after writing, 5xx, 409, idempotency error -> UNKNOWN
  - 429 / Stripe-Should-Retry: true       -> RETRYABLE (nothing applied)
The SDK's own retries are off (max_network_retries=0): Verity decides what is resent.

Fault drills (`FaultDrillHTTPClient`) wrap the SDK's HTTP client; they are armed per
provider key and refused for live keys.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import requests
import stripe
import urllib3
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from stripe.params import (
    BalanceTransactionListParams,
    PaymentIntentCaptureParams,
    PaymentIntentListParams,
    RefundCreateParams,
    RefundListParams,
)

from payments.enums import Classification, OperationKind

from ..base import CallResult, DisputeObject, ProviderObject, RailRefusal
from .objects import StripeObject
from .webhooks import dispute_from_payload

if TYPE_CHECKING:
    from stripe._base_address import BaseAddresses

log = logging.getLogger(__name__)

LIST_PAGE_LIMIT = 100
LIST_MAX_PAGES = 20


class DrillMode:
    DROP_RESPONSE_AFTER_SEND = "drop_response_after_send"
    TIMEOUT_BEFORE_SEND = "timeout_before_send"
    RESET_AFTER_WRITE = "reset_after_write"
    HTTP_500 = "http_500"
    HTTP_409 = "http_409"
    # 429 rate limited before anything was applied (the request is not sent on).
    HTTP_429 = "http_429"
    # Sends, then never returns: the process is expected to be killed (dead-worker drill).
    HANG_AFTER_SEND = "hang_after_send"
    # Reads only (GET): the provider cannot be reached for a read-back.
    READ_UNAVAILABLE = "read_unavailable"
    # Reads only (GET): the provider answers, but only after SLOW_READ_SECONDS (a read-back
    # that outlives a request's Idempotency-Key lease).
    READ_SLOW = "read_slow"
    SLOW_READ_SECONDS = 3.0
    # Reads only (GET): the provider answers at once, the answer reaches Verity
    # SLOW_READ_SECONDS later (a loaded host: its `Date` is that much older than our clock).
    READ_LATE_ANSWER = "read_late_answer"
    # A definitive refusal, as Stripe answers a refund of a charge already refunded in
    # the dashboard (localstripe accepts any refund): 400 `charge_already_refunded`,
    # nothing sent on, nothing applied.
    HTTP_400_REFUSED = "http_400_refused"
    WRITES = (DROP_RESPONSE_AFTER_SEND, TIMEOUT_BEFORE_SEND, RESET_AFTER_WRITE, HTTP_500, HTTP_409)
    ALL = WRITES + (
        HANG_AFTER_SEND,
        READ_UNAVAILABLE,
        READ_SLOW,
        READ_LATE_ANSWER,
        HTTP_429,
        HTTP_400_REFUSED,
    )


class DrillRefused(Exception):
    pass


@dataclass
class _ArmedDrill:
    mode: str
    times: int


# A Stripe shared payment token (agentic commerce): charged through payment_method_data.
SHARED_PAYMENT_TOKEN_PREFIX = "spt_"


class FaultDrillHTTPClient(stripe.HTTPClient):
    """Wraps the real HTTP client; injects one failure mode on matching requests.

    A drill is armed for a provider key prefix (an operation's key) and a step; it fires
    `times` times. Nothing is faked about the provider itself: "after send" modes really
    send the request, and the provider really applies it.
    """

    name = "verity-fault-drill"

    def __init__(
        self,
        inner: stripe.HTTPClient,
        *,
        random_rate: float = 0.0,
        random_modes: tuple[str, ...] = (),
        seed: int = 0,
    ) -> None:
        super().__init__()
        self._inner = inner
        self._lock = threading.Lock()
        self._armed: dict[tuple[str, str], _ArmedDrill] = {}
        # Chaos mode for the soak: a seeded fraction of requests gets a random drill.
        self._random_rate = random_rate
        self._random_modes = tuple(random_modes)
        self._rng = random.Random(seed)
        self._local = threading.local()

    def last_drill(self) -> str:
        return getattr(self._local, "mode", "")

    def arm(self, *, key_prefix: str, step: str, mode: str, times: int = 1) -> None:
        if mode not in DrillMode.ALL:
            raise ValueError(f"unknown drill {mode}")
        with self._lock:
            self._armed[(key_prefix, step)] = _ArmedDrill(mode, times)

    def disarm_all(self) -> None:
        with self._lock:
            self._armed.clear()

    def _take(self, method: str, headers: Mapping[str, str] | None, url: str = "") -> str:
        key = (headers or {}).get("Idempotency-Key", "")
        if self._random_rate:
            with self._lock:
                hit = self._rng.random() < self._random_rate
                if method.lower() == "get":
                    modes = [m for m in self._random_modes if m == DrillMode.READ_UNAVAILABLE]
                else:
                    modes = [m for m in self._random_modes if m in DrillMode.WRITES]
                if hit and modes:
                    return self._rng.choice(modes)
        if not key and method.lower() == "get":
            return self._take_read(url)
        if ":" not in key:
            return ""
        prefix, step = key.rsplit(":", 1)
        with self._lock:
            # key_prefix "*" arms the next request of that step, whatever its operation.
            armed = self._armed.get((prefix, step))
            if not armed or armed.times <= 0:
                armed = self._armed.get(("*", step))
            if not armed or armed.times <= 0:
                return ""
            armed.times -= 1
            return armed.mode

    def _take_read(self, url: str) -> str:
        """Reads carry no key: a read drill is armed with step "read" and key_prefix "*"
        (any read) or a provider object id that appears in the URL (reads of it)."""
        with self._lock:
            for (prefix, step), armed in self._armed.items():
                if step != "read" or armed.times <= 0:
                    continue
                if prefix == "*" or (prefix and prefix in url):
                    armed.times -= 1
                    return armed.mode
        return ""

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None,
        post_data: Any = None,
        *,
        _usage: list[str] | None = None,
    ) -> tuple[str, int, Mapping[str, str]]:
        mode = self._take(method, headers, url)
        self._local.mode = mode
        drill_header = {"Verity-Fault-Drill": mode} if mode else {}
        if mode in (DrillMode.TIMEOUT_BEFORE_SEND, DrillMode.READ_UNAVAILABLE):
            raise stripe.APIConnectionError(
                "fault drill: connect timeout", should_retry=False
            ) from requests.exceptions.ConnectTimeout(
                urllib3.exceptions.ConnectTimeoutError(None, "fault drill")
            )
        if mode == DrillMode.HTTP_429:
            body = json.dumps(
                {
                    "error": {
                        "type": "invalid_request_error",
                        "code": "rate_limit",
                        "message": "fault drill: too many requests",
                    }
                }
            )
            return body, 429, drill_header
        if mode == DrillMode.HTTP_409:
            body = json.dumps(
                {
                    "error": {
                        "type": "invalid_request_error",
                        "code": "idempotency_key_in_use",
                        "message": "fault drill: key in use",
                    }
                }
            )
            return body, 409, drill_header
        if mode == DrillMode.HTTP_400_REFUSED:
            body = json.dumps(
                {
                    "error": {
                        "type": "invalid_request_error",
                        "code": "charge_already_refunded",
                        "message": "fault drill: Charge has already been refunded.",
                    }
                }
            )
            return body, 400, drill_header
        if mode == DrillMode.READ_SLOW:
            threading.Event().wait(DrillMode.SLOW_READ_SECONDS)
        body, status, resp_headers = self._inner.request(method, url, headers, post_data)
        if mode == DrillMode.READ_LATE_ANSWER:
            threading.Event().wait(DrillMode.SLOW_READ_SECONDS)
        if mode == DrillMode.HANG_AFTER_SEND:
            threading.Event().wait()
        if mode == DrillMode.DROP_RESPONSE_AFTER_SEND:
            raise stripe.APIConnectionError(
                "fault drill: response dropped", should_retry=False
            ) from requests.exceptions.ReadTimeout()
        if mode == DrillMode.RESET_AFTER_WRITE:
            raise stripe.APIConnectionError(
                "fault drill: connection reset", should_retry=False
            ) from requests.exceptions.ConnectionError(
                urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError())
            )
        if mode == DrillMode.HTTP_500:
            body = json.dumps({"error": {"type": "api_error", "message": "fault drill"}})
            return body, 500, {**dict(resp_headers or {}), **drill_header}
        return body, status, resp_headers

    def close(self) -> None:
        self._inner.close()


def _never_connected(exc: stripe.APIConnectionError) -> bool:
    """True only when the request provably never left: no connection was established."""
    cause = exc.__cause__
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return True
    if isinstance(cause, requests.exceptions.ConnectionError) and cause.args:
        reason = getattr(cause.args[0], "reason", cause.args[0])
        return isinstance(
            reason,
            (
                urllib3.exceptions.NewConnectionError,
                urllib3.exceptions.ConnectTimeoutError,
                urllib3.exceptions.NameResolutionError,
            ),
        )
    return False


def _clock_skew_seconds(
    listed: Any, sent: datetime, received: datetime
) -> tuple[float, float] | None:
    """How far the provider's clock (its answer's `Date` header) is from the clock the
    read's bounds were stamped by: the nearest and the farthest it can be, or None when
    the answer carries none. `sent` and `received` are that clock's readings just before
    the request and just after its answer: the Date (whole seconds, rounded down) was
    stamped somewhere between them, so the clocks are apart by something between the
    Date's distance from the span [sent - 1 s, received] (nearest: 0 inside it) — not
    from one reading, which a slow answer on a loaded host would push seconds away — and
    its distance from the span's far end (farthest: a slow request leaves that much
    unknown). Signed: positive when the provider's clock runs ahead."""
    response = getattr(listed, "last_response", None)
    headers: Any = getattr(response, "headers", None)
    if not hasattr(headers, "get"):
        return None
    stamp = headers.get("Date") or headers.get("date")
    try:
        theirs = parsedate_to_datetime(stamp) if stamp else None
    except (TypeError, ValueError):
        return None
    if theirs is None or theirs.tzinfo is None:
        return None
    early = (theirs - (sent - timedelta(seconds=1))).total_seconds()
    late = (theirs - received).total_seconds()
    nearest = early if early < 0 else max(late, 0.0)
    farthest = early if abs(early) >= abs(late) else late
    return nearest, farthest


def _replayed(headers: Any) -> bool:
    """Stripe's `Idempotent-Replayed: true`: the answer is the key's stored one."""
    if not hasattr(headers, "get"):
        return False
    value = headers.get("Idempotent-Replayed") or headers.get("idempotent-replayed") or ""
    return str(value).lower() == "true"


def _as_dict(value: Any) -> Any:
    return value.to_dict() if hasattr(value, "to_dict") else value


def _str(value: Any) -> str:
    value = _as_dict(value)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return str(getattr(value, "id", "") or (value.get("id", "") if hasattr(value, "get") else ""))


def normalise(data: Any, *, account: str = "") -> ProviderObject:
    """Safe fields of a PaymentIntent or Refund (SDK object or plain dict)."""
    data = _as_dict(data)
    get = data.get
    object_type = get("object") or ""
    error = get("last_payment_error") or None
    failure_code = ""
    if error:
        failure_code = error.get("decline_code") or error.get("code") or "card_error"
    elif object_type == "refund":
        failure_code = get("failure_reason") or ""
    metadata = get("metadata") or {}
    return StripeObject(
        object_type=object_type,
        id=get("id") or "",
        status=get("status") or "",
        amount=int(get("amount") or 0),
        currency=(get("currency") or "").lower(),
        metadata={str(k): str(v) for k, v in dict(metadata).items()},
        account=account or "",
        # latest_charge is an embedded object on localstripe and an id on Stripe.
        latest_charge=_str(get("latest_charge")) or _first_charge_id(data),
        payment_intent=_str(get("payment_intent")),
        failure_code=str(failure_code),
        has_payment_error=bool(error),
        capture_method=get("capture_method") or "",
    )


def _first_charge_id(data: Any) -> str:
    charges = data.get("charges") if hasattr(data, "get") else None
    try:
        return charges["data"][0]["id"] if charges and charges["data"] else ""
    except (KeyError, TypeError, IndexError):
        return ""


def _sdk(params: dict[str, Any]) -> Any:
    """A request's parameters for the SDK, whose TypedDicts spell enums as literals (and do
    not list `payment_method_data.shared_payment_granted_token`): the values come from
    stored operations and the provider checks them (a bad one is its 400, classified
    REJECTED), so the shape is not re-checked here."""
    return params


class StripeProvider:
    """The card rail (payments.providers.base.PaymentProvider)."""

    rail = "stripe"
    reference_is_identity = True  # the PaymentIntent's / Refund's id names it
    has_capture_and_void = True
    no_capture_or_void_why = ""
    takes_payment_method_token = True
    refunds_need_a_person = False  # within the client's allowance

    def object_type_for(self, kind: str) -> str:
        return "refund" if kind == OperationKind.REFUND else "payment_intent"

    def dedupes_idempotency_keys(self) -> bool:
        # Stripe does, within its window; localstripe does not.
        return bool(settings.STRIPE_DEDUPES_KEYS)

    def pays_in_one_call(self) -> bool:
        # The rail adapter chooses, not its callers: one round trip only where a lost
        # answer can be asked again under the same key
        # (docs/reliability.md#one-round-trip-where-the-provider-dedupes-keys).
        return self.dedupes_idempotency_keys()

    def refund_refusal(self) -> RailRefusal | None:
        return None

    def __init__(self, *, api_key: str, api_base: str | None, drills: bool) -> None:
        inner = stripe.RequestsClient(
            timeout=(settings.STRIPE_CONNECT_TIMEOUT, settings.STRIPE_READ_TIMEOUT)
        )
        self.live = api_key.startswith(("sk_live", "rk_live"))
        self.drill_client: FaultDrillHTTPClient | None = None
        http_client: stripe.HTTPClient = inner
        if drills and not self.live:
            self.drill_client = FaultDrillHTTPClient(
                inner,
                random_rate=settings.FAULT_DRILL_RANDOM_RATE,
                random_modes=tuple(settings.FAULT_DRILL_RANDOM_MODES),
                seed=settings.FAULT_DRILL_RANDOM_SEED,
            )
            http_client = self.drill_client
        base: BaseAddresses | None = {"api": api_base} if api_base else None
        self.client = stripe.StripeClient(
            api_key, base_addresses=base, http_client=http_client, max_network_retries=0
        )

    @property
    def account(self) -> str:
        """The platform account, read on each use: the provider is built once per process
        (get_provider), and a value kept from that moment would outlive a settings change
        (a test's override once leaked into every later test of its worker)."""
        account: str = settings.STRIPE_ACCOUNT
        return account

    # -- fault drills ---------------------------------------------------------------
    def arm_drill(self, *, key_prefix: str, step: str, mode: str, times: int = 1) -> None:
        if self.live:
            raise DrillRefused("fault drills are refused for live keys")
        if self.drill_client is None:
            raise DrillRefused("fault drills are disabled for this provider")
        self.drill_client.arm(key_prefix=key_prefix, step=step, mode=mode, times=times)

    # -- classification -------------------------------------------------------------
    def _call(self, fn: Callable[[], object], *, step: str) -> CallResult:
        result = self._call_unlabelled(fn, step=step)
        drill = self.drill_client.last_drill() if self.drill_client else ""
        if drill and not result.fault_drill:
            result = replace(result, fault_drill=drill)
        return result

    def _call_unlabelled(self, fn: Callable[[], object], *, step: str) -> CallResult:
        try:
            obj = fn()
        except stripe.APIConnectionError as exc:
            cls = Classification.NOT_SENT if _never_connected(exc) else Classification.UNKNOWN
            return CallResult(cls, detail=type(exc.__cause__).__name__)
        except stripe.CardError as exc:
            body = exc.json_body.get("error", {}) if isinstance(exc.json_body, dict) else {}
            pi = body.get("payment_intent")
            return CallResult(
                Classification.DECLINED,
                http_status=exc.http_status,
                request_id=exc.request_id or "",
                error_code=exc.code or "card_declined",
                object=normalise(pi, account=self.account) if pi else None,
                replayed=_replayed(exc.headers),
            )
        except stripe.RateLimitError as exc:
            return CallResult(
                Classification.RETRYABLE,
                http_status=exc.http_status,
                request_id=exc.request_id or "",
                error_code="rate_limited",
            )
        except stripe.IdempotencyError as exc:
            return CallResult(
                Classification.UNKNOWN,
                http_status=exc.http_status,
                request_id=exc.request_id or "",
                error_code="idempotency_error",
            )
        except stripe.StripeError as exc:
            status = exc.http_status or 0
            headers = exc.headers or {}
            drill = headers.get("Verity-Fault-Drill", "") if hasattr(headers, "get") else ""
            should_retry = str(headers.get("Stripe-Should-Retry", "")).lower() == "true"
            if status == 409 or status >= 500:
                cls = Classification.UNKNOWN
            elif should_retry:
                cls = Classification.RETRYABLE
            elif 400 <= status < 500:
                cls = Classification.REJECTED
            else:
                cls = Classification.UNKNOWN
            return CallResult(
                cls,
                http_status=status or None,
                request_id=exc.request_id or "",
                error_code=exc.code or type(exc).__name__,
                fault_drill=drill,
            )
        response = getattr(obj, "last_response", None)
        return CallResult(
            Classification.OK,
            http_status=getattr(response, "code", 200),
            request_id=getattr(response, "request_id", "") or "",
            object=normalise(obj, account=self.account),
            replayed=_replayed(getattr(response, "headers", None)),
        )

    # -- writes (each with its own "<key>:<step>" idempotency key) -------------------
    def create_payment_intent(
        self,
        *,
        key: str,
        amount: int,
        currency: str,
        payment_method: str,
        capture_method: str,
        metadata: dict[str, Any],
    ) -> CallResult:
        """Create only (the two-step flow): the id is stored before money can move."""
        return self._create(
            key=key,
            amount=amount,
            currency=currency,
            payment_method=payment_method,
            capture_method=capture_method,
            metadata=metadata,
            confirm=False,
        )

    def create_and_confirm_payment_intent(
        self,
        *,
        key: str,
        amount: int,
        currency: str,
        payment_method: str,
        capture_method: str,
        metadata: dict[str, Any],
    ) -> CallResult:
        """The one-call payment, `create` with `confirm=true`: only where the provider
        dedupes keys (`pays_in_one_call`). Built from the arguments alone, so a re-send
        with the same arguments under the same key is the same request."""
        return self._create(
            key=key,
            amount=amount,
            currency=currency,
            payment_method=payment_method,
            capture_method=capture_method,
            metadata=metadata,
            confirm=True,
        )

    def _create(
        self,
        *,
        key: str,
        amount: int,
        currency: str,
        payment_method: str,
        capture_method: str,
        metadata: dict[str, Any],
        confirm: bool,
    ) -> CallResult:
        if payment_method.startswith(SHARED_PAYMENT_TOKEN_PREFIX):
            return self.create_payment_intent_with_shared_token(
                key=key,
                amount=amount,
                currency=currency,
                token=payment_method,
                capture_method=capture_method,
                metadata=metadata,
                confirm=confirm,
            )
        params: dict[str, Any] = {
            "amount": amount,
            "currency": currency,
            "payment_method": payment_method,
            "capture_method": capture_method,
            "metadata": metadata,
        }
        if confirm:
            params["confirm"] = True
        return self._call(
            lambda: self.client.v1.payment_intents.create(
                params=_sdk(params), options={"idempotency_key": key}
            ),
            step="create",
        )

    def create_payment_intent_with_shared_token(
        self,
        *,
        key: str,
        amount: int,
        currency: str,
        token: str,
        capture_method: str,
        metadata: dict[str, Any],
        confirm: bool = False,
    ) -> CallResult:
        """A shared payment token (spt_…) an agent platform delegated (ACP): Stripe
        takes it as `payment_method_data[shared_payment_granted_token]` on the PaymentIntent
        and resolves it to the granted PaymentMethod, within the token's usage limits
        (amount, currency, expiry, single use). Same two steps as any payment: created
        unconfirmed under its own key, then confirmed by `confirm_payment_intent` — or,
        where the provider dedupes keys, created with `confirm=true` in one request."""
        params: dict[str, Any] = {
            "amount": amount,
            "currency": currency,
            "capture_method": capture_method,
            "payment_method_data": {"shared_payment_granted_token": token},
            "metadata": metadata,
        }
        if confirm:
            params["confirm"] = True
        return self._call(
            lambda: self.client.v1.payment_intents.create(
                params=_sdk(params), options={"idempotency_key": key}
            ),
            step="create",
        )

    def confirm_payment_intent(self, *, key: str, intent_id: str) -> CallResult:
        return self._call(
            lambda: self.client.v1.payment_intents.confirm(
                intent_id, options={"idempotency_key": key}
            ),
            step="confirm",
        )

    def capture_payment_intent(
        self, *, key: str, intent_id: str, amount: int | None = None
    ) -> CallResult:
        params: PaymentIntentCaptureParams = {"amount_to_capture": amount} if amount else {}
        return self._call(
            lambda: self.client.v1.payment_intents.capture(
                intent_id, params=params, options={"idempotency_key": key}
            ),
            step="capture",
        )

    def cancel_payment_intent(self, *, key: str, intent_id: str) -> CallResult:
        return self._call(
            lambda: self.client.v1.payment_intents.cancel(
                intent_id, options={"idempotency_key": key}
            ),
            step="cancel",
        )

    def create_refund(
        self, *, key: str, intent_id: str, amount: int, metadata: dict[str, Any]
    ) -> CallResult:
        params: RefundCreateParams = {
            "payment_intent": intent_id,
            "amount": amount,
            "metadata": metadata,
        }
        return self._call(
            lambda: self.client.v1.refunds.create(params=params, options={"idempotency_key": key}),
            step="refund",
        )

    # -- reads ----------------------------------------------------------------------
    def retrieve_payment_intent(self, intent_id: str) -> CallResult:
        return self._read(lambda: self.client.v1.payment_intents.retrieve(intent_id))

    def retrieve_refund(self, refund_id: str) -> CallResult:
        return self._read(lambda: self.client.v1.refunds.retrieve(refund_id))

    def _read(self, fn: Callable[[], object]) -> CallResult:
        result = self._call(fn, step="retrieve")
        if result.classification == Classification.REJECTED and result.http_status == 404:
            return CallResult(
                Classification.NOT_FOUND, http_status=404, request_id=result.request_id
            )
        return result

    def retrieve_dispute(self, dispute_id: str) -> tuple[CallResult, DisputeObject | None]:
        """(CallResult, DisputeObject | None): the dispute as the provider holds it."""

        found: list[Any] = []

        def fetch() -> dict[str, str]:
            found.append(_as_dict(self.client.v1.disputes.retrieve(dispute_id)))
            return {"object": "dispute"}

        result = self._read(fetch)
        if result.classification != Classification.OK or not found:
            return result, None
        return result, dispute_from_payload(found[0], account=self.account)

    def list_refunds_for_intent(self, intent_id: str) -> tuple[CallResult, list[ProviderObject]]:
        """(CallResult, [ProviderObject]): every refund of one PaymentIntent, bounded."""
        out: list[ProviderObject] = []
        params: RefundListParams = {"limit": LIST_PAGE_LIMIT, "payment_intent": intent_id}
        for _ in range(LIST_MAX_PAGES):
            pages: list[Any] = []

            def fetch(pages: list[Any] = pages) -> dict[str, str]:  # this page's list, bound now
                pages.append(self.client.v1.refunds.list(params=RefundListParams(**params)))
                return {"object": "list"}

            result = self._call(fetch, step="list")
            if result.classification != Classification.OK:
                return result, []
            page = pages[0]
            out.extend(normalise(item, account=self.account) for item in map(_as_dict, page.data))
            if not page.data or not page.has_more:
                break
            params["starting_after"] = page.data[-1].id
        return CallResult(Classification.OK, http_status=200), out

    def find_by_metadata(
        self,
        *,
        object_type: str,
        operation_id: str,
        created_since: datetime,
        created_until: datetime | None = None,
        now: Callable[[], datetime],
    ) -> CallResult:
        """Page through the objects the provider made between the operation's creation and
        the latest its sends can have made one (`created_until`, None while that is not yet
        past), each bound widened by a margin for the two clocks, newest first, bounded.
        Both bounds are stamps of one clock, `now` (the database's, whichever host wrote
        them), never the reading host's own.
        Not the search API: it lags up to a minute, and localstripe has none. Unbounded
        below, a read for an object the provider never made pages every object of a busy
        account before it can say "none"; unbounded above, a late read pages every object
        made since and is crowded out of its page bound.

        "None" is a verdict a caller acts on (no money moved), and the bounds are `now`'s
        clock's: it is said only while the provider's clock (its `Date` header) agrees
        with `now` within half the margin, and a slow request leaves them at most the
        margin apart; otherwise, or with no `Date` to check, "not read"."""
        service = (
            self.client.v1.payment_intents
            if object_type == "payment_intent"
            else self.client.v1.refunds
        )
        margin = timedelta(seconds=settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS)
        created: dict[str, int] = {"gte": math.floor((created_since - margin).timestamp())}
        if created_until is not None and created_until + margin < now():
            created["lte"] = math.floor((created_until + margin).timestamp())
        # The bounds are settings so a test can reach them without thousands of objects.
        params: dict[str, Any] = {
            "limit": getattr(settings, "PROVIDER_LIST_PAGE_LIMIT", LIST_PAGE_LIMIT),
            "created": created,
        }
        for _ in range(getattr(settings, "PROVIDER_LIST_MAX_PAGES", LIST_MAX_PAGES)):
            pages: list[Any] = []

            def fetch(pages: list[Any] = pages) -> dict[str, str]:  # this page's list, bound now
                pages.append(service.list(params=_sdk(dict(params))))
                return {"object": "list"}

            sent = now()
            result = self._call(fetch, step="list")
            if result.classification != Classification.OK:
                return result
            page, received = pages[0], now()
            for item in map(_as_dict, page.data):
                if (item.get("metadata") or {}).get("operation_id") == operation_id:
                    found = normalise(item, account=self.account)
                    return CallResult(Classification.OK, http_status=200, object=found)
            if not page.data or not page.has_more:
                skew = _clock_skew_seconds(page, sent, received)
                if skew is None:
                    # No clock to check the bounds against: "none" would be a guess.
                    log.warning("read by metadata: the provider's answer has no readable Date")
                    return CallResult(Classification.UNKNOWN, detail="provider_clock_unknown")
                nearest, farthest = skew
                tolerance = max(margin.total_seconds() / 2, 2)
                # The clocks seen apart, or a request so slow that they may be apart by
                # more than the margin the window was widened by (twice the tolerance):
                # an object stamped outside the window may exist.
                if abs(nearest) > tolerance or abs(farthest) > 2 * tolerance:
                    log.warning(
                        "read by metadata: provider clock %+.0f to %+.0f s from the database's",
                        nearest,
                        farthest,
                    )
                    return CallResult(Classification.UNKNOWN, detail="provider_clock_skew")
                return CallResult(Classification.NOT_FOUND)  # searched every page
            params["starting_after"] = page.data[-1].id
        # Gave up at the page bound with more pages left: that is not "the provider has no
        # such object" (a verdict a refund's read-back acts on: no money moved), only "not
        # read". Absence of evidence is not failure.
        return CallResult(Classification.UNKNOWN, detail="list_page_bound_reached")

    def count_succeeded_for_purchase(self, purchase_id: str) -> int:
        """Drill/soak evidence: PaymentIntents at the provider that moved money."""
        count = 0
        params: PaymentIntentListParams = {"limit": LIST_PAGE_LIMIT}
        for _ in range(LIST_MAX_PAGES):
            page = self.client.v1.payment_intents.list(params=PaymentIntentListParams(**params))
            for item in map(_as_dict, page.data):
                if (item.get("metadata") or {}).get("purchase_id") == purchase_id and item.get(
                    "status"
                ) in ("succeeded", "requires_capture"):
                    count += 1
            if not page.data or not page.has_more:
                break
            params["starting_after"] = page.data[-1].id
        return count

    def list_balance_transactions(self, *, limit: int = 100) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        params: BalanceTransactionListParams = {"limit": min(limit, LIST_PAGE_LIMIT)}
        for _ in range(LIST_MAX_PAGES):
            page = self.client.v1.balance_transactions.list(
                params=BalanceTransactionListParams(**params)
            )
            data = [
                dict(
                    amount=b.get("amount"),
                    currency=b.get("currency"),
                    source=_str(b.get("source")),
                    type=b.get("type"),
                    id=b.get("id"),
                    fee=b.get("fee") or 0,
                    reporting_category=b.get("reporting_category") or "",
                )
                for b in map(_as_dict, page.data)
            ]
            out.extend(data)
            if not page.has_more or not page.data or len(out) >= limit:
                break
            params["starting_after"] = page.data[-1].id
        return out

    def balance_transaction_source(self, txn_id: str) -> str | None:
        """The charge/refund (`ch_…`/`re_…`) a balance transaction (`txn_…`) belongs to,
        so a person holding a `txn_…` id from the provider's dashboard finds its purchase.
        Read-only; None when the provider does not know it or cannot be reached."""
        try:
            txn = _as_dict(self.client.v1.balance_transactions.retrieve(txn_id))
        except stripe.StripeError:
            return None
        return _str(txn.get("source")) or None


@lru_cache(maxsize=1)
def get_provider() -> StripeProvider:
    """One provider per process (the SDK client is thread-safe; sessions are per thread)."""
    return StripeProvider(
        api_key=settings.STRIPE_API_KEY,
        api_base=settings.STRIPE_API_BASE,
        drills=settings.FAULT_DRILLS_ENABLED,
    )


# The settings the provider is built from. Settings never change in a running deployment;
# a test's override does, and a provider built under it would outlive the test (found by
# an attack: a test with FAULT_DRILLS_ENABLED off, first of its worker to build the
# provider, made every later drill DrillRefused).
_BUILT_FROM = frozenset(
    {
        "STRIPE_API_KEY",
        "STRIPE_API_BASE",
        "STRIPE_CONNECT_TIMEOUT",
        "STRIPE_READ_TIMEOUT",
        "FAULT_DRILLS_ENABLED",
        "FAULT_DRILL_RANDOM_RATE",
        "FAULT_DRILL_RANDOM_MODES",
        "FAULT_DRILL_RANDOM_SEED",
    }
)


@receiver(setting_changed)
def _rebuild_on_setting_changed(*, setting: str, **_kwargs: object) -> None:
    if setting in _BUILT_FROM:
        get_provider.cache_clear()
