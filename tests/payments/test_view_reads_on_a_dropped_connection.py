"""The purchase view's reads run on the raw psycopg connection (prepared statements, one
pipelined round trip). Like Django's own cursors, they first run the CONN_HEALTH_CHECKS
probe of a connection reused from an earlier request: a connection the database dropped
while it sat idle in a worker thread (a PostgreSQL restart; the soak saw it 14 s after
one) is replaced, not answered as "database unavailable"."""

import psycopg
import pytest
from django.db import connection

from payments.view_queries import purchase_operations_load
from tests.factories import PurchaseFactory, make_client

pytestmark = pytest.mark.django_db(transaction=True)


def _drop_this_connection() -> None:
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "plain"])
def test_the_next_requests_view_read_replaces_a_connection_the_database_dropped(settings, prepared):
    settings.DATABASE_PREPARED_STATEMENTS = prepared
    client, _ = make_client(name="dropped-connection")
    purchase = PurchaseFactory(api_client=client)
    assert purchase_operations_load(purchase) == []  # warm: prepared on this connection
    _drop_this_connection()
    # What request_started / request_finished do in a server (the test client disconnects
    # them): the next request's first use probes the reused connection.
    connection.close_if_unusable_or_obsolete()

    assert purchase_operations_load(purchase) == []
