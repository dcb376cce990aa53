"""Start localstripe bound to 127.0.0.1 with its on-disk persistence turned off.

localstripe itself listens on every interface and pickles its store to
/tmp/localstripe.pickle on each write (then reloads it at start). Both are wrong for a
sandbox shared by tests: this launcher binds loopback only and keeps the store in memory.
Usage: python -m config.localstripe_server [--port 8420] [--webhook-url U --webhook-secret S]
       [--delivery-log FILE]
`--delivery-log` keeps localstripe's own account of each webhook delivery (one line each,
"successfully delivered" or "failed with response code N"): `make run` writes it under
var/ and the newcomer smoke test asserts every delivery was a 2xx.

localstripe has no disputes. This launcher adds the minimal Dispute resource Verity's
read-back needs, in Stripe's object shape (`GET /v1/disputes/{id}`, `GET /v1/disputes`),
plus two sandbox-only routes that play the card network's part (like a test card that
gets disputed): `POST /_config/disputes` {charge, reason?, amount?, fee?, due_by?}
opens a dispute and withdraws the amount plus the fee from the balance (an `adjustment`
balance transaction, reporting category `dispute`); `POST /_config/disputes/{id}`
{status, fee_returned?} moves it (`under_review`, `won` -> a `dispute_reversal`
adjustment reinstating the amount, `lost`, `warning_closed`, `charge_refunded`).
Events are not sent: tests sign `charge.dispute.*` events built from this object.
"""
import argparse
import json
import logging
import socket
import time

from aiohttp import web
from localstripe import resources, server
from localstripe.errors import UserError

DISPUTE_FEE = 1500  # minor units, Stripe's US dispute fee
DISPUTE_STATUSES = ("warning_needs_response", "warning_under_review", "warning_closed",
                    "needs_response", "under_review", "won", "lost", "charge_refunded")


def _adjustment(*, amount: int, fee: int, currency: str, source: str, category: str):
    """A balance transaction localstripe's constructor refuses (it knows only charges and
    refunds), built the way it builds its own."""
    txn = resources.BalanceTransaction.__new__(resources.BalanceTransaction)
    resources.StripeObject.__init__(txn)
    txn.amount, txn.currency, txn.fee = amount, currency, fee
    txn.available_on = txn.created
    txn.description = "Chargeback withdrawal" if amount < 0 else "Chargeback reversal"
    txn.exchange_rate = None
    txn.fee_details = ([{"amount": fee, "currency": currency, "type": "stripe_fee",
                         "description": "Dispute fee", "application": None}] if fee else [])
    txn.reporting_category = category
    txn.source = source
    txn.status = "available"
    txn.type = "adjustment"
    return txn


class Dispute(resources.StripeObject):
    """Stripe's Dispute object, the fields Verity reads (and the shape of the rest)."""

    object = "dispute"
    _id_prefix = "dp_"

    def __init__(self, charge=None, reason="fraudulent", amount=None, fee=DISPUTE_FEE,
                 due_by=None, **kwargs):
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
        self.status = "needs_response"
        self.is_charge_refundable = False
        self.metadata = {}
        self.evidence = {"customer_name": None, "customer_email_address": None,
                         "product_description": None, "uncategorized_text": None}
        self.evidence_details = {
            "due_by": resources.try_convert_to_int(due_by) if due_by
            else int(time.time()) + 7 * 86400,
            "has_evidence": False, "past_due": False, "submission_count": 0}
        self.balance_transactions = [_adjustment(
            amount=-amount, fee=fee, currency=self.currency, source=self.id,
            category="dispute")]
        charge_obj.disputed = True

    def _move(self, status, fee_returned=False):
        if status not in DISPUTE_STATUSES:
            raise UserError(400, "Bad request")
        if status == "won" and self.status != "won":
            fee = self.balance_transactions[0].fee if str(fee_returned).lower() == "true" else 0
            self.balance_transactions.append(_adjustment(
                amount=self.amount, fee=-fee, currency=self.currency, source=self.id,
                category="dispute_reversal"))
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8420)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--webhook-url", default="")
    parser.add_argument("--webhook-secret", default="")
    parser.add_argument("--delivery-log", default="")
    args = parser.parse_args()

    resources.Store.dump_to_disk = lambda self: None  # in-memory only
    resources.store.clear()
    add_disputes(server.app)

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
