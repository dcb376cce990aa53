"""Webhook test fixtures: every test verifies with the shared signing secrets, and builds
operations to match events against. The events themselves, signed ourselves, are built
by tests/webhooks/events.py."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _webhook_secrets(webhook_secrets):
    """Every webhook test: the endpoint knows the secrets events are signed with."""
    return webhook_secrets


# -- real operations through the payments services -----------------------------------


@pytest.fixture
def pay(api_client, drill):
    """pay(purchase, drop_response=False, method=..., capture=...) -> dispatched operation.
    With drop_response the provider really applies the confirm but the answer is lost:
    the operation is `unknown` and only evidence (a webhook, a read-back) can settle it."""
    from payments import services

    def run(purchase, *, drop_response=False, method="pm_card_visa", capture="automatic"):
        op = services.payment_create(
            purchase_id=purchase.id,
            api_client=api_client,
            payment_method=method,
            capture_method=capture,
        )
        if drop_response:
            drill(op, "drop_response_after_send", step="confirm")
        return services.operation_dispatch(operation_id=op.id)

    return run


# -- a relay worker of another test may be alive (the celery_worker fixture is
# session-scoped): let it finish before the test database is flushed, or its writes
# deadlock the TRUNCATE.


def _celery_worker_alive() -> bool:
    import os
    from pathlib import Path

    me = str(os.getpid())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[1] != me:
                continue
            if b"celery" in (proc / "cmdline").read_bytes():
                return True
        except (OSError, IndexError):
            continue
    return False


@pytest.fixture(autouse=True)
def _quiet_worker_before_flush(request):
    yield
    marker = request.node.get_closest_marker("django_db")
    if not (marker and marker.kwargs.get("transaction")) or not _celery_worker_alive():
        return
    from django.utils import timezone

    from recovery.models import OutboxMessage
    from tests.waiting import wait_for

    def idle():
        now = timezone.now()
        return not OutboxMessage.objects.filter(
            processed_at__isnull=True, available_at__lte=now, attempts__lt=3
        ).exists()

    try:
        wait_for(idle, timeout=15)
    except AssertionError:
        pass  # a message that keeps failing: the flush may still succeed
