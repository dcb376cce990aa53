"""A Celery worker survives a database restart: after its connections are cut (as
`pg_ctl restart` cuts them), its tasks work again instead of failing, one after another,
on a dead persistent connection until the worker is restarted (the soak found this)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from config.celery import app
from payments.enums import PurchaseStatus
from payments.models import Purchase
from tests.factories import PurchaseFactory, QuoteFactory
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SWEEP = "recovery.expire_stale_purchases"  # its first query runs outside any atomic()


def _worker_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = "
            "current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return cursor.fetchone()[0]


def _cut_the_workers_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return cursor.fetchone()[0]


def _sweep_until(predicate, timeout: float) -> None:
    def tick() -> bool:
        for _ in range(4):
            app.send_task(SWEEP)
        return predicate()

    wait_for(tick, timeout=timeout, interval=0.5)


def test_worker_tasks_work_again_after_the_database_cut_their_connections(celery_worker):
    # given a worker whose threads all hold persistent database connections
    _sweep_until(lambda: _worker_backends() >= 2, timeout=60)

    # when the database cuts every one of them
    assert _cut_the_workers_connections() >= 2
    # and a purchase is due to expire (its quote expired before any payment)
    purchase = PurchaseFactory(quote=QuoteFactory(expires_at=timezone.now() - timedelta(minutes=1)))

    # then the worker's sweep expires it: a thread fails at most the one task that found
    # its connection dead, then reconnects
    _sweep_until(
        lambda: Purchase.objects.get(id=purchase.id).status == PurchaseStatus.EXPIRED, timeout=30
    )
    assert _worker_backends() >= 1
