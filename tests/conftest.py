"""The suite's pytest hooks and its database teardown: real PostgreSQL, Redis and
localstripe come from tests.stack; the fixtures every folder shares are in tests/fixtures.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.conf import settings

from tests.stack import WORKERS_FILE

pytest_plugins = ["tests.fixtures"]  # the fixtures every folder shares

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "alone: no other xdist worker runs a test meanwhile (a wall-clock bound is asserted)",
    )
    config.addinivalue_line(
        "markers",
        "claims_left_by_the_test: the test leaves an outbox claim no worker handles "
        "(tests/recovery: teardown does not wait for it to lapse)",
    )
    # Test helpers import web3 and eth-account themselves (tests/x402/chain.py), and py_ecc
    # raises the recursion limit to 100000 at its import. Loaded first by the rail's own
    # guard, it never does (tests/api/test_hostile_input.py parses 3000-deep JSON here).
    from payments.providers.x402 import sdk

    sdk.load()
    global _alone_lock_dir
    if not hasattr(config, "workerinput"):
        import tempfile

        _alone_lock_dir = tempfile.mkdtemp(prefix="verity-alone-")
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise pytest.UsageError("tests run on PostgreSQL only: use `make test`")
    if not os.environ.get("STRIPE_API_BASE", "").startswith("http://127.0.0.1"):
        raise pytest.UsageError("tests need localstripe on loopback: use `make test`")
    if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get(WORKERS_FILE):
        # Workers sharing one stack would see each other's chain clock, localstripe
        # objects and broker: every worker needs its own (tests/stack.py starts them).
        raise pytest.UsageError(
            "pytest -n needs a stack per worker: `python -m tests.stack -- pytest -n N` (make test)"
        )


def _empty_tables_after_transactional_test(self) -> None:
    """A transactional test's database is emptied afterwards as Django's `flush` leaves it
    (every model table empty; content types and permissions as migrate made them), in a
    fraction of its time: `flush` TRUNCATEs all ~40 tables (each a new file on disk) and
    re-creates content types and permissions, ~1-2 s per test on a loaded machine, for
    tables a test has mostly not touched. Here: one DELETE per table in one transaction,
    with triggers off (the append-only tables' refusal and the foreign keys' checks, which
    TRUNCATE skips as well), content types and permissions kept (the rows post_migrate
    would write again). Sequences are not reset, as with flush(reset_sequences=False).
    Test cases with `available_apps` or serialized rollback keep Django's own flush.
    """
    from django.db import connections, transaction

    if (
        self.available_apps is not None
        or self.serialized_rollback
        or os.environ.get("VERITY_TEST_DJANGO_FLUSH") == "1"  # to compare, or to doubt
        or not _post_migrate_writes_only_content_types()
    ):
        return _django_fixture_teardown(self)
    for alias in self._databases_names(include_mirrors=False):
        conn = connections[alias]
        if conn.vendor != "postgresql":
            _django_fixture_teardown(self)
            continue
        keep = {"django_content_type", "auth_permission"}
        tables = sorted(
            set(conn.introspection.django_table_names(only_existing=True, include_views=False))
            - keep
        )
        with transaction.atomic(using=alias), conn.cursor() as cur:
            cur.execute("SET LOCAL session_replication_role = replica")
            cur.execute("".join(f"DELETE FROM {conn.ops.quote_name(t)};" for t in tables))


def _post_migrate_writes_only_content_types() -> bool:
    """Kept rows stand for what post_migrate would write again: true while its only
    receivers are Django's content types and permissions (a new receiver means
    Django's own flush, which runs it)."""
    import weakref

    from django.db.models.signals import post_migrate

    known = {
        "django.contrib.auth.management.create_permissions",
        "django.contrib.contenttypes.management.create_contenttypes",
    }
    for entry in post_migrate.receivers:
        ref = entry[1]
        func = ref() if isinstance(ref, weakref.ReferenceType) else ref
        if func is not None and f"{func.__module__}.{func.__qualname__}" not in known:
            return False
    return True


def _install_fast_flush() -> None:
    from django.test import TransactionTestCase

    global _django_fixture_teardown
    _django_fixture_teardown = TransactionTestCase._fixture_teardown
    TransactionTestCase._fixture_teardown = _empty_tables_after_transactional_test


_install_fast_flush()


# The slowest tests (by `--durations`, docs/performance.md "Test suite time"), longest first.
# Under `make test` (xdist, one test handed out at a time) they start at once on different
# workers instead of ending the run with one worker alone on the soak.
SLOWEST_FIRST = (
    "tests/soak/",
    "tests/payments/test_observation_properties.py",
    "tests/foundation/test_newcomer_smoke.py",
    "tests/lifecycle/test_state_machine.py",
    "tests/security/test_startup_refusals.py",
    "tests/security/test_sessions.py",
    "tests/foundation/test_sqlite_paths.py",
    "tests/recovery/test_worker_faults.py",
    "tests/support/test_browser_console.py",
    "tests/security/test_deploy_settings.py",
    "tests/x402/test_refund_nonce_race.py",
    "tests/x402/test_refund_reconcile_race.py",
    "tests/ops/test_database_unavailable.py",
    "tests/recovery/test_broker_outage.py",
    "tests/payments/test_concurrency.py",
)


@pytest.hookimpl(trylast=True)  # after pytest-django's own ordering
def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        return next(
            (i for i, prefix in enumerate(SLOWEST_FIRST) if item.nodeid.startswith(prefix)),
            len(SLOWEST_FIRST),
        )

    slow = sorted((i for i in items if rank(i) < len(SLOWEST_FIRST)), key=rank)
    rest = [i for i in items if rank(i) == len(SLOWEST_FIRST)]
    # xdist's first hand-out is two consecutive tests per worker: alternate slow and quick
    # so no worker starts with two slow ones queued.
    ordered = [t for pair in zip(slow, rest, strict=False) for t in pair]
    ordered += slow[len(rest) :] + rest[len(slow) :]
    items[:] = ordered


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without pytest-xdist
def pytest_configure_node(node):  # xdist controller: every worker shares the alone-locks
    node.workerinput["alone_lock_dir"] = _alone_lock_dir


_alone_lock_dir = None


@pytest.fixture(autouse=True)
def _alone_or_together(request):
    """`@pytest.mark.alone`: a test that asserts a wall-clock bound runs while no other
    xdist worker runs a test (their CPU would be measured, not the code). Two flock()s shared
    by the workers: a test takes the gate shared for a moment and the room shared for its
    run; an alone test takes the gate exclusively (no test starts) and then the room
    exclusively (the running ones finish). Serial runs take no lock."""
    import fcntl

    lock_dir = getattr(request.config, "workerinput", {}).get("alone_lock_dir")
    if not lock_dir:
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    with open(Path(lock_dir) / "gate", "a") as gate, open(Path(lock_dir) / "room", "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)
