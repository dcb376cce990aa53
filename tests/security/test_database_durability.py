"""The deploy check refuses a PostgreSQL that can lose a commit Verity answered for
(`synchronous_commit` or `fsync` off): the soak lost an accepted webhook that way."""

import pytest
from django.db import connection

from config.durability import database_keeps_acknowledged_commits

pytestmark = pytest.mark.django_db


def _ids(**settings) -> set[str]:
    with connection.cursor() as cursor:
        for name, value in settings.items():
            cursor.execute(f"SET {name} TO {value}")
    return {p.id for p in database_keeps_acknowledged_commits(databases=["default"])}


def test_asynchronous_commit_is_refused():
    assert "verity.E001" in _ids(synchronous_commit="off")


def test_synchronous_commit_passes_the_commit_check():
    assert "verity.E001" not in _ids(synchronous_commit="on")


def test_the_check_runs_only_when_a_database_is_named():
    assert database_keeps_acknowledged_commits(databases=None) == []
