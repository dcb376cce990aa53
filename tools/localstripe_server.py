"""Start localstripe bound to 127.0.0.1 with its on-disk persistence turned off.

localstripe itself listens on every interface and pickles its store to
/tmp/localstripe.pickle on each write (then reloads it at start). Both are wrong for a
sandbox shared by tests: this launcher binds loopback only and keeps the store in memory.
Usage: python -m tools.localstripe_server [--port 8420] [--webhook-url U --webhook-secret S]
       [--delivery-log FILE] [--idempotency]
`--delivery-log` keeps localstripe's own account of each webhook delivery (one line each,
"successfully delivered" or "failed with response code N"): `make run` writes it under
var/ and the newcomer smoke test asserts every delivery was a 2xx.

localstripe has no disputes. This launcher adds the minimal Dispute resource Verity's
read-back needs, in Stripe's object shape (`GET /v1/disputes/{id}`, `GET /v1/disputes`),
plus two sandbox-only routes that play the card network's part (like a test card that
gets disputed): `POST /_config/disputes` {charge, reason?, amount?, fee?, due_by?}
opens a dispute and withdraws the amount plus the fee from the balance (an `adjustment`
balance transaction, reporting category `dispute`); with `inquiry=true` it opens an
inquiry instead (`warning_needs_response`: the bank asks, no funds are withdrawn, no fee),
which closes with `warning_closed`; `POST /_config/disputes/{id}`
{status, fee_returned?} moves it (`under_review`, `won` -> a `dispute_reversal`
adjustment reinstating the amount, `lost`, `warning_closed`, `charge_refunded`).
Events are not sent: tests sign `charge.dispute.*` events built from this object.

localstripe has no shared payment tokens (agentic commerce). This launcher adds
the minimal SharedPaymentGrantedToken Stripe documents: the test helper that plays the
agent platform's part, `POST /v1/test_helpers/shared_payment/granted_tokens`
{payment_method, usage_limits[currency], usage_limits[max_amount], usage_limits[expires_at]}
-> `spt_…`; `GET /v1/shared_payment/granted_tokens/{id}`; and a PaymentIntent created with
`payment_method_data[shared_payment_granted_token]` resolves the token to its payment
method. The token is single use (consumed by the PaymentIntent it creates), refused once
expired, and refused for another currency or an amount above its `max_amount`: a 400
`invalid_request_error` whose `code` names why, and no PaymentIntent.

localstripe ignores idempotency keys. This launcher adds Stripe's idempotency layer
(docs.stripe.com/api/idempotent_requests), off unless `--idempotency` is given or
`POST /_config/idempotency` {enabled: true} turns it on: a POST under /v1/ with an
`Idempotency-Key` header stores its status and body once the endpoint began executing (a
2xx, a 402 decline, a 500 alike; a 400/401/404 refusal before execution is not stored);
the same key with the same method, path and parameters answers the stored result with
`Idempotent-Replayed: true`; other parameters answer 400 `idempotency_error`; the same key
while the first request is still executing answers 409 `idempotency_key_in_use`. Keys are
scoped per API key and expire `window_seconds` after their first use (86400, Stripe's
24 h), after which the key runs a new request. `POST /_config/idempotency` also takes
`window_seconds` (a test moves a key to its window's edge), `hold_seconds` (each keyed
request waits that long while in progress: a concurrent one meets the 409) and `flush`;
`GET /_config/idempotency` reports the settings and the keys held.
A refund returns at most what is left of its charge, as Stripe refuses more (localstripe
does not check): 400 `amount_too_large`, or `charge_already_refunded` once nothing is left.
Lists answer newest first, as Stripe's do ("the most recent appearing first"); localstripe
answered its store's insertion order, oldest first, for every resource that does not sort
(PaymentIntents among them). A read-back by metadata pages from the first page, so it found
a recent payment only after paging through every older one: in a long soak each lost answer
cost up to 20 pages of 100 PaymentIntents, localstripe's one event loop fell behind, and past
2 000 PaymentIntents the page bound left recent ones unread.
A PaymentIntent is created with `confirm=true` as Stripe does it (create, then confirm in
the same request; a decline is a 402 whose body carries the PaymentIntent).
"""

import argparse
import asyncio
import json
import logging
import operator
import socket
import time
from email.utils import formatdate
from typing import Any

from aiohttp import web
from localstripe import resources, server
from localstripe.errors import UserError

DISPUTE_FEE = 1500  # minor units, Stripe's US dispute fee
DISPUTE_STATUSES = (
    "warning_needs_response",
    "warning_under_review",
    "warning_closed",
    "needs_response",
    "under_review",
    "won",
    "lost",
    "charge_refunded",
)


def _adjustment(*, amount: int, fee: int, currency: str, source: str, category: str):
    """A balance transaction localstripe's constructor refuses (it knows only charges and
    refunds), built the way it builds its own."""
    txn = resources.BalanceTransaction.__new__(resources.BalanceTransaction)
    resources.StripeObject.__init__(txn)
    txn.amount, txn.currency, txn.fee = amount, currency, fee
    txn.available_on = txn.created
    txn.description = "Chargeback withdrawal" if amount < 0 else "Chargeback reversal"
    txn.exchange_rate = None
    txn.fee_details = (
        [
            {
                "amount": fee,
                "currency": currency,
                "type": "stripe_fee",
                "description": "Dispute fee",
                "application": None,
            }
        ]
        if fee
        else []
    )
    txn.reporting_category = category
    txn.source = source
    txn.status = "available"
    txn.type = "adjustment"
    return txn


class Dispute(resources.StripeObject):
    """Stripe's Dispute object, the fields Verity reads (and the shape of the rest)."""

    object = "dispute"
    _id_prefix = "dp_"

    def __init__(
        self,
        charge=None,
        reason="fraudulent",
        amount=None,
        fee=DISPUTE_FEE,
        due_by=None,
        inquiry=False,
        **kwargs,
    ):
        if kwargs:
            raise UserError(400, "Unexpected " + ", ".join(kwargs.keys()))
        if not isinstance(charge, str) or not charge.startswith("ch_"):
            raise UserError(400, "Bad request")
        charge_obj = resources.Charge._api_retrieve(charge)
        amount = resources.try_convert_to_int(amount) if amount is not None else charge_obj.amount
        fee = resources.try_convert_to_int(fee)
        super().__init__()
        self.amount = amount
        self.charge = charge
        self.currency = charge_obj.currency
        self.payment_intent = charge_obj.payment_intent
        self.reason = reason
        inquiry = str(inquiry).lower() == "true"
        # An inquiry (a retrieval request) withdraws nothing until it escalates.
        self.status = "warning_needs_response" if inquiry else "needs_response"
        self.is_charge_refundable = inquiry
        self.metadata = {}
        self.evidence = {
            "customer_name": None,
            "customer_email_address": None,
            "product_description": None,
            "uncategorized_text": None,
        }
        self.evidence_details = {
            "due_by": resources.try_convert_to_int(due_by)
            if due_by
            else int(time.time()) + 7 * 86400,
            "has_evidence": False,
            "past_due": False,
            "submission_count": 0,
        }
        self.balance_transactions = (
            []
            if inquiry
            else [
                _adjustment(
                    amount=-amount,
                    fee=fee,
                    currency=self.currency,
                    source=self.id,
                    category="dispute",
                )
            ]
        )
        charge_obj.disputed = True

    def _move(self, status, fee_returned=False):
        if status not in DISPUTE_STATUSES:
            raise UserError(400, "Bad request")
        inquiry = self.status.startswith("warning_")
        if inquiry and status not in ("warning_under_review", "warning_closed"):
            raise UserError(400, "An inquiry closes with warning_closed")
        if not inquiry and status.startswith("warning_"):
            raise UserError(400, "A dispute is not an inquiry")
        if status == "won" and self.status != "won":
            fee = self.balance_transactions[0].fee if str(fee_returned).lower() == "true" else 0
            self.balance_transactions.append(
                _adjustment(
                    amount=self.amount,
                    fee=-fee,
                    currency=self.currency,
                    source=self.id,
                    category="dispute_reversal",
                )
            )
        if status == "under_review":
            self.evidence_details["has_evidence"] = True
            self.evidence_details["submission_count"] += 1
        self.status = status
        return self


def _json(obj) -> web.Response:
    return web.Response(text=json.dumps(obj._export()), content_type="application/json")


async def _open_dispute(request):
    data = await server.get_post_data(request) or {}
    return _json(Dispute(**data))


async def _move_dispute(request):
    data = await server.get_post_data(request) or {}
    dispute = Dispute._api_retrieve(request.match_info["id"])
    return _json(dispute._move(**data))


def add_disputes(app) -> None:
    app.router.add_route("GET", "/v1/disputes/{id}", server.api_retrieve(Dispute, "/v1/disputes"))
    app.router.add_route("GET", "/v1/disputes", server.api_list_all(Dispute, "/v1/disputes"))
    app.router.add_route("POST", "/_config/disputes", _open_dispute)
    app.router.add_route("POST", "/_config/disputes/{id}", _move_dispute)


class SharedPaymentGrantedToken(resources.StripeObject):
    """Stripe's SharedPaymentGrantedToken, the fields a merchant reads."""

    object = "shared_payment.granted_token"
    _id_prefix = "spt_"

    def __init__(
        self, payment_method=None, usage_limits=None, customer=None, metadata=None, **kwargs
    ):
        if kwargs:
            raise UserError(400, "Unexpected " + ", ".join(kwargs.keys()))
        limits = usage_limits if isinstance(usage_limits, dict) else {}
        max_amount = resources.try_convert_to_int(limits.get("max_amount"))
        expires_at = resources.try_convert_to_int(limits.get("expires_at"))
        currency = limits.get("currency")
        if (
            not isinstance(payment_method, str)
            or not isinstance(max_amount, int)
            or max_amount <= 0
            or not isinstance(currency, str)
            or not currency
            or not isinstance(expires_at, int)
        ):
            raise UserError(400, "Bad request")
        # pm_card_visa & co. become a stored PaymentMethod, as a PaymentIntent makes them.
        method = resources.PaymentMethod._api_retrieve(payment_method)
        super().__init__()
        self.payment_method = method.id
        self.customer = customer
        self.metadata = metadata or {}
        self.usage_limits = {
            "currency": currency.lower(),
            "max_amount": max_amount,
            "expires_at": expires_at,
        }
        self.usage_details = {"amount_captured": None}
        self.deactivated_at = None
        self.deactivated_reason = None

    def _refuse(self, code: str, message: str):
        raise UserError(400, message, {"code": code, "param": "payment_method_data"})

    def _check(self, *, amount, currency) -> None:
        now = int(time.time())
        if self.deactivated_reason == "consumed":
            self._refuse(
                "shared_payment_granted_token_consumed",
                "This shared payment token was already used.",
            )
        if self.deactivated_reason or now >= self.usage_limits["expires_at"]:
            self._refuse(
                "shared_payment_granted_token_expired", "This shared payment token has expired."
            )
        if (currency or "").lower() != self.usage_limits["currency"]:
            self._refuse(
                "shared_payment_granted_token_usage_limit_exceeded",
                "This shared payment token is for another currency.",
            )
        if not isinstance(amount, int) or amount > self.usage_limits["max_amount"]:
            self._refuse(
                "shared_payment_granted_token_usage_limit_exceeded",
                "The amount exceeds this shared payment token's max_amount.",
            )

    def _consume(self, *, amount) -> None:
        self.deactivated_at = int(time.time())
        self.deactivated_reason = "consumed"
        self.usage_details = {"amount_captured": amount}


_payment_intent_create = resources.PaymentIntent._api_create.__func__


def _payment_intent_create_with_shared_token(cls, **data):
    """PaymentIntent create that understands payment_method_data[shared_payment_granted_token]
    (localstripe refuses payment_method_data); anything else goes to localstripe as is."""
    method_data = data.get("payment_method_data")
    if not (isinstance(method_data, dict) and "shared_payment_granted_token" in method_data):
        return _payment_intent_create(cls, **data)
    if len(method_data) != 1 or data.get("payment_method"):
        raise UserError(400, "Bad request")
    token_id = method_data["shared_payment_granted_token"]
    if not isinstance(token_id, str) or not token_id.startswith("spt_"):
        raise UserError(400, "Bad request")
    try:
        token = SharedPaymentGrantedToken._api_retrieve(token_id)
    except UserError:
        raise UserError(
            400,
            "No such shared payment token.",
            {"code": "resource_missing", "param": "payment_method_data"},
        ) from None
    amount = resources.try_convert_to_int(data.get("amount"))
    token._check(amount=amount, currency=data.get("currency"))
    data = {k: v for k, v in data.items() if k != "payment_method_data"}
    intent = _payment_intent_create(cls, **data, payment_method=token.payment_method)
    token._consume(amount=amount)  # only once a PaymentIntent exists for it
    intent.shared_payment_granted_token = token.id
    return intent


async def _issue_shared_token(request):
    data = await server.get_post_data(request) or {}
    return _json(SharedPaymentGrantedToken(**data))


def add_shared_payment_tokens(app) -> None:
    resources.PaymentIntent._api_create = classmethod(_payment_intent_create_with_shared_token)
    app.router.add_route(
        "POST", "/v1/test_helpers/shared_payment/granted_tokens", _issue_shared_token
    )
    app.router.add_route(
        "GET",
        "/v1/shared_payment/granted_tokens/{id}",
        server.api_retrieve(SharedPaymentGrantedToken, "/v1/shared_payment/granted_tokens"),
    )


def _payment_intent_create_confirming(cls, **data):
    """PaymentIntent create with `confirm=true` (localstripe refuses `confirm`): created,
    then confirmed in the same request, as Stripe does; a decline answers 402 with the
    PaymentIntent in the error body, as Stripe's does."""
    confirm = str(data.pop("confirm", "false")).lower() == "true"
    intent = _payment_intent_create_with_shared_token(cls, **data)
    if not confirm:
        return intent
    try:
        intent._confirm(on_failure_now=intent._report_failure)
    except UserError as err:
        if err.code == 402:
            err.body["error"]["payment_intent"] = intent._export()
        raise
    return intent


_refund_create = resources.Refund._api_create


def _refund_create_within_the_charge(cls, **data):
    """A refund of no more than what is left of the charge, as Stripe allows: more answers
    400 (`charge_already_refunded` once nothing is left), and a refund without an amount
    returns what is left, not the whole charge. localstripe checks neither, so a refund in
    the dashboard and one of Verity's could together return more than was paid — money no
    real provider would move. Input localstripe itself refuses is left to it."""
    charge_id, intent_id = data.get("charge"), data.get("payment_intent")
    try:
        if intent_id and not charge_id:
            charge_id = resources.PaymentIntent._api_retrieve(intent_id).latest_charge.id
        charge = resources.Charge._api_retrieve(charge_id) if charge_id else None
        amount = int(data["amount"]) if data.get("amount") is not None else None
    except (UserError, AttributeError, TypeError, ValueError):
        charge = None  # malformed or unknown: localstripe's own answer
    if charge is not None and charge.status == "succeeded":
        left = charge.amount - charge.amount_refunded
        if left <= 0:
            raise UserError(
                400,
                f"Charge {charge.id} has already been refunded.",
                {"code": "charge_already_refunded"},
            )
        if amount is not None and amount > left:
            raise UserError(
                400,
                f"Refund amount ({amount}) is greater than unrefunded amount on charge ({left})",
                {"code": "amount_too_large", "param": "amount"},
            )
        if amount is None:
            data["amount"] = left
    return _refund_create.__func__(cls, **data)


def add_refund_limits() -> None:
    resources.Refund._api_create = classmethod(_refund_create_within_the_charge)


# Each object type's store keys in insertion (creation) order, kept beside localstripe's
# one store: a list page reads its own type instead of walking every object in the store.
_BY_TYPE: dict[str, dict[str, Any]] = {}
_CREATED_BOUNDS = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}


def _store_set(self, key, value):
    dict.__setitem__(self, key, value)
    _BY_TYPE.setdefault(key.split(":", 1)[0], {})[key] = value


def _store_delete(self, key):
    dict.__delitem__(self, key)
    _BY_TYPE.get(key.split(":", 1)[0], {}).pop(key, None)


def _store_clear(self):
    dict.clear(self)
    _BY_TYPE.clear()


def _created_bounds(created: Any) -> dict[str, int]:
    """`created[gt|gte|lt|lte]=<unix seconds>`, as Stripe's lists take it."""
    if created is None:
        return {}
    if not isinstance(created, dict) or not created or set(created) - set(_CREATED_BOUNDS):
        raise UserError(400, "Invalid created: use created[gt], [gte], [lt] or [lte]")
    bounds = {}
    for name, value in created.items():
        number = resources.try_convert_to_int(value)
        if type(number) is not int:
            raise UserError(400, f"Invalid created[{name}]: an integer (Unix seconds)")
        bounds[name] = number
    return bounds


def _within(obj: Any, bounds: dict[str, int]) -> bool:
    return all(_CREATED_BOUNDS[name](obj.created, limit) for name, limit in bounds.items())


def _newest_first(object_type: str, bounds: dict[str, int]) -> list[Any]:
    """One type's objects, newest first, inside `bounds`: creation order is insertion
    order, so the walk stops at the first one older than a lower bound."""
    lower = {name: limit for name, limit in bounds.items() if name in ("gt", "gte")}
    out = []
    for value in reversed(_BY_TYPE.get(object_type, {}).values()):
        if not _within(value, lower):
            break
        if _within(value, bounds):
            out.append(value)
    return out


def _list_newest_first(cls, url, limit=None, starting_after=None, created=None, **kwargs):
    """localstripe's own list (`StripeObject._api_list_all`), newest first, with Stripe's
    `created` filter: the store keeps insertion order, which is creation order, so its
    reverse is Stripe's order."""
    if kwargs:
        raise UserError(400, "Unexpected " + ", ".join(kwargs.keys()))
    bounds = _created_bounds(created)
    listed = resources.List(url, limit=limit, starting_after=starting_after)
    listed._list = _newest_first(cls.object, bounds)
    return listed


_refund_list = resources.Refund._api_list_all


def _refund_list_created(cls, url, created=None, **kwargs):
    """localstripe's refund list (by charge or PaymentIntent, sorted newest first) with
    Stripe's `created` filter, which it lacks."""
    bounds = _created_bounds(created)
    listed = _refund_list.__func__(cls, url, **kwargs)
    listed._list = [refund for refund in listed._list if _within(refund, bounds)]
    return listed


def add_newest_first_lists() -> None:
    resources.Store.__setitem__ = _store_set
    resources.Store.__delitem__ = _store_delete
    resources.Store.clear = _store_clear
    _BY_TYPE.clear()
    for key, value in resources.store.items():
        _BY_TYPE.setdefault(key.split(":", 1)[0], {})[key] = value
    resources.StripeObject._api_list_all = classmethod(_list_newest_first)
    resources.Refund._api_list_all = classmethod(_refund_list_created)


class IdempotencyLayer:
    """Stripe's idempotency keys (see the module docstring). Single event loop: no lock."""

    def __init__(self) -> None:
        self.enabled = False
        self.window_seconds = 86400.0
        self.hold_seconds = 0.0
        self.entries: dict[tuple[str, str], dict] = {}

    def prune(self, now: float) -> None:
        for scope in [
            s for s, e in self.entries.items() if now - e["created"] >= self.window_seconds
        ]:
            del self.entries[scope]

    def state(self) -> dict:
        return {
            "enabled": self.enabled,
            "window_seconds": self.window_seconds,
            "hold_seconds": self.hold_seconds,
            "keys": len(self.entries),
        }


IDEMPOTENCY = IdempotencyLayer()


def _stripe_error(status: int, error: dict) -> web.Response:
    return web.Response(
        text=json.dumps({"error": error}), status=status, content_type="application/json"
    )


@web.middleware
async def idempotency_middleware(request, handler):
    key = request.headers.get("Idempotency-Key", "")
    if not (
        IDEMPOTENCY.enabled and key and request.method == "POST" and request.path.startswith("/v1/")
    ):
        return await handler(request)
    params = await server.get_post_data(request) or {}
    fingerprint = json.dumps([request.path, params], sort_keys=True, default=str)
    scope = (server.get_api_key(request) or "", key)
    now = time.time()
    IDEMPOTENCY.prune(now)
    entry = IDEMPOTENCY.entries.get(scope)
    if entry is not None:
        if entry["fingerprint"] != fingerprint:
            return _stripe_error(
                400,
                {
                    "type": "idempotency_error",
                    "message": "Keys for idempotent requests can only be used with the same "
                    f"parameters they were first used with. Try using a key other "
                    f"than '{key}' if you meant to execute a different request.",
                },
            )
        if entry["status"] is None:
            return _stripe_error(
                409,
                {
                    "type": "invalid_request_error",
                    "code": "idempotency_key_in_use",
                    "message": "There is currently another in-progress request using this "
                    "Idempotent Key (that probably means you submitted twice, and the "
                    "other request is still going through): " + key + ". Please try "
                    "again later.",
                },
            )
        return web.Response(
            body=entry["body"],
            status=entry["status"],
            content_type="application/json",
            headers={"Idempotent-Replayed": "true", "Original-Request": entry["request_id"]},
        )
    entry = {
        "fingerprint": fingerprint,
        "created": now,
        "status": None,
        "body": b"",
        "request_id": "req_" + resources.random_id(14),
    }
    IDEMPOTENCY.entries[scope] = entry
    try:
        if IDEMPOTENCY.hold_seconds:
            await asyncio.sleep(IDEMPOTENCY.hold_seconds)
        try:
            response = await handler(request)
        except UserError as err:
            response = err.to_response()
        except web.HTTPException:
            raise
        except Exception:  # a fault inside the endpoint is Stripe's 500
            logging.getLogger("localstripe").exception("localstripe endpoint failed")
            response = _stripe_error(
                500, {"type": "api_error", "message": "An unknown error occurred"}
            )
    except BaseException:
        IDEMPOTENCY.entries.pop(scope, None)
        raise
    if response.status in (400, 401, 404):
        # Refused before the endpoint executed (validation): Stripe saves nothing.
        IDEMPOTENCY.entries.pop(scope, None)
        return response
    entry["status"], entry["body"] = response.status, response.body
    response.headers["Request-Id"] = entry["request_id"]
    return response


async def _idempotency_config(request):
    if request.method == "POST":
        data = await server.get_post_data(request) or {}
        if "enabled" in data:
            IDEMPOTENCY.enabled = str(data["enabled"]).lower() == "true"
        if "window_seconds" in data:
            IDEMPOTENCY.window_seconds = float(data["window_seconds"])
        if "hold_seconds" in data:
            IDEMPOTENCY.hold_seconds = float(data["hold_seconds"])
        if str(data.get("flush", "")).lower() == "true":
            IDEMPOTENCY.entries.clear()
    return web.Response(text=json.dumps(IDEMPOTENCY.state()), content_type="application/json")


def add_idempotency(app, *, enabled: bool) -> None:
    IDEMPOTENCY.enabled = enabled
    resources.PaymentIntent._api_create = classmethod(_payment_intent_create_confirming)
    # Innermost: authenticated requests only, and the endpoint's own errors are caught here
    # so they can be stored before error_middleware renders them.
    app.middlewares.append(idempotency_middleware)
    app.router.add_route("POST", "/_config/idempotency", _idempotency_config)
    app.router.add_route("GET", "/_config/idempotency", _idempotency_config)


class Clock:
    """How far the launcher's `Date` header runs ahead of the machine's clock (seconds;
    negative: behind). Only the header moves: a drill of a provider whose clock disagrees
    with Verity's, which Verity must notice before a read bounded by its own clock says
    "none". `POST /_config/clock` with `offset_seconds`, or `date`: a raw `Date` value
    sent as it is (one nobody can read: a provider whose clock cannot be checked); an
    empty `date` goes back to the machine's clock."""

    offset_seconds = 0.0
    raw_date = ""


async def _date_header(request, response) -> None:
    if Clock.raw_date:
        response.headers["Date"] = Clock.raw_date
    elif Clock.offset_seconds:
        response.headers["Date"] = formatdate(time.time() + Clock.offset_seconds, usegmt=True)


async def _clock_config(request):
    if request.method == "POST":
        data = await server.get_post_data(request) or {}
        if "offset_seconds" in data:
            Clock.offset_seconds = float(data["offset_seconds"])
        if "date" in data:
            Clock.raw_date = str(data["date"])
    state = {"offset_seconds": Clock.offset_seconds, "date": Clock.raw_date}
    return web.Response(text=json.dumps(state), content_type="application/json")


def add_clock(app) -> None:
    app.on_response_prepare.append(_date_header)
    app.router.add_route("POST", "/_config/clock", _clock_config)
    app.router.add_route("GET", "/_config/clock", _clock_config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8420)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--webhook-url", default="")
    parser.add_argument("--webhook-secret", default="")
    parser.add_argument("--delivery-log", default="")
    parser.add_argument(
        "--idempotency",
        action="store_true",
        help="start with Stripe's idempotency-key semantics on",
    )
    args = parser.parse_args()

    resources.Store.dump_to_disk = lambda self: None  # in-memory only
    resources.store.clear()
    add_disputes(server.app)
    add_shared_payment_tokens(server.app)
    add_refund_limits()
    add_newest_first_lists()
    add_idempotency(server.app, enabled=args.idempotency)
    add_clock(server.app)

    if args.webhook_url and args.webhook_secret:
        # localstripe forgets its webhook config on restart: register it at every start.
        from localstripe.webhooks import register_webhook

        register_webhook("verity", args.webhook_url, args.webhook_secret, None)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    logging.basicConfig(level=logging.WARNING)
    if args.delivery_log:
        # localstripe reports deliveries at INFO on this logger (localstripe/webhooks.py).
        handler = logging.FileHandler(args.delivery_log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        deliveries = logging.getLogger("aiohttp.access")
        deliveries.setLevel(logging.INFO)
        deliveries.propagate = False
        deliveries.addHandler(handler)
    web.run_app(server.app, sock=sock, access_log=None, print=None)


if __name__ == "__main__":
    main()
