"""The storefront contract, one row per status code and `code`
(docs/walkthrough.md#api-rules-the-code-relies-on).

Each row builds its situation through the API (or the core services where the API has no
way to produce it, e.g. a request that crashed half-way), sends one request, and the
table says what must come back: status, `code`, headers. Rows also count effects (rows in
the database, objects at localstripe) where an effect is at stake.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from payments.api.idempotency import request_fingerprint
from payments.models import IdempotencyRecord, PaymentOperation, Purchase, Quote
from payments.providers.stripe import DrillMode
from tests.api.client import Api, leave_crashed_payment_request, new_key, payment_body
from tests.factories import make_client

PROBLEM = "application/problem+json"


@dataclass
class Ctx:
    storefront: Api
    other: Api
    reader: Api
    resolver: Api
    product: object
    localstripe: object
    drill: Callable
    settings: object
    notes: dict = field(default_factory=dict)

    def paid_purchase(self, api: Api | None = None) -> tuple[dict, dict]:
        api = api or self.storefront
        purchase = api.new_purchase(self.product.sku)
        r = api.pay(purchase["id"])
        assert r.status_code == 201, r.content
        return purchase, r.json()

    def declined_purchase(self) -> tuple[dict, dict]:
        purchase = self.storefront.new_purchase(self.product.sku)
        r = self.storefront.pay(purchase["id"], "pm_card_chargeCustomerFail")
        assert r.status_code == 402, r.content
        return purchase, r.json()

    def unknown_payment(self, api: Api | None = None) -> tuple[dict, object]:
        """An API payment whose provider answer is lost after the charge was applied."""
        api = api or self.storefront
        purchase = api.new_purchase(self.product.sku)
        key, body = new_key(), payment_body()
        op = leave_crashed_payment_request(api, purchase["id"], key, body)
        self.drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
        r = api.post(f"purchases/{purchase['id']}/payments", body, key=key)
        assert r.status_code == 202, r.content
        return purchase, r


@pytest.fixture
def ctx(storefront, other_storefront, reader, ops_tool, product, localstripe, drill, settings):
    return Ctx(
        storefront, other_storefront, reader, ops_tool, product, localstripe, drill, settings
    )


@dataclass
class Row:
    name: str
    run: Callable[[Ctx], object]
    status: int
    code: str | None = None
    headers: dict = field(default_factory=dict)  # header -> exact value, or True = present
    # Rows that never reach the provider run inside a rolled-back transaction (fast);
    # the others need real commits (dispatch refuses to run inside a transaction).
    offline: bool = False


ROWS: list[Row] = []


def row(status: int, code: str | None = None, offline: bool = False, **headers):
    def register(fn):
        ROWS.append(
            Row(
                fn.__name__,
                fn,
                status,
                code,
                {k.replace("_", "-"): v for k, v in headers.items()},
                offline,
            )
        )
        return fn

    return register


# -- authentication and scopes -----------------------------------------------------------


@row(401, "unauthenticated", WWW_Authenticate=True, offline=True)
def no_authorization_header(c):
    return APIClient().get("/api/v1/products")


@row(401, "unauthenticated", offline=True)
def unknown_key(c):
    return Api("AbCdEfGh.not-a-real-key").get("products")


@row(401, "unauthenticated", offline=True)
def wrong_scheme(c):
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {c.storefront.key}")
    return http.get("/api/v1/products")


@row(401, "unauthenticated", offline=True)
def revoked_key(c):
    client, key = make_client(name="revoked")
    client.revoked = True
    client.save()
    return Api(key).get("products")


@row(403, "forbidden_scope", offline=True)
def read_only_key_cannot_write(c):
    return c.reader.quote(c.product.sku)


@row(403, "forbidden_scope")
def refund_needs_refunds_scope(c):
    client, key = make_client(scopes=("purchases:read", "purchases:write"), name="no-refunds")
    api = Api(key, client)
    purchase, _ = c.paid_purchase(api)
    return api.post(f"purchases/{purchase['id']}/refunds", {})


@row(403, "forbidden_scope")
def resolve_needs_resolve_scope(c):
    purchase, r = c.unknown_payment()
    return c.storefront.post(
        f"operations/{r.json()['id']}/resolve", {"outcome": "failed", "reason": "checked"}
    )


# -- ownership and lookups ------------------------------------------------------------------


@row(404, "not_found", offline=True)
def another_clients_purchase_is_not_found(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    return c.other.get(f"purchases/{purchase['id']}")


@row(404, "not_found", offline=True)
def another_clients_purchase_cannot_be_paid(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    r = c.other.pay(purchase["id"])
    assert PaymentOperation.objects.count() == 0
    return r


@row(404, "not_found")
def another_clients_operation_is_not_found(c):
    _, op = c.paid_purchase()
    return c.other.get(f"operations/{op['id']}")


@row(404, "not_found", offline=True)
def unknown_endpoint(c):
    return c.storefront.get("no/such/endpoint")


@row(404, "not_found", offline=True)
def unknown_operation(c):
    return c.storefront.get("operations/op_doesnotexist")


@row(404, "quote_not_found", offline=True)
def purchase_for_unknown_quote(c):
    return c.storefront.purchase({"id": "quo_nope", "version": 1})


# -- request shape ---------------------------------------------------------------------------


@row(400, "idempotency_key_required", offline=True)
def quote_without_idempotency_key(c):
    return c.storefront.quote(c.product.sku, key=None)


@row(400, "idempotency_key_required", offline=True)
def payment_without_idempotency_key(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    r = c.storefront.pay(purchase["id"], key=None)
    assert PaymentOperation.objects.count() == 0
    return r


@row(400, "idempotency_key_required", offline=True)
def blank_idempotency_key(c):
    return c.storefront.quote(c.product.sku, key="   ")


@row(400, "invalid_request", offline=True)
def overlong_idempotency_key(c):
    return c.storefront.quote(c.product.sku, key="k" * 256)


@row(400, "invalid_request", offline=True)
def invalid_body(c):
    r = c.storefront.post(
        "quotes", {"items": [{"sku": c.product.sku, "quantity": 0}], "currency": "usd"}
    )
    assert "items[0].quantity" in r.json()["errors"]
    return r


@row(400, "invalid_request", offline=True)
def malformed_json(c):
    return c.storefront.http.post(
        "/api/v1/quotes",
        data=b"{not json",
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=new_key(),
    )


@row(400, "invalid_request", offline=True)
def card_number_instead_of_token(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    r = c.storefront.pay(purchase["id"], "4242424242424242")
    assert "4242424242424242" not in r.content.decode()
    return r


@row(415, "unsupported_media_type", offline=True)
def form_encoded_body(c):
    return c.storefront.http.post(
        "/api/v1/quotes", data={"currency": "usd"}, HTTP_IDEMPOTENCY_KEY=new_key()
    )


@row(405, "method_not_allowed", offline=True)
def wrong_method(c):
    return c.storefront.http.delete("/api/v1/products")


@row(422, "unknown_sku", offline=True)
def quote_for_unknown_sku(c):
    return c.storefront.quote("NO-SUCH-SKU")


# -- quotes and purchases ----------------------------------------------------------------------


@row(201, offline=True)
def quote_created(c):
    r = c.storefront.quote(c.product.sku, 2)
    assert r.json()["amount"] == 2 * c.product.price
    assert Quote.objects.count() == 1
    return r


@row(201, offline=True)
def purchase_created(c):
    q = c.storefront.quote(c.product.sku).json()
    r = c.storefront.purchase(q)
    body = r.json()
    assert (body["status"], body["payment"]) == ("awaiting_payment", None)
    assert body["next_action"]["retry"] == "new_operation"
    assert body["status_url"].endswith(f"/status/{Purchase.objects.get().status_token}/")
    return r


@row(409, "quote_expired", offline=True)
def expired_quote(c):
    q = c.storefront.quote(c.product.sku).json()
    Quote.objects.filter(id=q["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    r = c.storefront.purchase(q)
    assert r.json()["next_action"]["retry"] == "new_quote"
    assert Purchase.objects.count() == 0
    return r


@row(409, "quote_superseded", offline=True)
def superseded_quote(c):
    q = c.storefront.quote(c.product.sku).json()
    Quote.objects.filter(id=q["id"]).update(superseded_at=timezone.now())
    r = c.storefront.purchase(q)
    assert r.json()["next_action"]["retry"] == "new_quote"
    return r


@row(409, "customer_has_unresolved_purchase")
def second_purchase_while_first_is_unresolved(c):
    first, _ = c.unknown_payment()
    q = c.storefront.quote(c.product.sku).json()
    # The reference is normalised: trailing space and case do not make another buyer.
    r = c.storefront.purchase(q, f" {first['customer']['reference'].upper()} ")
    assert Purchase.objects.count() == 1
    assert r.json()["purchase"] == first["id"]
    assert "acknowledge_unresolved" not in r.json()["detail"]
    # ... but per API client (docs/reliability.md#rules-every-money-movement-obeys): another
    # storefront's customer of the same reference is another buyer, and its answer never
    # names this client's purchase.
    q2 = c.other.quote(c.product.sku).json()
    r2 = c.other.purchase(q2, first["customer"]["reference"])
    assert r2.status_code == 201 and first["id"] not in r2.content.decode()
    return r


@row(409, "customer_has_unresolved_purchase")
def second_purchase_naming_the_unresolved_one_without_storefront_confirmation(c):
    first, _ = c.unknown_payment()
    q = c.storefront.quote(c.product.sku).json()
    r = c.storefront.purchase(
        q, first["customer"]["reference"], extra={"acknowledge_unresolved": [first["id"]]}
    )
    assert Purchase.objects.count() == 1
    return r


@row(201)
def second_purchase_naming_the_unresolved_one(c):
    first, _ = c.unknown_payment()
    c.storefront.client.storefront_confirmation = True  # its own checkout asked the buyer
    c.storefront.client.save(update_fields=["storefront_confirmation"])
    q = c.storefront.quote(c.product.sku).json()
    return c.storefront.purchase(
        q, first["customer"]["reference"], extra={"acknowledge_unresolved": [first["id"]]}
    )


@row(200, Location=True)
def second_purchase_on_the_same_quote_is_that_purchase(c):
    q = c.storefront.quote(c.product.sku).json()
    first = c.storefront.purchase(q, "cust-one-quote").json()
    r = c.storefront.purchase(q, "someone-else")
    assert r.json()["id"] == first["id"] and Purchase.objects.count() == 1
    return r


@row(409, "probable_duplicate_purchase")
def same_basket_again_after_payment(c):
    first, _ = c.paid_purchase()
    q = c.storefront.quote(c.product.sku).json()
    r = c.storefront.purchase(q, first["customer"]["reference"])
    assert r.json()["purchase"] == first["id"]
    assert r.json()["earlier_purchase"]["status"] in ("paid", "fulfilling", "completed")
    assert Purchase.objects.count() == 1
    assert len(c.localstripe.succeeded_charges_for(first["id"])) == 1
    return r


@row(201)
def same_basket_again_with_the_buyers_confirmation(c):
    from payments.services import buyer_confirmation_issue

    first, _ = c.paid_purchase()
    code = buyer_confirmation_issue(purchase_id=first["id"])
    q = c.storefront.quote(c.product.sku).json()
    return c.storefront.purchase(
        q, first["customer"]["reference"], extra={"buyer_confirmation": code}
    )


@row(422, "invalid_buyer_confirmation", offline=True)
def an_invented_buyer_confirmation(c):
    q = c.storefront.quote(c.product.sku).json()
    r = c.storefront.purchase(q, extra={"buyer_confirmation": "ABCDE-FGHJK"})
    assert Purchase.objects.count() == 0
    return r


@row(422, "invalid_email", offline=True)
def an_overlong_local_part_email(c):
    q = c.storefront.quote(c.product.sku).json()
    body = {
        "quote_id": q["id"],
        "quote_version": q["version"],
        "customer": {"reference": "cust-mail", "email": "x" * 70 + "@example.com"},
    }
    r = c.storefront.post("purchases", body)
    assert Purchase.objects.count() == 0
    return r


# -- payments ----------------------------------------------------------------------------------


@row(201, Location=True)
def payment_succeeded(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    r = c.storefront.pay(purchase["id"])
    body = r.json()
    assert (body["outcome"], body["grade"], body["purchase_status"]) == (
        "succeeded",
        "confirmed",
        "paid",
    )
    assert len(c.localstripe.succeeded_charges_for(purchase["id"])) == 1
    return r


@row(201)
def authorization_then_capture(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    auth = c.storefront.pay(purchase["id"], capture="manual")
    assert auth.status_code == 201 and auth.json()["kind"] == "authorize"
    r = c.storefront.post(f"purchases/{purchase['id']}/capture", {})
    assert r.json()["kind"] == "capture" and r.json()["parent"] == auth.json()["id"]
    [pi] = c.localstripe.payment_intents_for(purchase["id"])
    assert pi["status"] == "succeeded"
    return r


@row(201)
def authorization_then_void(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    assert c.storefront.pay(purchase["id"], capture="manual").status_code == 201
    r = c.storefront.post(f"purchases/{purchase['id']}/void", {})
    [pi] = c.localstripe.payment_intents_for(purchase["id"])
    assert pi["status"] == "canceled"
    return r


@row(409, "not_capturable")
def capture_without_authorization(c):
    purchase, _ = c.paid_purchase()
    return c.storefront.post(f"purchases/{purchase['id']}/capture", {})


@row(402, "card_declined", Location=True)
def payment_declined(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    r = c.storefront.pay(purchase["id"], "pm_card_chargeCustomerFail")
    body = r.json()
    assert body["operation"] and body["purchase"] == purchase["id"]
    assert (body["next_action"]["owner"], body["next_action"]["retry"]) == (
        "buyer",
        "new_operation",
    )
    assert c.localstripe.succeeded_charges_for(purchase["id"]) == []
    return r


@row(202)
def payment_outcome_unknown(c):
    purchase, r = c.unknown_payment()
    body = r.json()
    action = body["next_action"]
    assert body["outcome"] == "unknown" and body["purchase_status"] == "payment_unknown"
    assert (action["owner"], action["retry"]) == ("reconciliation", "forbidden")
    assert "Do not retry" in action["message"] and f"/operations/{body['id']}" in action["message"]
    # The provider did apply it: that is exactly why the answer forbids a retry.
    assert len(c.localstripe.succeeded_charges_for(purchase["id"])) == 1
    view = c.storefront.get(f"purchases/{purchase['id']}").json()
    assert view["status"] == "payment_unknown" and view["next_action"]["retry"] == "forbidden"
    return r


@row(409, "already_paid")
def pay_again_with_a_new_key(c):
    purchase, op = c.paid_purchase()
    r = c.storefront.pay(purchase["id"], key=new_key())
    assert r.json()["operation"] == op["id"]
    assert len(c.localstripe.payment_intents_for(purchase["id"])) == 1
    return r


@row(409, "payment_unresolved")
def pay_again_while_unknown(c):
    purchase, first = c.unknown_payment()
    r = c.storefront.pay(purchase["id"], key=new_key())
    assert r.json()["operation"] == first.json()["id"]
    assert r.json()["next_action"]["retry"] == "forbidden"
    assert len(c.localstripe.payment_intents_for(purchase["id"])) == 1
    return r


@row(422, "amount_mismatch", offline=True)
def amount_differs_from_quote(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    r = c.storefront.pay(purchase["id"], extra={"amount": c.product.price + 1})
    assert PaymentOperation.objects.count() == 0
    return r


@row(201)
def amount_equal_to_quote_is_accepted(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    return c.storefront.pay(purchase["id"], extra={"amount": c.product.price})


@row(409, "spending_limit_exceeded", offline=True)
def payment_beyond_the_clients_spending_limit(c):
    client, key = make_client(name="small-limit", limit=c.product.price - 1)
    api = Api(key, client)
    purchase = api.new_purchase(c.product.sku)
    r = api.pay(purchase["id"])
    assert PaymentOperation.objects.count() == 0
    return r


@row(409, "retry_of_required")
def new_payment_after_decline_without_retry_of(c):
    purchase, _ = c.declined_purchase()
    return c.storefront.pay(purchase["id"], "pm_card_visa")


@row(422, "retry_needs_new_method")
def retry_after_decline_with_same_method(c):
    purchase, declined = c.declined_purchase()
    return c.storefront.pay(
        purchase["id"], "pm_card_chargeCustomerFail", extra={"retry_of": declined["operation"]}
    )


@row(201)
def retry_after_decline_with_new_method(c):
    purchase, declined = c.declined_purchase()
    r = c.storefront.pay(purchase["id"], "pm_card_visa", extra={"retry_of": declined["operation"]})
    assert r.json()["retry_of"] == declined["operation"]
    old = c.storefront.get(f"operations/{declined['operation']}").json()
    assert old["retried_by"] == r.json()["id"] and old["next_action"]["retry"] == "forbidden"
    assert len(c.localstripe.succeeded_charges_for(purchase["id"])) == 1
    return r


@row(422, "retry_of_not_found", offline=True)
def retry_of_names_no_operation_of_this_purchase(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    return c.storefront.pay(purchase["id"], extra={"retry_of": "op_elsewhere"})


@row(503, "workflow_halted", Retry_After=True)
def checkout_halted(c):
    from recovery.models import WorkflowHalt

    WorkflowHalt.objects.create(name="checkout", reason="drill", halted_by="test")
    purchase = c.storefront.new_purchase(c.product.sku)
    key = new_key()
    r = c.storefront.pay(purchase["id"], key=key)
    assert r.json()["next_action"]["retry"] == "same_key"
    # The refusal did not bind the key: once resumed, the same key pays.
    WorkflowHalt.objects.all().delete()
    assert c.storefront.pay(purchase["id"], key=key).status_code == 201
    return r


# -- idempotency -------------------------------------------------------------------------------


@row(200, **{"Idempotent_Replayed": "true"})
def same_key_same_body_is_replayed_with_current_state(c):
    from prometheus_client import REGISTRY

    def replays():
        return (
            REGISTRY.get_sample_value(
                "verity_idempotent_replays_total", {"route": "purchases_payments_create"}
            )
            or 0
        )

    purchase = c.storefront.new_purchase(c.product.sku)
    key = new_key()
    assert c.storefront.pay(purchase["id"], key=key).status_code == 201
    before = replays()
    # Key order and whitespace do not matter.
    r = c.storefront.http.post(
        f"/api/v1/purchases/{purchase['id']}/payments",
        data=b'{ "capture" : "automatic",\n "payment_method":"pm_card_visa" }',
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key,
    )
    assert r.json()["outcome"] == "succeeded"
    assert PaymentOperation.objects.count() == 1
    assert replays() == before + 1
    return r


@row(200, **{"Idempotent_Replayed": "true"})
def replay_of_a_decline_shows_current_state(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    key = new_key()
    assert (
        c.storefront.pay(purchase["id"], "pm_card_chargeCustomerFail", key=key).status_code == 402
    )
    r = c.storefront.pay(purchase["id"], "pm_card_chargeCustomerFail", key=key)
    assert (r.json()["outcome"], r.json()["reason"]) == ("failed", "card_declined")
    return r


@row(200, **{"Idempotent_Replayed": "true"}, offline=True)
def replay_of_purchase_creation(c):
    q = c.storefront.quote(c.product.sku).json()
    key = new_key()
    body = {
        "quote_id": q["id"],
        "quote_version": q["version"],
        "customer": {"reference": "cust-replay", "email": "a@example.com"},
    }
    assert c.storefront.post("purchases", body, key=key).status_code == 201
    r = c.storefront.post("purchases", body, key=key)
    assert Purchase.objects.count() == 1
    return r


@row(422, "idempotency_key_reused")
def same_key_different_amount(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    key = new_key()
    assert c.storefront.pay(purchase["id"], key=key).status_code == 201
    return c.storefront.pay(purchase["id"], key=key, extra={"amount": 1})


@row(422, "idempotency_key_reused")
def same_key_with_another_capture_mode(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    key = new_key()
    assert c.storefront.pay(purchase["id"], key=key).status_code == 201
    return c.storefront.pay(purchase["id"], key=key, capture="manual")


@row(400, "unknown_field")
def same_key_with_an_added_note_field(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    key = new_key()
    assert c.storefront.pay(purchase["id"], key=key).status_code == 201
    return c.storefront.pay(purchase["id"], key=key, extra={"note": "retrying"})


@row(422, "currency_mismatch")
def payment_in_another_currency(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    return c.storefront.pay(purchase["id"], extra={"currency": "eur"})


@row(422, "idempotency_key_reused")
def same_key_for_another_purchase(c):
    first = c.storefront.new_purchase(c.product.sku)
    second = c.storefront.new_purchase(c.product.sku)
    key = new_key()
    assert c.storefront.pay(first["id"], key=key).status_code == 201
    r = c.storefront.pay(second["id"], key=key)
    assert c.localstripe.payment_intents_for(second["id"]) == []
    return r


@row(201)
def same_key_under_another_route_or_client_is_independent(c):
    key = new_key()
    assert c.storefront.quote(c.product.sku, key=key).status_code == 201
    assert c.other.quote(c.product.sku, key=key).status_code == 201
    purchase = c.storefront.new_purchase(c.product.sku)
    return c.storefront.pay(purchase["id"], key=key)


@row(409, "request_in_progress", Retry_After=True, offline=True)
def same_key_while_the_first_request_runs(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    key, body = new_key(), payment_body()
    IdempotencyRecord.objects.create(
        api_client=c.storefront.client,
        route="purchases_payments_create",
        key=key,
        fingerprint=request_fingerprint(
            path=f"/api/v1/purchases/{purchase['id']}/payments", body=body
        ),
        lease_until=timezone.now() + timedelta(seconds=30),
    )
    r = c.storefront.post(f"purchases/{purchase['id']}/payments", body, key=key)
    assert 1 <= int(r["Retry-After"]) <= 30
    assert r.json()["next_action"]["retry"] == "same_key"
    assert PaymentOperation.objects.count() == 0
    return r


@row(201)
def expired_lease_is_taken_over_and_the_operation_resumed(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    key, body = new_key(), payment_body()
    op = leave_crashed_payment_request(c.storefront, purchase["id"], key, body)
    r = c.storefront.post(f"purchases/{purchase['id']}/payments", body, key=key)
    assert r.json()["id"] == op.id  # resumed, not created again
    assert PaymentOperation.objects.count() == 1
    assert len(c.localstripe.payment_intents_for(purchase["id"])) == 1
    assert IdempotencyRecord.objects.get(key=key).state == "done"
    return r


@row(201)
def a_refusal_does_not_bind_the_key(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    key = new_key()
    refused = c.storefront.pay(purchase["id"], key=key, extra={"amount": 1})
    assert refused.status_code == 422 and refused.json()["code"] == "amount_mismatch"
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    return c.storefront.pay(purchase["id"], key=key)


# -- operations -------------------------------------------------------------------------------


@row(200)
def operation_view(c):
    purchase, op = c.paid_purchase()
    r = c.storefront.get(f"operations/{op['id']}")
    body = r.json()
    assert body["hold"] == {"amount": c.product.price, "currency": "usd", "state": "consumed"}
    assert body["verification"] == "provider" and body["stage"] == "settled"
    return r


@row(200)
def reconcile_settles_an_unknown_payment(c):
    purchase, r = c.unknown_payment()
    out = c.storefront.post(f"operations/{r.json()['id']}/reconcile", key=None)
    assert (out.json()["outcome"], out.json()["verification"]) == ("succeeded", "provider")
    assert c.storefront.get(f"purchases/{purchase['id']}").json()["status"] == "paid"
    assert len(c.localstripe.succeeded_charges_for(purchase["id"])) == 1
    return out


@row(200)
def reconcile_works_while_checkout_is_halted(c):
    from recovery.models import WorkflowHalt

    purchase, r = c.unknown_payment()
    WorkflowHalt.objects.create(name="checkout", reason="incident", halted_by="test")
    return c.storefront.post(f"operations/{r.json()['id']}/reconcile", key=None)


@row(409, "already_settled")
def reconcile_a_settled_operation(c):
    _, op = c.paid_purchase()
    return c.storefront.post(f"operations/{op['id']}/reconcile", key=None)


@row(409, "replay_unsupported")
def replay_where_the_provider_does_not_dedupe_keys(c):
    _, r = c.unknown_payment()
    return c.resolver.post(f"operations/{r.json()['id']}/replay", {})


@row(403, "replayer_is_requester")
def replay_by_the_requester(c):
    _, r = c.unknown_payment(c.resolver)
    return c.resolver.post(f"operations/{r.json()['id']}/replay", {})


@row(403, "resolver_is_requester")
def resolve_by_the_requester(c):
    _, r = c.unknown_payment(c.resolver)
    return c.resolver.post(
        f"operations/{r.json()['id']}/resolve", {"outcome": "succeeded", "reason": "I say so"}
    )


@row(400, "invalid_request")
def resolve_without_a_reason(c):
    _, r = c.unknown_payment()
    return c.resolver.post(
        f"operations/{r.json()['id']}/resolve", {"outcome": "failed", "reason": "  "}
    )


@row(200)
def resolve_by_another_credential(c):
    purchase, r = c.unknown_payment()
    out = c.resolver.post(
        f"operations/{r.json()['id']}/resolve",
        {"outcome": "succeeded", "reason": "Seen in the provider dashboard"},
    )
    body = out.json()
    # The provider is read back first; it agrees (it charged), so its record settles the
    # operation, graded confirmed.
    assert (body["outcome"], body["grade"], body["verification"]) == (
        "succeeded",
        "confirmed",
        "provider",
    )
    return out


@row(409, "not_resolvable")
def resolve_a_settled_operation(c):
    _, op = c.paid_purchase()
    return c.resolver.post(
        f"operations/{op['id']}/resolve", {"outcome": "failed", "reason": "mistake"}
    )


# -- refunds ----------------------------------------------------------------------------------


@row(201)
def refund_within_the_automatic_allowance(c):
    purchase, op = c.paid_purchase()
    r = c.storefront.post(f"purchases/{purchase['id']}/refunds", {"amount": 500})
    assert r.json()["kind"] == "refund" and r.json()["outcome"] == "succeeded"
    assert (
        len(
            c.localstripe.refunds_for(
                op and PaymentOperation.objects.get(id=op["id"]).provider_reference
            )
        )
        == 1
    )
    return r


@row(202)
def refund_above_the_allowance_awaits_approval(c):
    client, key = make_client(name="no-auto-refunds")
    api = Api(key, client)
    purchase, op = c.paid_purchase(api)
    r = api.post(f"purchases/{purchase['id']}/refunds", {})
    assert r.json()["outcome"] == "awaiting_approval"
    assert r.json()["next_action"]["owner"] == "support"
    assert (
        c.localstripe.refunds_for(PaymentOperation.objects.get(id=op["id"]).provider_reference)
        == []
    )
    return r


@row(422, "refund_exceeds_refundable")
def refund_more_than_captured(c):
    purchase, _ = c.paid_purchase()
    return c.storefront.post(f"purchases/{purchase['id']}/refunds", {"amount": c.product.price + 1})


@row(409, "not_refundable", offline=True)
def refund_before_payment(c):
    purchase = c.storefront.new_purchase(c.product.sku)
    return c.storefront.post(f"purchases/{purchase['id']}/refunds", {})


@row(404, "deliverable_not_available")
def deliverable_of_a_physical_purchase(c):
    purchase, _ = c.paid_purchase()
    return c.storefront.get(f"purchases/{purchase['id']}/deliverable")


@row(200)
def deliverable_stored_by_the_step(c):
    from recovery.models import StepName, StepRun, StepState

    purchase, _ = c.paid_purchase()
    # What the deliverable step leaves once its job finished (recovery writes it).
    StepRun.objects.update_or_create(
        purchase_id=purchase["id"],
        step=StepName.DELIVERABLE,
        defaults={
            "state": StepState.DONE,
            "key": f"{purchase['id']}:deliverable",
            "external_reference": "job_123",
            "result": {"url": "https://dl/x"},
            "result_expires_at": timezone.now() + timedelta(days=30),
        },
    )
    r = c.storefront.get(f"purchases/{purchase['id']}/deliverable")
    assert r.json()["job_reference"] == "job_123"
    assert c.other.get(f"purchases/{purchase['id']}/deliverable").status_code == 404
    return r


# -- reads, limits, throttling ---------------------------------------------------------------


@row(200, offline=True)
def products_list(c):
    r = c.reader.get("products")
    assert [p["sku"] for p in r.json()["products"]] == [c.product.sku]
    return r


@row(200)
def limits_show_unknown_exposure(c):
    c.unknown_payment()
    r = c.storefront.get("clients/me/limits")
    body = r.json()
    assert body["unknown_exposure"] == body["reserved"] == c.product.price
    assert body["limit"] == 10_000_000
    return r


@row(429, "rate_limited", Retry_After=True, offline=True)
def too_many_requests(c):
    client, key = make_client(name="hasty")
    api = Api(key, client)
    c.settings.API_THROTTLE_RATE = "3/min"
    for _ in range(3):
        assert api.get("products").status_code == 200
    return api.get("products")


# -- the table ------------------------------------------------------------------------------


ONLINE = [r for r in ROWS if not r.offline]
OFFLINE = [r for r in ROWS if r.offline]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("r", ONLINE, ids=[r.name for r in ONLINE])
def test_contract(r: Row, ctx):
    _check(r, ctx)


@pytest.mark.django_db
@pytest.mark.parametrize("r", OFFLINE, ids=[r.name for r in OFFLINE])
def test_contract_without_provider(r: Row, ctx):
    _check(r, ctx)


def _check(r: Row, ctx) -> None:
    response = r.run(ctx)
    content = response.content.decode()
    assert response.status_code == r.status, content
    if r.code is not None:
        assert response["Content-Type"] == PROBLEM
        body = response.json()
        assert body["code"] == r.code and body["status"] == r.status
        assert body["type"].endswith(r.code) and body["title"] and body["detail"]
        assert set(body["next_action"]) == {"owner", "retry", "code", "message"}
    elif response.status_code < 300:
        assert response["Content-Type"] == "application/json"
    for header, expected in r.headers.items():
        assert response.has_header(header), f"{header} missing"
        if expected is not True:
            assert response[header] == expected
    if r.status != 200 or "Idempotent-Replayed" not in r.headers:
        assert not response.has_header("Idempotent-Replayed")
    # Nothing internal leaks: no traces, no provider payloads, no secrets.
    for leak in (
        "Traceback",
        "sk_test",
        "whsec_",
        "stripe.",
        "pi_secret",
        "client_secret",
        ctx.storefront.key,
    ):
        assert leak not in content
