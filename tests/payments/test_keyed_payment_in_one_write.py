"""A keyed payment whose key binding, provider answer and key completion are written in
the change's last statement (payments.keyed._held_update, recovery.outbox
outbox_write_joined): a binding refused by a takeover rolls the whole effect back; an
answer whose apply fails is still recorded; the key is completed with the status the
settled operation means and never another request's. Judged on localstripe's objects and
the database's rows."""

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from events.models import Event
from payments import keyed as keyed_mod
from payments.enums import CallStep, Outcome
from payments.errors import DomainError
from payments.keyed import KeyedRequest, effect_status
from payments.models import (
    Hold,
    IdempotencyRecord,
    OperationTransition,
    PaymentOperation,
    ProviderCall,
)
from payments.providers.stripe import DrillMode
from payments.services.requests import payment_request
from recovery.models import OutboxMessage

from .one_call_helpers import provider_count

pytestmark = pytest.mark.django_db(transaction=True)


def _request(api_client, key, purchase):
    return KeyedRequest(
        api_client=api_client,
        route="payments.pay",
        key=key,
        path="keyed:pay",
        body={"purchase": purchase.id},
    )


def _in_other_connection(fn):
    errors = []

    def run():
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    t = threading.Thread(target=run)
    t.start()
    t.join(15)
    assert not t.is_alive() and errors == [], errors


def test_a_binding_refused_by_a_takeover_rolls_back_the_whole_effect(
    new_purchase, api_client, one_call
):
    """Item 2: the key is taken over (another request's lease committed) while this
    request's create transaction runs; the binding, now in the batch's last statement, is
    refused: no operation, no provider call, no hold, no history/event/outbox row, nothing
    at localstripe; the key is not bound."""
    purchase = new_purchase()
    key = uuid.uuid4().hex
    events_before = Event.objects.filter(purchase_id=purchase.id).count()
    outbox_before = OutboxMessage.objects.count()
    history_before = list(OperationTransition.objects.values_list("id", flat=True))

    def take_over(op):
        _in_other_connection(
            lambda: IdempotencyRecord.objects.filter(key=key).update(
                lease_until=timezone.now() + timedelta(seconds=120)
            )
        )

    with pytest.raises(DomainError) as refused:
        payment_request(
            _request(api_client, key, purchase),
            purchase_id=purchase.id,
            payment_method="pm_card_visa",
            before_send=take_over,
        )
    assert refused.value.code == "request_in_progress"
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 0
    assert ProviderCall.objects.count() == 0
    assert Hold.objects.count() == 0
    assert list(OperationTransition.objects.values_list("id", flat=True)) == history_before
    assert Event.objects.filter(purchase_id=purchase.id).count() == events_before
    assert OutboxMessage.objects.count() == outbox_before
    assert provider_count(one_call, purchase) == (0, 0, 0)
    record = IdempotencyRecord.objects.get(key=key)
    assert (record.state, record.resource_id) == (IdempotencyRecord.State.IN_FLIGHT, "")


def test_a_lost_answer_then_the_immediate_reconcile_completes_the_key_as_settled(
    new_purchase, api_client, one_call, drill
):
    """Item 4: the one-call answer is lost (the operation is settled `unknown`), the
    immediate reconcile re-sends under the same key and settles it. The key's stored
    status must be what the operation ended as; a replay returns the same effect; the
    thread-local is clear afterwards; one charge at localstripe."""
    purchase = new_purchase()
    key = uuid.uuid4().hex

    def lose(op):
        drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY, times=1)

    first = payment_request(
        _request(api_client, key, purchase),
        purchase_id=purchase.id,
        payment_method="pm_card_visa",
        before_send=lose,
    )
    assert getattr(keyed_mod._COMPLETING, "pending", None) is None
    op = PaymentOperation.objects.get(id=first.operation_id)
    transitions = list(
        OperationTransition.objects.filter(operation=op, field="outcome")
        .order_by("id")
        .values_list("source", "target", "cause")
    )
    record = IdempotencyRecord.objects.get(key=key)
    print("outcome", op.outcome, "record", record.state, record.response_status, transitions)
    assert op.outcome == Outcome.SUCCEEDED, transitions
    assert record.state == IdempotencyRecord.State.DONE
    assert record.response_status == effect_status(op.id, True) == 201
    replay = payment_request(
        _request(api_client, key, purchase),
        purchase_id=purchase.id,
        payment_method="pm_card_visa",
    )
    assert replay.replayed and replay.operation_id == op.id
    assert provider_count(one_call, purchase) == (1, 1, 1)
    # Every answered provider call is recorded (item 3).
    assert (
        not ProviderCall.objects.filter(operation=op, http_status__isnull=True)
        .exclude(classification__in=("unknown", ""))
        .exists()
    )


def test_a_request_never_completes_another_requests_key(new_purchase, api_client, one_call):
    """Item 4: two keyed payments run one after the other on ONE thread (a gunicorn or
    Celery thread): the second request's key is completed with its own effect, and the
    first request's key is not touched by the second request's apply."""
    p1, p2 = new_purchase(), new_purchase()
    k1, k2 = uuid.uuid4().hex, uuid.uuid4().hex
    a = payment_request(
        _request(api_client, k1, p1), purchase_id=p1.id, payment_method="pm_card_visa"
    )
    r1 = IdempotencyRecord.objects.get(key=k1)
    b = payment_request(
        _request(api_client, k2, p2), purchase_id=p2.id, payment_method="pm_card_chargeDeclined"
    )
    assert getattr(keyed_mod._COMPLETING, "pending", None) is None
    r1_after = IdempotencyRecord.objects.get(key=k1)
    r2 = IdempotencyRecord.objects.get(key=k2)
    assert (r1.response_status, r1_after.response_status, r1_after.resource_id) == (
        201,
        201,
        a.resource_id,
    )
    assert (r2.state, r2.response_status, r2.resource_id) == ("done", 402, b.resource_id)


def test_a_takeover_by_a_second_request_charges_once(new_purchase, api_client, one_call, settings):
    """Item 2 with a real second request: A's create transaction stalls past its lease
    (holding the purchase lock); B, the same key, takes the key over and waits for the
    purchase; A's binding (in its batch's last statement) is refused and A rolls back;
    B pays. One operation, one PaymentIntent, one charge; the key bound to B's."""
    settings.IDEMPOTENCY_LEASE_SECONDS = 1
    purchase = new_purchase()
    key = uuid.uuid4().hex
    out: dict = {}

    def b():
        try:
            out["b"] = payment_request(
                _request(api_client, key, purchase),
                purchase_id=purchase.id,
                payment_method="pm_card_visa",
            )
        except Exception as exc:  # noqa: BLE001
            out["b"] = exc
        finally:
            connection.close()

    def stall_until_taken_over(op):
        token = IdempotencyRecord.objects.get(key=key).lease_until
        out["thread"] = threading.Thread(target=b)
        deadline = timezone.now() + timedelta(seconds=20)
        while timezone.now() < token + timedelta(milliseconds=50):
            pass
        out["thread"].start()
        while IdempotencyRecord.objects.get(key=key).lease_until == token:
            assert timezone.now() < deadline, "B never took the key over"
        import time

        time.sleep(0.5)  # B now waits for the purchase's lock

    with pytest.raises(DomainError) as refused:
        payment_request(
            _request(api_client, key, purchase),
            purchase_id=purchase.id,
            payment_method="pm_card_visa",
            before_send=stall_until_taken_over,
        )
    out["thread"].join(30)
    assert refused.value.code == "request_in_progress"
    b_keyed = out["b"]
    assert not isinstance(b_keyed, Exception), b_keyed
    ops = list(PaymentOperation.objects.filter(purchase=purchase).values_list("id", "outcome"))
    record = IdempotencyRecord.objects.get(key=key)
    print("ops", ops, "record", record.state, record.response_status, record.resource_id)
    assert ops == [(b_keyed.operation_id, Outcome.SUCCEEDED)]
    assert (record.state, record.response_status, record.resource_id) == (
        "done",
        201,
        b_keyed.operation_id,
    )
    assert provider_count(one_call, purchase) == (1, 1, 1)


def test_the_answer_is_recorded_when_its_apply_fails(new_purchase, api_client, one_call):
    """Item 3: the apply of a one-call answer fails (a trigger refuses its history row, so
    the batch's one statement fails): the provider call's answer is recorded on its own
    all the same (http_status, classification, finished_at), never lost."""
    table = OperationTransition._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION refuse_pay_answer() RETURNS trigger AS $$ BEGIN "
            "IF NEW.cause = 'pay_answer' THEN RAISE EXCEPTION 'apply refused'; END IF; "
            "RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            f'CREATE TRIGGER refuse_pay_answer BEFORE INSERT ON "{table}" '
            "FOR EACH ROW EXECUTE FUNCTION refuse_pay_answer()"
        )
    try:
        purchase = new_purchase()
        key = uuid.uuid4().hex
        with pytest.raises(Exception, match="apply refused"):
            payment_request(
                _request(api_client, key, purchase),
                purchase_id=purchase.id,
                payment_method="pm_card_visa",
            )
        op = PaymentOperation.objects.get(purchase=purchase)
        calls = list(
            ProviderCall.objects.filter(operation=op).values_list(
                "step", "http_status", "classification", "finished_at"
            )
        )
        print("outcome", op.outcome, "calls", calls)
        assert provider_count(one_call, purchase) == (1, 1, 1)
        assert len(calls) == 1
        step, http_status, classification, finished_at = calls[0]
        assert (http_status, classification) == (200, "ok") and finished_at is not None
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP TRIGGER IF EXISTS refuse_pay_answer ON "{table}"')
            cursor.execute("DROP FUNCTION IF EXISTS refuse_pay_answer()")
