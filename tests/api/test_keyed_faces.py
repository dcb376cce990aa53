"""REST, MCP and ACP share one keyed-request ladder (payments.keyed) and mean the same.

1. Static: no face claims, binds, completes or releases a key, reads the key table or
   dispatches an operation itself; each reaches the ladder through payments.keyed /
   payments.services.requests.
2. One table, three faces: the same sequence sent through the REST payment endpoint, the
   MCP `pay_purchase` / `retry_failed_payment` tools and the ACP `complete` — a replay,
   another body under the same key, a request that died holding its key and its retry, and
   a retry after a person's unconfirmed "failed" on a payment the provider did take. Each
   row: the same effects at localstripe (one charge, one payment operation) and the answer
   each face gives, side by side, meaning the same thing.
"""

from __future__ import annotations

import ast
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from agents import tools
from payments import services
from payments.enums import Grade, Outcome, Rail
from payments.keyed import REPLAYED_HEADER, request_fingerprint
from payments.models import IdempotencyRecord, PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail
from tests.acp.agent import AcpAgent, complete_body, new_email
from tests.acp.tokens import issue_spt
from tests.api.client import leave_crashed_payment_request
from tests.factories import ProductFactory, make_client

ROOT = Path(__file__).resolve().parents[2]
FACES = ("payments/api/views.py", "agents/tools.py", "acp/views.py", "acp/services.py")
# The ladder's own steps: only payments.keyed (and payments.api.idempotency, its old names
# for callers outside the faces) may use them.
LADDER_STEPS = {
    "idempotency_claim",
    "idempotency_bind",
    "idempotency_complete",
    "idempotency_release",
    "key_claim",
    "key_bind",
    "key_complete",
    "key_release",
    "key_forget",
    "IdempotencyRecord",
    "operation_dispatch",
}
LADDER_ENTRIES = {
    "keyed_effect",
    "payment_request",
    "follow_up_request",
    "checkout_complete",
    # acp.services: the session writes, each through keyed_effect
    "session_create",
    "session_update",
    "session_complete",
    "session_cancel",
}


def _names(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.add((node.asname or node.name).rsplit(".", 1)[-1])
    return found


@pytest.mark.parametrize("face", FACES)
def test_a_face_runs_no_ladder_step_of_its_own(face):
    names = _names(face)
    assert not names & LADDER_STEPS, f"{face} uses {sorted(names & LADDER_STEPS)}"
    assert names & LADDER_ENTRIES, f"{face} does not go through payments.keyed"


# -- the same sequence through three faces ---------------------------------------------------

PRICE = 2500


@dataclass
class Paid:
    purchase_id: str
    handle: str  # what the face pays: a purchase (REST, MCP) or a checkout session (ACP)


class RestFace:
    name = "rest"

    def __init__(self, ctx) -> None:
        self.api, self.product = ctx.storefront, ctx.product

    def open(self) -> Paid:
        purchase = self.api.new_purchase(self.product.sku)
        return Paid(purchase["id"], purchase["id"])

    def pay(self, paid: Paid, key: str, method: str = "pm_card_visa", retry_of=None) -> str:
        extra = {"retry_of": retry_of} if retry_of else {}
        r = self.api.pay(paid.handle, method, key=key, extra=extra)
        if r.status_code == 201:
            return "paid"
        if r.status_code == 200 and r.headers.get(REPLAYED_HEADER) == "true":
            return "paid, replayed" if r.json()["outcome"] == "succeeded" else "replayed"
        return f"refused {r.json()['code']}"

    def retry(self, paid: Paid, failed: PaymentOperation) -> str:
        return self.pay(paid, f"retry-{uuid.uuid4()}", retry_of=failed.id)

    def die_holding(self, paid: Paid, key: str) -> None:
        leave_crashed_payment_request(
            self.api,
            paid.purchase_id,
            key,
            {"payment_method": "pm_card_visa", "capture": "automatic"},
        )

    def unknown_payment(self, paid: Paid, drill) -> PaymentOperation:
        op = services.payment_create(
            purchase_id=paid.purchase_id, api_client=self.api.client, payment_method="pm_card_visa"
        )
        drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
        return services.operation_dispatch(operation_id=op.id)


class McpFace(RestFace):
    """The tools derive their own keys: the client's key plays no part (a second call is the
    same logical operation)."""

    name = "mcp"

    def _said(self, result) -> str:
        if result.refusal is not None:
            return f"refused {result.refusal.code.value}"
        paid = result.operation["outcome"] == "succeeded"
        return ("paid" if paid else "unpaid") + (", replayed" if result.replayed else "")

    def pay(self, paid: Paid, key: str, method: str = "pm_card_visa", retry_of=None) -> str:
        return self._said(
            tools.pay_purchase(
                api_client=self.api.client, purchase_id=paid.handle, payment_method=method
            )
        )

    def retry(self, paid: Paid, failed: PaymentOperation) -> str:
        return self._said(
            tools.retry_failed_payment(api_client=self.api.client, operation_id=failed.id)
        )

    def die_holding(self, paid: Paid, key: str) -> None:
        # The first pay_purchase died after recording its payment, before sending it.
        services.payment_create(
            purchase_id=paid.purchase_id, api_client=self.api.client, payment_method="pm_card_visa"
        )


class AcpFace:
    name = "acp"

    def __init__(self, ctx) -> None:
        self.client, key = make_client(scopes=("acp",), limit=10_000_000, name="platform-x")
        self.agent = AcpAgent(ctx.live_server.url, key)
        self.product, self.email = ctx.product, new_email()
        self.tokens: dict[str, str] = {}

    def _token(self, name: str) -> str:
        if name not in self.tokens:
            self.tokens[name] = issue_spt(PRICE)
        return self.tokens[name]

    def open(self) -> Paid:
        r = self.agent.create(self.product.sku)
        assert r.status_code == 201, r.text
        return Paid("", r.json()["id"])

    def _purchase(self, paid: Paid) -> str:
        paid.purchase_id = paid.purchase_id or (
            Purchase.objects.filter(acp_session__id=paid.handle)
            .values_list("id", flat=True)
            .first()
            or ""
        )
        return paid.purchase_id

    def _said(self, r) -> str:
        self.last = r
        if r.status_code == 200:
            return "paid" + (", replayed" if r.headers.get(REPLAYED_HEADER) == "true" else "")
        return f"refused {r.json()['code']}" if r.status_code >= 400 else f"status {r.status_code}"

    def pay(self, paid: Paid, key: str, method: str = "pm_card_visa", retry_of=None) -> str:
        r = self.agent.post(
            f"checkout_sessions/{paid.handle}/complete",
            complete_body(self._token(method), self.email),
            key=key,
        )
        said = self._said(r)
        self._purchase(paid)
        return said

    def retry(self, paid: Paid, failed: PaymentOperation) -> str:
        return self.pay(paid, f"retry-{uuid.uuid4()}", method="another token")

    def die_holding(self, paid: Paid, key: str) -> None:
        """What a web process that died right after the complete's transaction leaves: the
        session's purchase and payment (pending, never sent) and the key bound to the
        session, lease over."""
        from acp.models import CheckoutSession
        from payments.services.requests import checkout_complete

        session = CheckoutSession.objects.get(pk=paid.handle)
        with transaction.atomic():
            op, _send = checkout_complete(
                api_client=self.client,
                purchase_id=None,
                quote_id=session.quote_id,
                quote_version=session.quote.version,
                email=self.email,
                token=self._token("pm_card_visa"),
                retry_of=None,
                on_purchase=lambda pid: setattr(session, "purchase_id", pid),
            )
            session.save()
        body = complete_body(self._token("pm_card_visa"), self.email)
        IdempotencyRecord.objects.create(
            api_client=self.client,
            route="acp_checkout_sessions_complete",
            key=key,
            fingerprint=request_fingerprint(
                path=f"/acp/checkout_sessions/{paid.handle}/complete", body=body
            ),
            state=IdempotencyRecord.State.IN_FLIGHT,
            lease_until=timezone.now() - timedelta(seconds=1),
            resource_type="acp_session",
            resource_id=paid.handle,
        )
        paid.purchase_id = op.purchase_id

    def unknown_payment(self, paid: Paid, drill) -> PaymentOperation:
        provider_for_rail(Rail.STRIPE).arm_drill(
            key_prefix="*", step="confirm", mode=DrillMode.DROP_RESPONSE_AFTER_SEND
        )
        assert self.pay(paid, f"first-{uuid.uuid4()}") == "status 202"
        return PaymentOperation.objects.get(purchase_id=paid.purchase_id)


def _replay(face, paid) -> list[str]:
    key = f"k-{uuid.uuid4()}"
    return [face.pay(paid, key), face.pay(paid, key)]


def _other_body(face, paid) -> list[str]:
    key = f"k-{uuid.uuid4()}"
    return [face.pay(paid, key), face.pay(paid, key, method="pm_card_mastercard")]


def _died_holding_the_key(face, paid) -> list[str]:
    key = f"k-{uuid.uuid4()}"
    face.die_holding(paid, key)
    return [face.pay(paid, key)]


def _retry_after_a_persons_unconfirmed_failed(face, paid, drill=None, read_drill=None):
    op = face.unknown_payment(paid, drill)
    assert op.outcome == Outcome.UNKNOWN
    read_drill(op.provider_reference)  # the person's read-back cannot reach the provider
    person = get_user_model().objects.create(username=f"person-{uuid.uuid4().hex[:6]}")
    op = services.operation_resolve_manual(
        operation_id=op.id,
        outcome="failed",
        reason="the buyer says declined",
        actor=person.username,
        acting_user=person,
    )
    assert (op.outcome, op.grade) == (Outcome.FAILED, Grade.ACKNOWLEDGED)
    return [face.retry(paid, op)]


# scenario -> what each face answers, call by call. The same meaning on every row: the
# money moved once; a repeat is answered, never applied again.
TABLE = {
    "replay": (
        _replay,
        {
            "rest": ["paid", "paid, replayed"],
            "mcp": ["paid", "paid, replayed"],  # a second call is the same payment
            "acp": ["paid", "paid, replayed"],
        },
    ),
    "another body under the same key": (
        _other_body,
        {
            "rest": ["paid", "refused idempotency_key_reused"],
            "mcp": ["paid", "paid, replayed"],  # no key to reuse: the same payment
            "acp": ["paid", "refused idempotency_conflict"],
        },
    ),
    "a request that died holding the key, and its retry": (
        _died_holding_the_key,
        {
            "rest": ["paid"],  # the dead request's payment, sent now
            "mcp": ["paid, replayed"],
            "acp": ["paid"],
        },
    ),
    "a retry after a person's unconfirmed failed": (
        _retry_after_a_persons_unconfirmed_failed,
        {
            # Read back first: the provider took the money, so nothing is paid again.
            "rest": ["refused original_succeeded"],
            "mcp": ["refused original_succeeded"],
            "acp": ["paid"],
        },
    ),
}


@pytest.fixture
def ctx(storefront, live_server):
    product = ProductFactory(price=PRICE, stock=1000)

    class Ctx:
        pass

    c = Ctx()
    c.storefront, c.live_server, c.product = storefront, live_server, product
    return c


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("face_class", [RestFace, McpFace, AcpFace], ids=["rest", "mcp", "acp"])
@pytest.mark.parametrize("scenario", list(TABLE))
def test_the_same_sequence_means_the_same_in_every_face(
    scenario, face_class, ctx, drill, read_drill, localstripe
):
    run, expected = TABLE[scenario]
    face = face_class(ctx)
    paid = face.open()
    if run is _retry_after_a_persons_unconfirmed_failed:
        answers = run(face, paid, drill=drill, read_drill=read_drill)
    else:
        answers = run(face, paid)

    assert answers == expected[face.name]
    assert len(localstripe.succeeded_charges_for(paid.purchase_id)) == 1
    payments_made = PaymentOperation.objects.filter(purchase_id=paid.purchase_id)
    assert payments_made.count() == 1
    assert payments_made.get().outcome == Outcome.SUCCEEDED
