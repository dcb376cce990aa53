"""DATABASE_REPLICA_URL (config/settings/database.py, docs/scaling.md): unset, nothing
changes; set wrongly, the process refuses to start and says what to fix. The replica's
behaviour against a real standby is tested in tests/replica (its own `make test` step)."""

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]


def _settings(**env) -> subprocess.CompletedProcess:
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(sorted(settings.DATABASES), settings.DATABASE_ROUTERS)"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "true", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_a_replica_there_is_one_alias_and_no_router():
    assert list(settings.DATABASES) == ["default"]
    assert settings.DATABASE_ROUTERS == []


def test_a_replica_url_adds_the_alias_and_the_router_without_connecting():
    result = _settings(DATABASE_REPLICA_URL="postgres://postgres@127.0.0.1:9/verity")
    assert result.returncode == 0, result.stderr
    assert "['default', 'replica'] ['config.db_router.ReplicaRouter']" in result.stdout


def test_a_replica_beside_the_embedded_sqlite_refuses_to_start():
    result = _settings(
        DATABASE_URL="sqlite:////tmp/verity-replica-check.sqlite3",
        DATABASE_REPLICA_URL="postgres://postgres@127.0.0.1:9/verity",
    )
    assert result.returncode != 0
    assert "DATABASE_REPLICA_URL needs PostgreSQL" in result.stderr


def test_a_replica_that_is_not_postgresql_refuses_to_start():
    result = _settings(DATABASE_REPLICA_URL="mysql://u@127.0.0.1:9/verity")
    assert result.returncode != 0
    assert "DATABASE_REPLICA_URL must be a postgres:// URL" in result.stderr
