"""Replica-read tests: run against a real streaming standby, which tests.stack starts with
`--replica` (`make test` runs this directory in its own invocation; see the Makefile).

Without DATABASE_REPLICA_URL these tests are not collected. The standby replays the whole
cluster, so the tests use the stack's real database (`verity`, throwaway per run) instead
of pytest-django's `test_…` database: a standby cannot create one, and a database created
on the primary after the base backup would reach the standby only by replay. Django's
test runner mirrors the replica alias to the primary (settings TEST.MIRROR); that
redirection happens in pytest-django's database setup, which this conftest replaces, so
here the alias is the real standby — and, being a mirror, it is not flushed after a test.
"""

from __future__ import annotations

import os

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections

from tests.waiting import wait_for

if not os.environ.get("DATABASE_REPLICA_URL"):
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def django_db_setup(django_db_blocker):
    assert settings.DATABASES["replica"]["PORT"] != settings.DATABASES["default"]["PORT"]
    with django_db_blocker.unblock():
        call_command("migrate", "--noinput", verbosity=0)


def _scalar(alias: str, sql: str):
    with connections[alias].cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


class Replica:
    """Control of the real standby: pause and resume its WAL replay, wait for it."""

    def pause(self) -> None:
        _scalar("replica", "SELECT pg_wal_replay_pause()")
        wait_for(lambda: _scalar("replica", "SELECT pg_get_wal_replay_pause_state()") == "paused")

    def resume(self) -> None:
        _scalar("replica", "SELECT pg_wal_replay_resume()")

    def _primary_lsn(self) -> str:
        # The insert position, not pg_current_wal_lsn() (the write position): the stack
        # commits with synchronous_commit off, so a committed record may sit in the WAL
        # buffers until the WAL writer writes it, behind the write position.
        return _scalar("default", "SELECT pg_current_wal_insert_lsn()::text")

    def wait_replayed(self) -> None:
        """Until everything the primary has written so far is replayed on the standby."""
        target = self._primary_lsn()
        wait_for(lambda: _scalar("replica", f"SELECT pg_last_wal_replay_lsn() >= '{target}'"))

    def wait_received(self) -> None:
        """Until the standby has received (not necessarily replayed) the primary's WAL."""
        target = self._primary_lsn()
        wait_for(lambda: _scalar("replica", f"SELECT pg_last_wal_receive_lsn() >= '{target}'"))

    def port(self) -> int:
        return _scalar("replica", "SELECT inet_server_port()")


@pytest.fixture
def replica(settings, transactional_db):
    # Every read path decides freshly in these tests (no per-process cache of the check).
    settings.REPLICA_LAG_CHECK_SECONDS = 0
    settings.REPLICA_MAX_LAG_SECONDS = 60  # a loaded machine: lag only as the test makes it
    control = Replica()
    control.resume()
    control.wait_replayed()
    yield control
    control.resume()
    control.wait_replayed()
