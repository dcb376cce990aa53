"""Fixtures every test folder shares, defined once (loaded by tests/conftest.py as a
pytest plugin). A folder's conftest.py keeps only what is its own; a fixture that means
something else somewhere gets a name of its own there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
from django.conf import settings

from tests.localstripe import Localstripe, one_call_off, one_call_on
from tests.waiting import wait_for

if TYPE_CHECKING:
    from django.contrib.auth.models import User

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    # PBKDF2 at production cost makes every test user take ~0.3 s to create; no test
    # measures the hasher (tests/security checks the shipped setting itself).
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def client_and_key(db):
    """A storefront's API client and its key, with room for any test's purchases."""
    from tests.factories import make_client

    return make_client(limit=10_000_000)


@pytest.fixture
def api_client(client_and_key):
    return client_and_key[0]


@pytest.fixture
def api(client_and_key):
    """DRF's test client speaking as `api_client` (its Api-Key header set)."""
    from rest_framework.test import APIClient

    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Api-Key {client_and_key[1]}")
    return http


@pytest.fixture
def new_purchase(api_client):
    """Factory: a purchase for a fresh customer through the real services (quote, then
    purchase); product fields (stock, kind, step_policy, name) pass to the product."""
    from payments import services
    from tests.factories import ProductFactory

    counter = {"n": 0}

    def make(price=1500, quantity=1, customer=None, email="buyer@example.com", **product_fields):
        counter["n"] += 1
        product_fields.setdefault("name", f"Lamp {counter['n']}")
        product = ProductFactory(price=price, **product_fields)
        quote = services.quote_create(
            api_client=api_client,
            items=[{"sku": product.sku, "quantity": quantity}],
            currency="usd",
        )
        return services.purchase_create(
            api_client=api_client,
            quote_id=quote.id,
            quote_version=quote.version,
            customer_reference=customer or f"cust-{counter['n']}-{quote.id[-6:]}",
            customer_email=email,
        )

    return make


@pytest.fixture
def pay_now(api_client):
    """Create and dispatch a payment (a real provider call at localstripe)."""
    from payments import services

    def run(purchase, method="pm_card_visa", capture="automatic"):
        op = services.payment_create(
            purchase_id=purchase.pk,
            api_client=api_client,
            payment_method=method,
            capture_method=capture,
        )
        return services.operation_dispatch(operation_id=op.pk)

    return run


def _send_at_once(sends: list[Callable[[], Any]]) -> list[Any]:
    answers: list[Any] = [None] * len(sends)
    barrier = threading.Barrier(len(sends))

    def run(i: int, send: Callable[[], Any]) -> None:
        from django.db import connection

        try:
            barrier.wait(10)
            answers[i] = send()
        except Exception as exc:  # noqa: BLE001
            answers[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, s)) for i, s in enumerate(sends)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers


@pytest.fixture
def send_at_once():
    """Races requests: `send_at_once(sends)` runs each callable in a thread of its own,
    all released together by one barrier, each thread closing its own database connection
    (a live server or the test client answers each on a connection of its own). Returns
    the answers in the order of `sends`, an exception in place of an answer that raised."""
    return _send_at_once


class HeldPurchase:
    """A purchase row locked (FOR UPDATE) by a transaction in a thread of its own, as a
    concurrent request holding it would: `hold(id)`, then `wait_for_a_waiter()` once a
    request was started, then `release()`."""

    def __init__(self) -> None:
        self._release = threading.Event()
        self._holder: threading.Thread | None = None

    def hold(self, purchase_id: str) -> None:
        from django.db import connection, transaction

        locked = threading.Event()

        def run() -> None:
            try:
                with transaction.atomic():
                    with connection.cursor() as cursor:
                        cursor.execute(
                            "SELECT id FROM payments_purchase WHERE id = %s FOR UPDATE",
                            [purchase_id],
                        )
                    locked.set()
                    self._release.wait(20)
            finally:
                connection.close()

        self._holder = threading.Thread(target=run)
        self._holder.start()
        assert locked.wait(10), "the purchase was never locked"

    def wait_for_a_waiter(self, what: str = "the request") -> None:
        """Returns once a statement on the purchases waits for a lock (PostgreSQL's own
        view of its sessions)."""
        import time

        from django.db import connection

        deadline = time.monotonic() + 10
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query ILIKE '%%payments_purchase%%'"
                )
                if cursor.fetchone()[0] > 0:
                    return
            assert time.monotonic() < deadline, f"{what} never waited on the purchase"
            time.sleep(0.02)

    def release(self) -> None:
        self._release.set()
        if self._holder is not None:
            self._holder.join(20)


@pytest.fixture
def held_purchase():
    """Locks a purchase as a concurrent request would (HeldPurchase); released at the end
    of the test if the test did not."""
    held = HeldPurchase()
    yield held
    held.release()


SQLITE_FILE = "verity.sqlite3"


def _migrations_digest() -> str:
    """What the migrated schema depends on: every migration file's name and content."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(ROOT.glob("*/migrations/*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _sqlite_copy(source: Path, target: Path) -> None:
    """SQLite's own backup (the WAL's pages included, whatever was checkpointed)."""
    import sqlite3

    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()


class EmbeddedSqlite:
    """`manage.py` on a fresh SQLite file under a temporary var/, as `make run` uses it:
    the test process's environment less the test stack's database, broker and stack
    variables. Set more variables in `env` before the first `shell`, which migrates.

    The first test of a run migrates a fresh file with `manage.py migrate` (asserted to
    succeed) into a template shared by the xdist workers (`template_dir`, under a lock);
    the others start from a copy of it, the schema the same migrations made (about 8 s of
    CPU saved per test)."""

    STACK_VARIABLES = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "VERITY_STACK_DIR")

    def __init__(self, var: Path, template_dir: Path | None = None) -> None:
        self.var = var
        self.template_dir = template_dir
        self.env = {k: v for k, v in os.environ.items() if k not in self.STACK_VARIABLES}
        self.env["VERITY_VAR_DIR"] = str(var)
        self._migrated = False

    def _migrate(self) -> None:
        if self.template_dir is None:
            self._migrate_here()
            return
        import fcntl

        self.template_dir.mkdir(parents=True, exist_ok=True)
        template = self.template_dir / f"{_migrations_digest()}.sqlite3"
        with open(self.template_dir / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not template.exists():
                self._migrate_here()
                _sqlite_copy(self.var / SQLITE_FILE, template)
                return
        self.var.mkdir(parents=True, exist_ok=True)
        _sqlite_copy(template, self.var / SQLITE_FILE)

    def _migrate_here(self) -> None:
        migrate = self._manage("migrate", "--noinput", "-v", "0", timeout=300)
        assert migrate.returncode == 0, migrate.stderr[-3000:]

    def _manage(self, *args: str, timeout: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def shell(self, script: str) -> str:
        """Runs `script` with `manage.py shell -c`; its standard output (it must exit 0)."""
        if not self._migrated:
            self._migrate()
            self._migrated = True
        done = self._manage("shell", "-c", script, timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done.stdout


@pytest.fixture
def embedded_sqlite(tmp_path, tmp_path_factory) -> EmbeddedSqlite:
    """Verity on the embedded default database (SQLite) in a subprocess: the suite's own
    database is PostgreSQL. The migrated template lives in the run's temporary root, which
    the xdist workers share (each worker's own root is under it)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if base.name.startswith("popen-gw") else base
    return EmbeddedSqlite(tmp_path / "var", template_dir=shared / "sqlite-template")


class People(NamedTuple):
    resolver: object  # settles an operation by hand
    requester: object  # asks for a refund (support)
    approver: object  # approves it (finance): never the requester


@pytest.fixture
def people(django_user_model) -> People:
    return People(
        *(
            django_user_model.objects.create(username=name)
            for name in ("resolver", "support-requester", "finance-approver")
        )
    )


@pytest.fixture
def resolver(people):
    """The person who settles an operation by hand."""
    return people.resolver


@pytest.fixture
def shop(db):
    """A storefront speaking HTTP to the test client: it pays and may request refunds."""
    from tests.api.client import Api
    from tests.factories import make_client

    client, key = make_client(name="shop", limit=10_000_000)
    return Api(key, client)


@pytest.fixture(scope="module")
def chromium():
    """Debian's Chromium, headless, driven over the DevTools protocol (tests/browser/cdp.py).
    Not skipped when missing: .ci/run installs it, and a browser test that can skip
    cannot fail."""
    from tests.browser import cdp

    browser = cdp.Browser()
    yield browser
    browser.quit()


@pytest.fixture
def browser(chromium):
    """The module's Chromium, signed out (cookies cleared) and with no events left over."""
    chromium.call("Network.clearBrowserCookies")
    chromium.events.clear()
    return chromium


@pytest.fixture
def product(db):
    """A product with stock for any test's purchases."""
    from tests.factories import ProductFactory

    return ProductFactory(price=2500, stock=1000)


@pytest.fixture
def storefront(db):
    """A storefront with every API scope and an automatic-refund allowance, speaking HTTP
    to the test client; its outbox is drained after the test."""
    from tests.api.client import ALL_SCOPES, Api
    from tests.factories import make_client
    from tests.outbox import settle_outbox

    client, key = make_client(
        scopes=ALL_SCOPES, limit=10_000_000, name="storefront", auto_refund_limit=100_000
    )
    yield Api(key, client)
    settle_outbox()


@pytest.fixture
def fast_settings(settings):
    """The API's fast path on, and a verified key kept for the test."""
    settings.API_CLIENT_CACHE_SECONDS = 60  # the key stays verified through one test
    settings.API_FAST_PATH = True
    return settings


@pytest.fixture
def auto_refund_shop(db):
    """A storefront key with an automatic-refund allowance (no person approves)."""
    from tests.api.client import Api
    from tests.factories import make_client

    client, key = make_client(
        name="storefront-auto-refunds", limit=10_000_000, auto_refund_limit=10_000_000
    )
    return Api(key, client)


# -- the provider (localstripe), its fault drills, and a real Celery worker ----------------


@pytest.fixture
def localstripe() -> Localstripe:
    return Localstripe(settings.STRIPE_API_BASE, settings.STRIPE_API_KEY)


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


# -- the console's people (support app roles) ---------------------------------------------


@pytest.fixture
def roles(db):
    from support.access import ensure_groups

    ensure_groups()


def _user(username: str, *role_names: str) -> User:
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user(username=username, password="pw-" + username)
    for name in role_names:
        user.groups.add(Group.objects.get(name=name))
    return user


@pytest.fixture
def users(roles) -> dict[str, User]:
    from support.access import Role

    return {
        "nobody": _user("nobody"),
        "support": _user("sam", Role.SUPPORT),
        "operator": _user("olga", Role.OPERATOR),
        "operator2": _user("omar", Role.OPERATOR),
        "finance": _user("fred", Role.FINANCE),
        "finance2": _user("fiona", Role.FINANCE),
    }


@pytest.fixture
def login(client, users):
    """login("operator") -> the test client signed in as that role's user."""

    def as_role(role: str | None):
        client.logout()
        if role is not None:
            client.force_login(users[role])
        return client

    return as_role


# -- ACP's buyer: an agent platform and what it buys --------------------------------------


@pytest.fixture
def platform(transactional_db):
    """The agent platform's Verity API client: the `acp` scope only."""
    from tests.factories import make_client

    return make_client(scopes=("acp",), limit=10_000_000, name="agent-platform")


@pytest.fixture
def acp_agent(live_server, platform):
    """The agent platform speaking ACP over real HTTP to the live server (tests/acp calls
    it `agent`; tests/x402's `agent` is a storefront API client)."""
    from tests.acp.agent import AcpAgent

    return AcpAgent(live_server.url, platform[1])


@pytest.fixture
def tea(transactional_db):
    """A product an agent buys over ACP."""
    import uuid

    from tests.factories import ProductFactory

    return ProductFactory(sku=f"TEA-{uuid.uuid4().hex[:6]}", price=1250, stock=100)


# -- provider webhooks ---------------------------------------------------------------------


@pytest.fixture
def webhook_secrets(settings):
    """The endpoint verifies signatures with the current and the previous secret
    (tests/webhooks/events.py signs with them); autouse in tests/webhooks."""
    from tests.webhooks.events import OLD_SECRET, SECRET

    settings.STRIPE_WEBHOOK_SECRETS = [SECRET, OLD_SECRET]
    settings.STRIPE_WEBHOOK_TOLERANCE = 300
    settings.STRIPE_ACCOUNT = ""
    return settings.STRIPE_WEBHOOK_SECRETS
