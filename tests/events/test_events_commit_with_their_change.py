"""An event is written in the transaction of the change it reports: a change refused or
failing after its events were collected leaves no event, no fan-out message, no number
taken; a change that commits has its events, numbered without gaps, on both payment
modes. Counted in raw rows and at localstripe over plain HTTP."""

from __future__ import annotations

import pytest
from django.db import connection

from payments import services
from payments.enums import Outcome
from payments.models import Hold, IdempotencyRecord, PaymentOperation, ProviderCall
from tests.api.client import Api, new_key
from tests.factories import ProductFactory, make_client
from tests.outbox import settle_outbox

from .event_judge import event_rows, orphan_events, orphan_fanout, violations

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["two_step", "one_call"])
def mode(request, localstripe, settings):
    from tests.localstripe import one_call_off, one_call_on

    if request.param == "one_call":
        one_call_on(localstripe, settings)
        yield request.param
        one_call_off(localstripe)
    else:
        one_call_off(localstripe)
        yield request.param


def _intents(localstripe, purchase_id):
    return localstripe.payment_intents_for(purchase_id)


def _fail_inserts(table: str, when: str) -> None:
    """A trigger that makes an INSERT into `table` fail when `when` (SQL on NEW) holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION refuse_insert() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'attack: injected failure'; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(f"DROP TRIGGER IF EXISTS refuse_insert ON {table}")
        cursor.execute(
            f"CREATE TRIGGER refuse_insert BEFORE INSERT ON {table} FOR EACH ROW "
            f"WHEN ({when}) EXECUTE FUNCTION refuse_insert()"
        )


def _drop_trigger(table: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER IF EXISTS refuse_insert ON {table}")


@pytest.fixture
def trigger_cleanup():
    tables: list[str] = []
    yield tables
    for table in tables:
        _drop_trigger(table)


def test_a_spending_limit_refusal_after_the_events_were_collected_leaves_nothing(mode, localstripe):
    """One-call: the limit is refused at the claim, after the operation's and the
    purchase's transitions were recorded in the change batch. Two-step: refused before.
    Either way: no operation, no hold, no event, no fan-out, no number taken, the key free;
    then, with room, the same key pays once and the numbering has no gap."""
    client, key = make_client(limit=1000, name="tight")
    shop = Api(key, client)
    product = ProductFactory(price=1500)
    purchase = shop.new_purchase(product.sku)
    before = event_rows(purchase["id"])
    idem = new_key()
    r = shop.pay(purchase["id"], key=idem)
    assert r.status_code == 409, r.content
    assert not PaymentOperation.objects.filter(purchase_id=purchase["id"]).exists()
    assert not Hold.objects.exists()
    assert event_rows(purchase["id"]) == before
    assert orphan_fanout() == [] and orphan_events() == []
    assert violations(purchase["id"]) == []
    assert not IdempotencyRecord.objects.filter(key=idem).exists()
    assert _intents(localstripe, purchase["id"]) == []

    client.spending_limit = 10_000_000
    client.save()
    from payments.client_cache import api_client_cache_clear  # noqa: PLC0415

    api_client_cache_clear()
    r = shop.pay(purchase["id"], key=idem)
    assert r.status_code == 201, r.content
    settle_outbox()
    assert len(_intents(localstripe, purchase["id"])) == 1
    assert violations(purchase["id"]) == []


def test_an_event_write_that_fails_rolls_the_payment_back_whole(mode, localstripe, trigger_cleanup):
    """The fan-out message of the payment's first event cannot be written (injected): the
    whole change rolls back — no operation, no event, no charge at the provider — and the
    same key afterwards pays once with gapless events."""
    client, key = make_client(limit=10_000_000)
    shop = Api(key, client)
    product = ProductFactory(price=1500)
    purchase = shop.new_purchase(product.sku)
    before = event_rows(purchase["id"])
    trigger_cleanup.append("recovery_outboxmessage")
    _fail_inserts("recovery_outboxmessage", "NEW.category = 40")
    idem = new_key()
    try:
        answered = shop.pay(purchase["id"], key=idem).status_code
    except Exception as exc:  # noqa: BLE001 - raised through the test client
        answered = repr(exc)[:80]
    assert answered == 500 or "attack" in str(answered), answered
    connection.close()  # the in-process request's broken connection
    _drop_trigger("recovery_outboxmessage")
    assert not PaymentOperation.objects.filter(purchase_id=purchase["id"]).exists()
    assert not ProviderCall.objects.exists()
    assert event_rows(purchase["id"]) == before
    assert orphan_fanout() == [] and orphan_events() == []
    assert _intents(localstripe, purchase["id"]) == []
    r = shop.pay(purchase["id"], key=idem)
    assert r.status_code == 201, r.content
    settle_outbox()
    assert len(_intents(localstripe, purchase["id"])) == 1
    assert violations(purchase["id"]) == []


def test_an_answer_whose_events_cannot_be_written_is_applied_later_once(
    mode, localstripe, trigger_cleanup
):
    """The provider charged, but the transaction applying its answer fails writing the
    `payment.succeeded` event (injected): nothing of that apply commits (the operation is
    not succeeded without its event). Afterwards the sweep and reconciler settle it once:
    one charge, one `payment.succeeded`, gapless numbering."""
    from datetime import timedelta

    from django.utils import timezone

    client, key = make_client(limit=10_000_000)
    shop = Api(key, client)
    product = ProductFactory(price=1500)
    purchase = shop.new_purchase(product.sku)
    trigger_cleanup.append("events_event")
    _fail_inserts("events_event", "NEW.type = 'payment.succeeded'")
    idem = new_key()
    try:
        r = shop.pay(purchase["id"], key=idem)
        answered = r.status_code
    except Exception as exc:  # noqa: BLE001 - a 500 raised through the test client
        answered = repr(exc)[:80]
    connection.close()
    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    succeeded_events = [e for e in event_rows(purchase["id"]) if e[2] == "payment.succeeded"]
    print("answered:", answered, "outcome:", op.outcome)
    if op.outcome == Outcome.SUCCEEDED:
        assert succeeded_events, "a committed success without its event"
    _drop_trigger("recovery_outboxmessage")
    _drop_trigger("events_event")
    PaymentOperation.objects.filter(
        id=op.id, outcome__in=[Outcome.DISPATCHING, Outcome.PENDING]
    ).update(dispatch_deadline=timezone.now() - timedelta(seconds=1))
    services.operations_sweep_dead_dispatches()
    for _ in range(3):
        op = PaymentOperation.objects.get(id=op.id)
        if op.outcome == Outcome.SUCCEEDED:
            break
        if op.outcome == Outcome.PENDING:
            services.operation_dispatch(operation_id=op.id)
        else:
            services.operation_reconcile(operation_id=op.id)
    op = PaymentOperation.objects.get(id=op.id)
    settle_outbox()
    intents = _intents(localstripe, purchase["id"])
    assert len(intents) == 1 and intents[0]["status"] == "succeeded"
    assert op.outcome == Outcome.SUCCEEDED
    kinds = [e[2] for e in event_rows(purchase["id"])]
    assert kinds.count("payment.succeeded") + kinds.count("payment.resolved") == 1, kinds
    assert violations(purchase["id"]) == []
