"""The fast path before DRF (payments.api.fast_path) answers exactly as the DRF view
does for the same state — status, headers and body, byte for byte — for every answer it
gives (200 replay, 200 GET); every other case is handed to the DRF view and answers as it
did, and a request is counted once against the client's limit.

Each comparison sends the same request twice against unchanged state: once with the fast
path on, once with it off (`API_FAST_PATH = False`: the DRF view alone)."""

from datetime import datetime, timedelta

import pytest
from django.core.cache import cache
from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone

from payments.api.idempotency import request_fingerprint
from payments.models import IdempotencyRecord
from tests.api.client import Api, new_key
from tests.factories import make_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_settings")]

BODY = {"payment_method": "pm_card_visa", "capture": "automatic"}


def _both(settings, send):
    """(fast-path answer, DRF answer) of `send()` against the same state."""
    settings.API_FAST_PATH = True
    fast = send()
    settings.API_FAST_PATH = False
    drf = send()
    settings.API_FAST_PATH = True
    return fast, drf


def _same(fast, drf) -> None:
    assert fast.status_code == drf.status_code
    assert dict(fast.items()) == dict(drf.items())
    assert fast.content == drf.content


def _paid(storefront, product):
    purchase = storefront.new_purchase(product.sku)
    key = new_key()
    paid = storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)
    assert paid.status_code == 201, paid.content
    storefront.get(f"purchases/{purchase['id']}")  # the key is verified: cache warm
    return purchase, key


def _running(storefront, path: str, *, lease_seconds: int) -> str:
    """A key whose payment is still running (its record leased): a replay of it is 409."""
    key = new_key()
    IdempotencyRecord.objects.create(
        api_client=storefront.client,
        route="purchases_payments_create",
        key=key,
        fingerprint=request_fingerprint(path=path, body=BODY),
        lease_until=timezone.now() + timedelta(seconds=lease_seconds),
    )
    return key


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "unprepared"])
def test_a_replay_is_byte_identical_to_the_drf_replay(storefront, product, fast_settings, prepared):
    fast_settings.DATABASE_PREPARED_STATEMENTS = prepared  # PgBouncer < 1.21: off
    purchase, key = _paid(storefront, product)

    fast, drf = _both(
        fast_settings,
        lambda: storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key),
    )

    assert getattr(fast, "verity_fast_path", False) and not hasattr(drf, "verity_fast_path")
    assert fast.status_code == 200 and fast["Idempotent-Replayed"] == "true"
    assert fast["Cache-Control"] == "no-store"
    _same(fast, drf)


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "unprepared"])
def test_a_purchase_read_is_byte_identical_to_the_drf_read(
    storefront, product, fast_settings, prepared
):
    fast_settings.DATABASE_PREPARED_STATEMENTS = prepared
    purchase, _ = _paid(storefront, product)

    fast, drf = _both(fast_settings, lambda: storefront.get(f"purchases/{purchase['id']}"))

    assert getattr(fast, "verity_fast_path", False) and not hasattr(drf, "verity_fast_path")
    assert fast.status_code == 200 and fast["Cache-Control"] == "no-store"
    _same(fast, drf)


def test_every_other_answer_is_the_drf_views(storefront, other_storefront, product, fast_settings):
    purchase, key = _paid(storefront, product)
    pid = purchase["id"]
    path = f"/api/v1/purchases/{pid}/payments"
    running = _running(storefront, path, lease_seconds=30)
    _, reader_key = make_client(scopes=("purchases:read",), name="reader")
    reader = Api(reader_key)
    reader.get("products")  # verified: cache warm
    storefront.get("products")  # a client saved clears the cache: verify this key again
    cases = {
        422: lambda: storefront.post(
            f"purchases/{pid}/payments", {**BODY, "payment_method": "pm_card_mastercard"}, key=key
        ),
        409: lambda: storefront.post(f"purchases/{pid}/payments", BODY, key=running),
        404: lambda: other_storefront.get(f"purchases/{pid}"),
        401: lambda: Api("nope.wrong").get(f"purchases/{pid}"),
        403: lambda: reader.post(f"purchases/{pid}/payments", BODY, key=key),
        400: lambda: storefront.post(f"purchases/{pid}/payments", BODY, key=None),
    }
    for status, send in cases.items():
        fast, drf = _both(fast_settings, send)
        assert fast.status_code == status, (status, fast.content)
        assert not hasattr(fast, "verity_fast_path")
        _same(fast, drf)
    assert IdempotencyRecord.objects.get(key=running).state == IdempotencyRecord.State.IN_FLIGHT


def test_a_refused_request_is_counted_once_and_answers_as_drf(storefront, product, fast_settings):
    purchase, key = _paid(storefront, product)
    fast_settings.API_THROTTLE_RATE = "3/min"
    counter = f"rl:throttle_api_client_client:{storefront.client.pk}"
    cache.delete(counter)
    send = lambda: storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)  # noqa

    answers = [send() for _ in range(3)]
    assert [a.status_code for a in answers] == [200] * 3
    assert all(getattr(a, "verity_fast_path", False) for a in answers)
    refused = send()  # counted by the fast path, refused by the DRF view with that count
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert cache.get(counter) == 4  # once per request, not twice for the refused one

    # the same refusal from the DRF view alone
    fast_settings.API_FAST_PATH = False
    cache.delete(counter)
    for _ in range(3):
        assert send().status_code == 200
    drf = send()
    assert cache.get(counter) == 4
    assert refused.status_code == drf.status_code and refused.content == drf.content
    assert dict(refused.items()).keys() == dict(drf.items()).keys()


def test_a_locked_key_prefix_is_refused_429_on_both_paths(storefront, product, fast_settings):
    # given a key verified a moment ago (cached), then its prefix locked by failed guesses
    purchase, key = _paid(storefront, product)
    _, reader_key = make_client(scopes=("purchases:read",), name="reader")
    reader = Api(reader_key)
    reader.get("products")
    storefront.get("products")  # a client saved clears the cache: verify this key again
    fast_settings.API_AUTH_FAILURES_PER_PREFIX = 3
    locks = [f"api-auth-fail:prefix:{k.split('.')[0]}" for k in (storefront.key, reader_key)]
    for lock in locks:
        cache.set(lock, 3, timeout=60)
    try:
        # then every path answers the lockout's 429, the scope refusal included
        for send in (
            lambda: storefront.get(f"purchases/{purchase['id']}"),
            lambda: storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key),
            lambda: reader.post(f"purchases/{purchase['id']}/payments", BODY, key=key),
        ):
            fast, drf = _both(fast_settings, send)
            assert fast.status_code == 429, fast.content
            assert fast["Retry-After"] == str(fast_settings.API_AUTH_FAILURE_WINDOW_SECONDS)
            _same(fast, drf)
    finally:
        cache.delete_many(locks)


def _state(obj, relations=()) -> dict:
    """Every loaded field and annotation of a model instance, and its loaded relations'."""
    out = {k: v for k, v in obj.__dict__.items() if not k.startswith("_")}
    # built as from_db builds it: class, database state, the FSM's initial states, and
    # each datetime's very tzinfo (== on datetimes alone ignores which tzinfo it is)
    out["(class, adding, db)"] = (type(obj), obj._state.adding, obj._state.db)
    out["(fsm initial)"] = obj.__dict__.get("_ConcurrentTransitionMixin__initial_states")
    out["(tzinfo)"] = {k: v.tzinfo for k, v in out.items() if isinstance(v, datetime)}
    for name in relations:
        try:
            related = getattr(obj, name)
        except ObjectDoesNotExist:  # a reverse one-to-one with no row (no hold)
            related = None
        out[name] = None if related is None else _state(related)
    return out


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "unprepared"])
def test_compiled_reads_load_what_the_querysets_load(storefront, product, fast_settings, prepared):
    from payments.models import PaymentOperation, Purchase
    from payments.selectors import purchase_get_for_client
    from payments.view_queries import operation_for_view, operations_for_view

    fast_settings.DATABASE_PREPARED_STATEMENTS = prepared
    purchase, _ = _paid(storefront, product)
    op_id = PaymentOperation.objects.get(purchase_id=purchase["id"]).id

    compiled, orm = operation_for_view(op_id), operations_for_view().get(pk=op_id)
    assert _state(compiled, ("purchase", "hold")) == _state(orm, ("purchase", "hold"))
    assert _state(compiled.purchase, ("quote",)) == _state(orm.purchase, ("quote",))
    assert operation_for_view("op_missing") is None

    compiled = purchase_get_for_client(purchase_id=purchase["id"], api_client=storefront.client)
    orm = Purchase.objects.select_related("quote").get(pk=purchase["id"])
    assert _state(compiled, ("quote",)) == _state(orm, ("quote",))
    from payments.api.presenters import _order_reference
    from payments.view_queries import purchase_operations_load, purchase_order_reference
    from recovery.models import Order

    for _ in range(2):  # without an order, then with one (as the order writer leaves it)
        purchase_operations_load(compiled)
        assert purchase_order_reference(compiled, lambda _: "unused") == _order_reference(
            purchase["id"]
        )
        Order.objects.get_or_create(
            purchase_id=purchase["id"], defaults={"reference": f"ord-{purchase['id'][-8:]}"}
        )
    assert purchase_order_reference(compiled, lambda _: "unused") is not None
    other, _ = make_client(name="someone-else")
    assert purchase_get_for_client(purchase_id=purchase["id"], api_client=other) is None


def test_a_database_lost_under_a_compiled_read_answers_503_not_500(
    storefront, product, fast_settings
):
    # given a verified key (no query to authenticate) and a connection the server dropped
    from django.db import connection

    purchase, _ = _paid(storefront, product)
    connection.ensure_connection()
    connection.connection.close()  # as after a PostgreSQL restart under a kept connection
    try:
        # when the purchase is read (a prepared statement on that connection)
        answer = storefront.get(f"purchases/{purchase['id']}")
    finally:
        connection.close()  # the next query reconnects

    # then the database outage's 503, as from Django's own cursors
    assert answer.status_code == 503, answer.content
    assert answer.json()["code"] == "database_unavailable" and int(answer["Retry-After"]) > 0


def _with_disputes_steps_and_order(purchase_id: str) -> None:
    """Every read of the purchase view finds rows: two disputes (opened out of id order),
    three step runs (one a deliverable), an order."""
    from payments.enums import DisputeStatus
    from payments.models import Dispute, PaymentOperation
    from recovery.models import Order, StepName, StepRun, StepState

    payment = PaymentOperation.objects.get(purchase_id=purchase_id)
    now = timezone.now()
    for n, (status, opened) in enumerate(
        [
            (DisputeStatus.UNDER_REVIEW, now),
            (DisputeStatus.NEEDS_RESPONSE, now - timedelta(hours=1)),
        ]
    ):
        Dispute.objects.create(
            id=f"dp_{purchase_id[-6:]}_{9 - n}",
            purchase_id=purchase_id,
            payment=payment,
            amount=700 + n,
            currency="usd",
            reason="fraudulent" if n else "",
            status=status,
            evidence_due_by=now + timedelta(days=n + 1),
            opened_at=opened,
        )
        Dispute.objects.filter(pk=f"dp_{purchase_id[-6:]}_{9 - n}").update(opened_at=opened)
    for step, state in [
        (StepName.ORDER, StepState.DONE),
        (StepName.LEDGER, StepState.FAILED),
        (StepName.DELIVERABLE, StepState.RUNNING),
    ]:
        StepRun.objects.update_or_create(
            purchase_id=purchase_id,
            step=step,
            defaults={"state": state, "key": f"{purchase_id}:{step}"},
        )
    Order.objects.get_or_create(
        purchase_id=purchase_id, defaults={"reference": f"ord-{purchase_id[-8:]}"}
    )


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "unprepared"])
def test_a_purchase_read_with_disputes_steps_and_an_order_is_byte_identical(
    storefront, product, fast_settings, prepared
):
    # given a purchase whose every view read finds rows
    fast_settings.DATABASE_PREPARED_STATEMENTS = prepared
    purchase, _ = _paid(storefront, product)
    _with_disputes_steps_and_order(purchase["id"])

    # when it is read on the fast path (one round trip) and by the DRF view
    fast, drf = _both(fast_settings, lambda: storefront.get(f"purchases/{purchase['id']}"))

    # then the same bytes, showing what the ORM querysets read
    assert getattr(fast, "verity_fast_path", False) and not hasattr(drf, "verity_fast_path")
    _same(fast, drf)
    view = fast.json()
    assert [d["id"] for d in view["disputes"]] == [
        d.id for d in _disputes_of(purchase["id"]).order_by("opened_at", "id")
    ]
    assert view["disputes"][0]["reason"] == "fraudulent" and view["disputes"][1]["reason"] is None
    assert view["fulfillment"]["order"] == "done" and view["fulfillment"]["ledger"] == "failed"
    assert view["fulfillment"]["deliverable"] == "running"
    assert view["fulfillment"]["inventory"] == "pending"
    assert view["order_reference"].startswith("ord-")


def _disputes_of(purchase_id):
    from payments.models import Dispute

    return Dispute.objects.filter(purchase_id=purchase_id)


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "unprepared"])
def test_compiled_view_reads_return_what_the_orm_reads(
    storefront, product, fast_settings, prepared
):
    from payments.api.presenters import disputes_view, purchase_view
    from payments.models import Purchase
    from payments.view_queries import purchase_disputes
    from recovery.models import STEP_ORDER, StepName, StepRun, StepState
    from recovery.reads import steps_for_purchase

    fast_settings.DATABASE_PREPARED_STATEMENTS = prepared
    purchase, _ = _paid(storefront, product)
    pid = purchase["id"]
    _with_disputes_steps_and_order(pid)
    row = Purchase.objects.get(pk=pid)

    # the disputes, as `purchase.disputes.order_by("opened_at", "id")` yields them
    orm = [
        (d.id, d.status, d.amount, d.currency, d.reason, d.evidence_due_by)
        for d in row.disputes.order_by("opened_at", "id")
    ]
    assert purchase_disputes(row) == orm and len(orm) == 2
    assert [d["evidence_due_by"] for d in disputes_view(row)] == [
        d[5].isoformat().replace("+00:00", "Z") for d in orm
    ]
    # the steps, as the ORM query that steps_for_purchase ran before
    states = dict(StepRun.objects.filter(purchase_id=pid).values_list("step", "state"))
    expected = {s.value: states.get(s.value, StepState.PENDING.value) for s in STEP_ORDER}
    expected[StepName.DELIVERABLE.value] = states[StepName.DELIVERABLE.value]
    assert steps_for_purchase(pid) == expected
    # and the view built from them is the one the fast path serves
    assert purchase_view(row)["fulfillment"] == expected


def test_a_replay_reads_its_record_and_operation_in_one_statement(
    storefront, product, fast_settings
):
    # given a finished payment and its replay, the key verified (no query to authenticate)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    purchase, key = _paid(storefront, product)
    replay = lambda: storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)  # noqa
    replay()
    fast_settings.DATABASE_PREPARED_STATEMENTS = False  # so Django's cursor sees the SQL

    with CaptureQueriesContext(connection) as queries:
        answer = replay()

    assert answer.status_code == 200 and getattr(answer, "verity_fast_path", False)
    assert len(queries.captured_queries) == 1, [q["sql"][:80] for q in queries]


@pytest.mark.parametrize("prepared", [True, False])
def test_prepared_reads_are_counted_like_djangos_own(storefront, product, fast_settings, prepared):
    # The purchase view's four reads (its order reference read with the purchase) go in one
    # pipeline of prepared statements, outside Django's cursors: a statement count (tests,
    # bench/scale.py) saw 0 of them.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    purchase, key = _paid(storefront, product)
    fast_settings.DATABASE_PREPARED_STATEMENTS = prepared
    storefront.get(f"purchases/{purchase['id']}")

    with CaptureQueriesContext(connection) as queries:
        answer = storefront.get(f"purchases/{purchase['id']}")

    assert answer.status_code == 200 and getattr(answer, "verity_fast_path", False)
    # The table of each statement's first selected column.
    tables = [q["sql"].split()[1].split(".")[0] for q in queries.captured_queries]
    assert tables == [
        '"payments_purchase"',
        '"payments_paymentoperation"',
        '"payments_dispute"',
        '"recovery_steprun"',
    ]
    assert '"recovery_order"' in queries.captured_queries[0]["sql"]


def test_the_compiled_reads_are_prepared_statements_on_the_connection(
    storefront, product, fast_settings
):
    # Django opens psycopg connections with prepare_threshold=None, under which psycopg
    # ignores execute(prepare=True): the reads were parsed and planned on every request.
    from django.db import connection

    purchase, key = _paid(storefront, product)
    for _ in range(2):
        storefront.get(f"purchases/{purchase['id']}")
        storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("payments_idempotencyrecord" in s for s in prepared), prepared
    assert any("recovery_steprun" in s for s in prepared), prepared
    assert connection.connection.prepare_threshold is None  # Django's cursors: unchanged


def test_an_instance_built_from_a_row_is_from_dbs_and_saves_as_one(storefront, product):
    """payments.view_queries._instance fills an instance's __dict__ instead of running
    Model.__init__: only for models where that builds the same instance; and such an
    instance saves with its FSM's concurrent-transition check intact."""
    from django.db.models.signals import post_init
    from django_fsm import ConcurrentTransition

    from payments.models import Hold, PaymentOperation
    from payments.view_queries import _build_plan, operation_for_view

    purchase, _ = _paid(storefront, product)
    op = operation_for_view(PaymentOperation.objects.get(purchase_id=purchase["id"]).id)
    assert _build_plan(PaymentOperation) is not None and _build_plan(Hold) is not None
    op.save(update_fields=["updated_at"])  # its initial state is the row's: saved
    stale = operation_for_view(op.id)
    PaymentOperation.objects.filter(pk=op.id).update(outcome="unknown")
    with pytest.raises(ConcurrentTransition):  # the row's state moved since it was read
        stale.save()

    def receiver(**kwargs):
        pass

    post_init.connect(receiver, sender=Hold)
    try:
        assert _build_plan(Hold) is None  # a post_init receiver: Model.__init__ runs
    finally:
        post_init.disconnect(receiver, sender=Hold)


def test_every_handed_over_request_is_counted_once(
    storefront, product, other_storefront, fast_settings
):
    """The fast path counts a request before its database read (the two round trips
    overlap); a request it then hands over — a first payment, a reused key with another
    body, another client's purchase — is counted by it once, never again by the view."""
    purchase, key = _paid(storefront, product)
    pid = purchase["id"]
    second = storefront.new_purchase(product.sku)
    counter = f"rl:throttle_api_client_client:{storefront.client.pk}"
    sends = {
        201: lambda: storefront.post(f"purchases/{second['id']}/payments", BODY, key=new_key()),
        422: lambda: storefront.post(
            f"purchases/{pid}/payments", {**BODY, "payment_method": "pm_card_mastercard"}, key=key
        ),
        200: lambda: storefront.post(f"purchases/{pid}/payments", BODY, key=key),
    }
    for status, send in sends.items():
        cache.delete(counter)
        answer = send()
        assert answer.status_code == status, answer.content
        assert cache.get(counter) == 1, status

    other_counter = f"rl:throttle_api_client_client:{other_storefront.client.pk}"
    other_storefront.get(f"purchases/{other_storefront.new_purchase(product.sku)['id']}")
    cache.delete(other_counter)
    assert other_storefront.get(f"purchases/{pid}").status_code == 404
    assert cache.get(other_counter) == 1


def test_a_read_failing_between_the_limiters_send_and_reply_leaves_redis_in_step(
    storefront, product, fast_settings, monkeypatch
):
    """The limiter's reply is read even when the database read between its send and its
    reply raises: the request is counted once (the view reuses the decision), and the
    pooled Redis connection is not left holding an unread reply for the next command."""
    from config.redis_client import redis_client
    from payments.api import fast_path

    purchase, key = _paid(storefront, product)
    counter = f"rl:throttle_api_client_client:{storefront.client.pk}"
    cache.delete(counter)

    def broken(**kwargs):
        raise RuntimeError("the read failed")

    monkeypatch.setattr(fast_path, "idempotency_replayed_operation", broken)
    answer = storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)
    assert answer.status_code == 200 and not hasattr(answer, "verity_fast_path")
    assert answer["Idempotent-Replayed"] == "true"  # the DRF view's own replay
    assert cache.get(counter) == 1

    client = redis_client()
    for n in range(20):  # every pooled connection answers its own command
        client.set(f"test-in-step-{n}", n)
        assert int(client.get(f"test-in-step-{n}")) == n
    monkeypatch.undo()
    cache.delete(counter)
    replay = storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)
    assert getattr(replay, "verity_fast_path", False) and cache.get(counter) == 1


def test_the_fast_path_answers_before_the_middleware_an_api_request_never_uses(
    storefront, product, fast_settings, monkeypatch
):
    """FastPathMiddleware answers a clean replay and read before the session, CSRF, auth
    and messages middleware run (it sits after them in MIDDLEWARE); a request carrying a
    session cookie goes down the whole chain and the view's own wrapper answers it early."""
    from django.contrib.messages.middleware import MessageMiddleware

    purchase, key = _paid(storefront, product)
    seen = []
    original = MessageMiddleware.process_request
    monkeypatch.setattr(
        MessageMiddleware,
        "process_request",
        lambda self, request: (seen.append(request.path), original(self, request))[1],
    )
    replay = storefront.post(f"purchases/{purchase['id']}/payments", BODY, key=key)
    read = storefront.get(f"purchases/{purchase['id']}")
    assert getattr(replay, "verity_fast_path", False) and getattr(read, "verity_fast_path", False)
    assert seen == []
    for name, value in (
        ("X-Frame-Options", "DENY"),
        ("X-Content-Type-Options", "nosniff"),
        ("Content-Length", str(len(read.content))),
    ):
        assert read[name] == value

    storefront.http.cookies["sessionid"] = "not-a-session"
    with_cookie = storefront.get(f"purchases/{purchase['id']}")
    assert getattr(with_cookie, "verity_fast_path", False)
    assert seen == [f"/api/v1/purchases/{purchase['id']}"]
    assert with_cookie.content == read.content
