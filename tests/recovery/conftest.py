"""Recovery fixtures: real purchases and payments through the payments core."""

import threading

import pytest
from django.db import connection


def run_concurrently(fn, n: int) -> list:
    """Run fn() in n threads released together; each thread closes its DB connection."""
    barrier = threading.Barrier(n)
    results, errors = [], []

    def target():
        try:
            barrier.wait(10)
            results.append(fn())
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=target) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


def wait_outbox_idle(timeout: float = 30.0) -> None:
    """Wait until no due message is unprocessed or claimed: a worker still writing while
    the test database is flushed deadlocks the TRUNCATE."""
    from django.utils import timezone

    from recovery.models import OutboxMessage
    from tests.conftest import wait_for

    wait_for(
        lambda: (
            not OutboxMessage.objects.filter(
                processed_at__isnull=True, available_at__lte=timezone.now(), attempts__lt=3
            ).exists()
        ),
        timeout=timeout,
    )


@pytest.fixture
def worker_logs():
    """Prints the tail of every worker log at teardown (shown when a test fails)."""
    import os
    from pathlib import Path

    yield
    stack = Path(os.environ.get("VERITY_STACK_DIR", "/tmp"))
    for log in sorted(stack.glob("worker*.log")):
        keep = ("Task ", "ERROR", "Error", "ready")
        lines = [
            line
            for line in log.read_text(errors="replace").splitlines()
            if any(k in line for k in keep)
        ][-60:]
        print(f"--- {log.name}\n" + "\n".join(lines))


def settle(timeout: float = 30.0) -> None:
    """Bring the outbox to rest: drain what is due here, and wait for messages another
    worker (the session `celery_worker`, if one is running) has claimed to finish.

    Tests assert final states after settle(): whichever process handled a message, the
    result must be the same — that is the point of the outbox.
    """
    import time

    from django.db.models import Q
    from django.utils import timezone

    from recovery.models import OutboxMessage
    from recovery.relay import relay_drain_once

    deadline = time.monotonic() + timeout
    while True:
        while relay_drain_once():
            pass
        now = timezone.now()
        busy = (
            OutboxMessage.objects.filter(processed_at__isnull=True)
            .filter(Q(available_at__lte=now, attempts__lt=5) | Q(claimed_until__gt=now))
            .exists()
        )
        if not busy:
            return
        if time.monotonic() > deadline:
            raise AssertionError("outbox did not come to rest")
        time.sleep(0.05)


def lift_halt_quietly(name: str) -> None:
    """Remove a halt used as a test fence without halt_clear's RUN_STEPS kick, so only
    the test itself resumes the purchase."""
    from recovery.models import WorkflowHalt

    WorkflowHalt.objects.filter(name=name).delete()


@pytest.fixture(autouse=True)
def _no_claims_at_teardown(request, transactional_db):
    """A worker still writing while the database is flushed deadlocks the TRUNCATE:
    wait (briefly) until no claimed message is being handled. A test marked
    `claims_left_by_the_test` writes a live claim no one handles: nothing to wait for."""
    import time

    yield
    if request.node.get_closest_marker("claims_left_by_the_test"):
        return
    from django.utils import timezone

    from recovery.models import OutboxMessage

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not OutboxMessage.objects.filter(
            processed_at__isnull=True, claimed_until__gt=timezone.now()
        ).exists():
            return
        time.sleep(0.05)
