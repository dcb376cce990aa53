"""A delivery answered 200 is stored with its
one outbox row; a redelivery writes nothing — on a connection the database dropped, with
prepared statements on and off, and with the unique constraint
`providerevent_event_id_uniq` the only dedupe."""

import psycopg
import pytest
from django.db import connection

from recovery.models import OutboxMessage
from tests.webhooks.events import event_for, intent_object, post
from webhooks.models import ProviderEvent

pytestmark = pytest.mark.django_db(transaction=True)


def _event(event_id: str) -> dict:
    return event_for(
        intent_object(
            pi_id="pi_stored_once",
            status="succeeded",
            amount=1500,
            metadata={
                "purchase_id": "pur_stored_once",
                "operation_id": "op_stored_once",
                "customer_reference": "c-1",
            },
        ),
        "payment_intent.succeeded",
        event_id=event_id,
    )


def _kill_this_connection() -> None:
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


def _rows(event_id: str) -> tuple[int, int]:
    return (
        ProviderEvent.objects.filter(event_id=event_id).count(),
        OutboxMessage.objects.filter(dedupe_key=f"event:{event_id}").count(),
    )


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "plain"])
def test_a_delivery_on_a_dropped_connection_is_never_a_200_without_its_rows(
    client, settings, prepared
):
    settings.DATABASE_PREPARED_STATEMENTS = prepared
    client.raise_request_exception = False
    assert (
        post(client, _event("evt_warms_the_connection")).status_code == 200
    )  # prepared on this conn
    _kill_this_connection()

    answers = []
    for _ in range(3):  # the delivery, then Stripe's redeliveries
        answers.append(post(client, _event("evt_on_the_dropped_connection")).status_code)
        # What request_finished does in a server (the test client disconnects it).
        connection.close_if_unusable_or_obsolete()
        if answers[-1] == 200:
            break
    again = post(client, _event("evt_on_the_dropped_connection"))
    stored = _rows("evt_on_the_dropped_connection")
    print(
        f"prepared={prepared} answers={answers} redelivery={again.status_code} "
        f"{again.content!r} rows (event, outbox)={stored}"
    )
    assert answers[-1] == 200, answers
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert stored == (1, 1)


def test_the_event_id_unique_constraint_alone_keeps_redeliveries_out():
    # The dedupe is the named constraint providerevent_event_id_uniq: it is the one unique
    # index on event_id, and ingestion's ON CONFLICT (event_id) infers it.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexdef LIKE %s",
            ["webhooks_providerevent", "%UNIQUE%(event_id)%"],
        )
        names = [r[0] for r in cursor.fetchall()]
    assert names == ["providerevent_event_id_uniq"], names
