"""Console pages and the metrics scrape read the streaming standby; nothing that decides
money does (config/db_router.py, docs/scaling.md §2).

Proof that a page came from the standby: its WAL replay is paused, a note is written on the
primary, and the page does not show it until replay resumes. Proof that a money path never
touched the standby: its connection is closed before and still unopened after, with no
statement captured on it, while the same paths' answers and effects (localstripe objects,
rows) are counted on the primary.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from config.db_router import REPLICA, replica_reads
from payments import services as pay
from payments.enums import OperationKind, Outcome
from payments.models import PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from support import services as console
from support.access import Role, ensure_groups
from support.models import Note
from support.web import PRIMARY_PIN_COOKIE
from tests.api.client import Api, new_key
from tests.factories import ProductFactory, make_client
from tests.localstripe import provider_object
from tests.outbox import settle_outbox
from tests.stack import free_port
from tests.webhooks.events import event_for, post
from webhooks.models import EventResult, ProviderEvent

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", REPLICA])
CONFIRM = {"confirm": "yes"}


def _user(username: str, role: str) -> User:
    ensure_groups()
    user = User.objects.create_user(username=username, password="pw")
    user.groups.add(Group.objects.get(name=role))
    return user


def _purchase(api_client) -> Purchase:
    product = ProductFactory(price=1500)
    quote = pay.quote_create(
        api_client=api_client, items=[{"sku": product.sku, "quantity": 1}], currency="usd"
    )
    return pay.purchase_create(
        api_client=api_client,
        quote_id=quote.id,
        quote_version=quote.version,
        customer_reference=f"cust-{quote.id[-8:]}",
        customer_email="buyer@example.com",
    )


def _queries_on(captured: CaptureQueriesContext, table: str) -> int:
    return sum(table in q["sql"] for q in captured.captured_queries)


def test_console_page_reads_the_replica_and_shows_its_lag(replica, client):
    api_client, _ = make_client()
    purchase = _purchase(api_client)
    operator = _user("olga", Role.OPERATOR)
    client.force_login(operator)
    url = reverse("support:purchase", args=[purchase.pk])
    replica.wait_replayed()

    # Replay stops; the primary takes a note the standby has not applied yet.
    replica.pause()
    console.note_add(purchase_id=purchase.pk, user=operator, body="Customer phoned at 10:02")
    assert Note.objects.filter(purchase_id=purchase.pk).count() == 1  # on the primary

    with (
        CaptureQueriesContext(connections[REPLICA]) as on_replica,
        CaptureQueriesContext(connections["default"]) as on_primary,
    ):
        stale = client.get(url)

    assert stale.status_code == 200
    html = stale.content.decode()
    assert purchase.pk in html and "Customer phoned at 10:02" not in html
    # The purchase, its operations and timeline came from the standby, none from the primary
    # (which served only the session and the user before the page's reads began).
    assert _queries_on(on_replica, "payments_purchase") >= 1
    assert _queries_on(on_primary, "payments_purchase") == 0
    assert replica.port() == int(connections[REPLICA].settings_dict["PORT"])

    # A purchase created during the lag is not on the standby: the page asks the primary
    # before answering 404.
    newer = _purchase(api_client)
    assert client.get(reverse("support:purchase", args=[newer.pk])).status_code == 200
    assert client.get(reverse("support:purchase", args=["pur_nosuchpurchase"])).status_code == 404

    # Replay resumes: the same page now shows the note.
    replica.resume()
    replica.wait_replayed()
    assert "Customer phoned at 10:02" in client.get(url).content.decode()


def test_metrics_scrape_reads_the_replica(replica, client):
    with (
        CaptureQueriesContext(connections[REPLICA]) as on_replica,
        CaptureQueriesContext(connections["default"]) as on_primary,
    ):
        response = client.get("/metrics")

    assert response.status_code == 200 and b"verity_unknown_operations" in response.content
    assert _queries_on(on_replica, "payments_paymentoperation") >= 1
    assert _queries_on(on_primary, "payments_paymentoperation") == 0


def test_a_replica_behind_its_limit_is_not_read(replica, client, settings):
    api_client, _ = make_client()
    purchase = _purchase(api_client)
    operator = _user("olga", Role.OPERATOR)
    client.force_login(operator)
    replica.wait_replayed()
    settings.REPLICA_MAX_LAG_SECONDS = 0  # any received but unreplayed WAL is too far behind

    replica.pause()
    console.note_add(purchase_id=purchase.pk, user=operator, body="Refund promised by e-mail")
    replica.wait_received()  # the standby has it, and has not applied it
    with CaptureQueriesContext(connections[REPLICA]) as on_replica:
        page = client.get(reverse("support:purchase", args=[purchase.pk]))

    # The page is current (read from the primary); the standby answered only the lag check.
    assert "Refund promised by e-mail" in page.content.decode()
    assert len(on_replica.captured_queries) == 1
    assert "pg_last_wal_replay_lsn" in on_replica.captured_queries[0]["sql"]


def test_inside_a_transaction_or_after_a_write_reads_go_to_the_primary(replica):
    api_client, _ = make_client()
    purchase = _purchase(api_client)
    replica.wait_replayed()
    replica.pause()
    Purchase.objects.filter(pk=purchase.pk).update(customer_reference="changed-on-primary")

    with replica_reads():
        # A plain read in the block: the standby's (stale) copy.
        assert Purchase.objects.get(pk=purchase.pk).customer_reference != "changed-on-primary"
    with replica_reads():
        with transaction.atomic():
            locked = Purchase.objects.select_for_update().get(pk=purchase.pk)
            assert locked.customer_reference == "changed-on-primary"
        # ...and the block stays on the primary after its transaction.
        assert Purchase.objects.get(pk=purchase.pk).customer_reference == "changed-on-primary"
    with replica_reads():
        Purchase.objects.filter(pk=purchase.pk).update(customer_email="a@b.c")
        # Read-your-writes: after the block's write, the primary.
        assert Purchase.objects.get(pk=purchase.pk).customer_email == "a@b.c"


def test_money_paths_never_open_the_replica(replica, client, drill, localstripe, settings):
    """A claim and dispatch, an idempotent replay, a reconcile, a refund request and its
    approval, a webhook's ingestion and processing, the outbox drain (steps): all on the
    primary, while the standby is configured, reachable and paused (a read there would be
    stale)."""
    api_client, key = make_client(
        limit=10_000_000, scopes=("purchases:read", "purchases:write", "refunds:write")
    )
    api = Api(key, api_client)
    requester, approver = _user("sam", Role.SUPPORT), _user("fred", Role.FINANCE)
    operator = _user("olga", Role.OPERATOR)
    product = ProductFactory(price=2500, stock=100)
    replica.wait_replayed()
    replica.pause()
    # Closed, and watched without CaptureQueriesContext (which opens the connection): any
    # statement on the alias would first have to connect, and would be recorded.
    connections[REPLICA].close()
    on_replica: list[str] = []

    def record(execute, sql, params, many, context):
        on_replica.append(sql)
        return execute(sql, params, many, context)

    with connections[REPLICA].execute_wrapper(record):
        # API: purchase, a payment (the confirm claim and the dispatch), its replay.
        purchase = api.new_purchase(product.sku)
        body = {"payment_method": "pm_card_visa", "capture": "automatic"}
        pay_key = new_key()
        first = api.post(f"purchases/{purchase['id']}/payments", body, key=pay_key)
        again = api.post(f"purchases/{purchase['id']}/payments", body, key=pay_key)
        # An unknown payment (answer dropped after the provider applied it), then the
        # console's reconcile settles it from the provider's record.
        other = _purchase(api_client)
        op = pay.payment_create(
            purchase_id=other.pk, api_client=api_client, payment_method="pm_card_visa"
        )
        drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND)
        assert pay.operation_dispatch(operation_id=op.pk).outcome == Outcome.UNKNOWN
        client.force_login(operator)
        reconciled = client.post(
            reverse("support:reconcile", args=[op.pk]), {"reason": "customer asks", **CONFIRM}
        )
        # A refund requested by support and approved by finance (dispatched at once).
        client.force_login(requester)
        client.post(
            reverse("support:refund-request", args=[purchase["id"]]),
            {
                "step": "confirm",
                "amount_minor": "1000",
                "reason": "damaged",
                "form_token": console.form_token_mint(requester),
                **CONFIRM,
            },
        )
        refund = PaymentOperation.objects.get(purchase_id=purchase["id"], kind=OperationKind.REFUND)
        client.force_login(approver)
        approved = client.post(
            reverse("support:refund-approve", args=[refund.pk]), {"reason": "checked", **CONFIRM}
        )
        # Another unknown payment, settled by the provider's signed webhook (the object as
        # localstripe holds it): ingested by the view, processed by the outbox drain.
        third = _purchase(api_client)
        op3 = pay.payment_create(
            purchase_id=third.pk, api_client=api_client, payment_method="pm_card_visa"
        )
        drill(op3, DrillMode.DROP_RESPONSE_AFTER_SEND)
        assert pay.operation_dispatch(operation_id=op3.pk).outcome == Outcome.UNKNOWN
        intent = provider_object(
            "payment_intents", PaymentOperation.objects.get(pk=op3.pk).provider_reference
        )
        event = event_for(intent, "payment_intent.succeeded")
        delivered = post(client, event, secret=settings.STRIPE_WEBHOOK_SECRETS[0])
        # The outbox: webhook processing, steps, notifications, drained in this process.
        settle_outbox()

    assert first.status_code == 201 and first.json()["outcome"] == "succeeded"
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert reconciled.status_code == 302 and approved.status_code == 302
    assert delivered.status_code == 200
    assert ProviderEvent.objects.get(event_id=event["id"]).result == EventResult.APPLIED
    assert PaymentOperation.objects.get(pk=op3.pk).outcome == Outcome.SUCCEEDED
    assert PaymentOperation.objects.get(pk=op.pk).outcome == Outcome.SUCCEEDED
    assert PaymentOperation.objects.get(pk=refund.pk).outcome == Outcome.SUCCEEDED
    pi = localstripe.payment_intents_for(purchase["id"])
    assert len(pi) == 1 and len(localstripe.refunds_for(pi[0]["id"])) == 1
    # Never a statement on the standby, never even a connection to it.
    assert on_replica == []
    assert connections[REPLICA].connection is None

    # The console page, by contrast, reads the standby (configured and reachable) — except
    # for PRIMARY_PIN_SECONDS after this browser's own action, so it shows what it just did.
    page_url = reverse("support:purchase", args=[purchase["id"]])
    client.force_login(operator)
    assert PRIMARY_PIN_COOKIE in client.cookies
    with CaptureQueriesContext(connections[REPLICA]) as pinned_reads:
        assert client.get(page_url).status_code == 200
    assert pinned_reads.captured_queries == []
    del client.cookies[PRIMARY_PIN_COOKIE]
    replica.resume()
    replica.wait_replayed()
    with CaptureQueriesContext(connections[REPLICA]) as page_reads:
        assert client.get(page_url).status_code == 200
    assert _queries_on(page_reads, "payments_purchase") >= 1


def test_an_action_offered_by_a_stale_page_is_decided_on_the_primary(replica, client, localstripe):
    """The danger of lag: a page offers a button the primary has already made obsolete. The
    action (a POST) decides on the primary under its lock: a second approval of a refund
    already approved is refused and moves no money."""
    api_client, _ = make_client()
    purchase = _purchase(api_client)
    op = pay.payment_create(
        purchase_id=purchase.pk, api_client=api_client, payment_method="pm_card_visa"
    )
    assert pay.operation_dispatch(operation_id=op.pk).outcome == Outcome.SUCCEEDED
    requester = _user("sam", Role.SUPPORT)
    fred, fiona = _user("fred", Role.FINANCE), _user("fiona", Role.FINANCE)
    refund = console.refund_request_by_user(
        purchase_id=purchase.pk, user=requester, reason="damaged", amount=500
    )
    assert refund.outcome == Outcome.AWAITING_APPROVAL
    replica.wait_replayed()

    replica.pause()
    console.refund_approve_by_user(operation_id=refund.pk, user=fred, reason="ok")
    assert PaymentOperation.objects.get(pk=refund.pk).outcome == Outcome.SUCCEEDED
    client.force_login(fiona)
    page = client.get(reverse("support:purchase", args=[purchase.pk]))
    approve_url = reverse("support:refund-approve", args=[refund.pk])
    assert approve_url in page.content.decode()  # the stale page still offers "Approve"

    response = client.post(approve_url, {"reason": "looks fine", **CONFIRM}, follow=True)

    assert "Refused" in response.content.decode()
    pi = localstripe.payment_intents_for(purchase.pk)
    assert len(localstripe.refunds_for(pi[0]["id"])) == 1  # one refund, not two
    assert (
        PaymentOperation.objects.filter(purchase=purchase, kind=OperationKind.REFUND).count() == 1
    )


def test_an_unreachable_replica_leaves_the_console_on_the_primary(replica, client):
    api_client, _ = make_client()
    purchase = _purchase(api_client)
    client.force_login(_user("olga", Role.OPERATOR))
    replica_conn = connections[REPLICA]
    port = replica_conn.settings_dict["PORT"]
    replica_conn.close()
    replica_conn.settings_dict["PORT"] = str(free_port())  # nothing listens there
    try:
        with CaptureQueriesContext(connections["default"]) as on_primary:
            page = client.get(reverse("support:purchase", args=[purchase.pk]))
    finally:
        replica_conn.close()
        replica_conn.settings_dict["PORT"] = port

    assert page.status_code == 200 and purchase.pk in page.content.decode()
    assert _queries_on(on_primary, "payments_purchase") >= 1
