"""A worker that dies mid-dispatch: a child interpreter whose confirm is sent and whose
answer never comes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

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
