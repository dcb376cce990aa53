"""Recovery fixtures: real purchases and payments through the payments core."""

import pytest


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
