"""Shared fixtures: real PostgreSQL, Redis and localstripe come from tests.stack."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
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


class Localstripe:
    """Counts objects at the fake provider over plain HTTP (not through Verity's adapter)."""

    def __init__(self, base: str, key: str) -> None:
        self.base = base.rstrip("/")
        self.auth = (key, "")

    def list(self, resource: str, **params) -> list[dict]:
        params.setdefault("limit", 100)
        out, starting_after = [], None
        while True:
            if starting_after:
                params["starting_after"] = starting_after
            r = requests.get(
                f"{self.base}/v1/{resource}", params=params, auth=self.auth, timeout=10
            )
            r.raise_for_status()
            body = r.json()
            out.extend(body["data"])
            if not body.get("has_more") or not body["data"]:
                return out
            starting_after = body["data"][-1]["id"]

    def payment_intents_for(self, purchase_id: str) -> list[dict]:
        return [
            pi
            for pi in self.list("payment_intents")
            if (pi.get("metadata") or {}).get("purchase_id") == purchase_id
        ]

    def succeeded_charges_for(self, purchase_id: str) -> list[dict]:
        return [
            pi
            for pi in self.payment_intents_for(purchase_id)
            if pi["status"] in ("succeeded", "requires_capture")
        ]

    def refunds_for(self, payment_intent_id: str) -> list[dict]:
        return [r for r in self.list("refunds") if r.get("payment_intent") == payment_intent_id]

    def flush(self) -> None:
        requests.delete(f"{self.base}/_config/data", timeout=10)

    def clock_offset(self, seconds: float) -> None:
        """Move the launcher's `Date` header this far ahead of the machine's clock."""
        r = requests.post(
            f"{self.base}/_config/clock", data={"offset_seconds": seconds}, timeout=10
        )
        r.raise_for_status()

    def clock_date(self, raw: str) -> None:
        """Send this raw `Date` header ("" goes back to the machine's clock)."""
        r = requests.post(f"{self.base}/_config/clock", data={"date": raw}, timeout=10)
        r.raise_for_status()

    def idempotency(self, **config) -> dict:
        """Stripe's idempotency-key layer of the launcher (tools/localstripe_server.py):
        enabled, window_seconds, hold_seconds, flush. Returns its state."""
        r = requests.post(f"{self.base}/_config/idempotency", data=config, timeout=10)
        r.raise_for_status()
        return r.json()


@pytest.fixture
def localstripe() -> Localstripe:
    return Localstripe(settings.STRIPE_API_BASE, settings.STRIPE_API_KEY)


def one_call_on(localstripe: Localstripe, settings_) -> None:
    """The provider dedupes keys (localstripe's idempotency layer on) and Verity pays in one
    round trip (STRIPE_DEDUPES_KEYS)."""
    localstripe.idempotency(enabled="true", window_seconds=86400, hold_seconds=0, flush="true")
    settings_.STRIPE_DEDUPES_KEYS = True


def one_call_off(localstripe: Localstripe) -> None:
    localstripe.idempotency(enabled="false", window_seconds=86400, hold_seconds=0, flush="true")


@pytest.fixture
def one_call(localstripe, settings):
    """Payments in one round trip against a provider that dedupes keys, for one test."""
    one_call_on(localstripe, settings)
    yield localstripe
    one_call_off(localstripe)


@pytest.fixture
def celery_worker(transactional_db):
    """A real Celery worker process on the throwaway Redis, using the test database.

    Function-scoped on purpose: a worker that outlived its test would drain later tests'
    outbox rows behind their backs and deadlock the test database flush. The broker is
    emptied first (other tests' on_commit kicks pile up there), and at teardown the
    worker is given time to finish what it claimed before it is stopped.
    """
    import redis as redis_lib

    from recovery.kick import relay_kick_forget

    redis_lib.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    relay_kick_forget()  # the drain this process remembered publishing went with the broker
    db = settings.DATABASES["default"]
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env = {**os.environ, "DATABASE_URL": url, "CELERY_DB_REUSE_MAX": "1000"}
    log = open(Path(os.environ.get("VERITY_STACK_DIR", "/tmp")) / "worker.log", "ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--loglevel",
            "INFO",
            "--concurrency",
            "2",
            "--pool",
            "threads",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    yield proc
    _wait_outbox_quiet(timeout=15)
    os.killpg(proc.pid, signal.SIGTERM)  # warm shutdown: running tasks finish first
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_outbox_quiet(timeout: float) -> None:
    from django.utils import timezone

    from recovery.models import OutboxMessage

    def quiet():
        now = timezone.now()
        return not OutboxMessage.objects.filter(
            processed_at__isnull=True, claimed_until__gt=now
        ).exists()

    try:
        wait_for(quiet, timeout=timeout)
    except AssertionError:
        pass  # a handler that hangs: the worker is stopped anyway


@pytest.fixture
def drill():
    """Arm a fault drill for one operation's step (through the fault-drill HTTP client,
    never a patched SDK); disarmed after the test."""
    from payments.enums import Rail
    from payments.services import provider_for_rail

    provider = provider_for_rail(Rail.STRIPE)

    def arm(op, mode, step="confirm", times=1):
        provider.arm_drill(key_prefix=op.idempotency_key, step=step, mode=mode, times=times)

    yield arm
    provider.drill_client.disarm_all()


_HANGING_DISPATCH = """
import django, sys
django.setup()
from payments import services
from payments.enums import Rail
from payments.services import provider_for_rail
from payments.models import PaymentOperation
op = PaymentOperation.objects.get(id=sys.argv[1])
provider_for_rail(Rail.STRIPE).arm_drill(key_prefix=op.idempotency_key, step="confirm",
                                         mode="hang_after_send")
services.operation_dispatch(operation_id=op.id)
"""


def start_hanging_dispatch(operation_id: str) -> subprocess.Popen:
    """A child interpreter (its own process, as a worker is) that dispatches the operation
    and hangs once the confirm is sent: the provider charges, the answer never comes. Its
    dispatch lease is 1 s. The caller kills it (SIGKILL) to play a worker that died."""
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "DISPATCH_LEASE_SECONDS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-c", _HANGING_DISPATCH, operation_id],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
    )


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.1):
    """Poll a condition with a deadline (tests never sleep for a fixed long time)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@pytest.fixture
def read_drill():
    """Make the provider unreachable for reads: of one object (its id appears in the read's
    URL) or of anything (`"*"`, lists included), `times` times. Through the fault-drill
    HTTP client like every drill; disarmed after the test."""
    from payments.enums import Rail
    from payments.providers.stripe import DrillMode
    from payments.services import provider_for_rail

    provider = provider_for_rail(Rail.STRIPE)

    def arm(ref: str = "*", times: int = 1):
        provider.arm_drill(
            key_prefix=ref, step="read", mode=DrillMode.READ_UNAVAILABLE, times=times
        )

    yield arm
    provider.drill_client.disarm_all()
