import os

from celery import Celery
from celery.signals import beat_init, task_postrun, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("verity")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _mark_ready(name: str) -> None:
    # The embedded default only (`make run`): the banner waits for these markers, so the
    # credentials are printed after the worker and beat are up, as the last thing on
    # screen. A deployment on Redis has no banner and writes nothing here.
    from django.conf import settings

    if settings.CELERY_BROKER_URL.startswith("filesystem://"):
        run_dir = settings.VAR_DIR / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / f"{name}.ready").write_text(str(os.getpid()))


@worker_ready.connect
def _worker_ready(**_kwargs) -> None:
    _mark_ready("worker")


@beat_init.connect
def _beat_ready(**_kwargs) -> None:
    _mark_ready("beat")


@task_postrun.connect
def drop_broken_db_connections(**_kwargs) -> None:
    """After a database restart or failover, a worker thread's persistent connection is
    dead. Celery's Django fixup keeps connections for CELERY_DB_REUSE_MAX tasks (the reuse
    that makes the relay fast), so without this every later task on that thread failed
    with "the connection is lost" until the worker was restarted (a
    `pg_ctl restart` shows it). Only a connection that saw an error is checked: no extra query on
    the happy path."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.errors_occurred:
            conn.close_if_unusable_or_obsolete()
