"""Invariants 1 and 2 under concurrency and a dead worker."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection, connections

from payments import services
from payments.enums import Outcome
from payments.models import PaymentOperation, ProviderCall
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


def test_fifty_concurrent_attempts_make_exactly_one_charge(new_purchase, api_client,
                                                           localstripe):
    purchase = new_purchase()
    results, barrier = [], threading.Barrier(50)

    def attempt(i):
        try:
            barrier.wait()
            amount = None if i % 5 else purchase.amount + i  # some vary the amount
            op = services.payment_create(purchase_id=purchase.id, api_client=api_client,
                                         payment_method="pm_card_visa", amount=amount)
            results.append(services.operation_dispatch(operation_id=op.id).outcome)
        except services.DomainError as exc:
            results.append(exc.code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 50
    assert results.count(Outcome.SUCCEEDED) == 1
    assert set(results) <= {Outcome.SUCCEEDED, "payment_unresolved", "already_paid",
                            "amount_mismatch"}
    assert len(localstripe.payment_intents_for(purchase.id)) == 1
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert PaymentOperation.objects.filter(purchase=purchase).count() == 1


CHILD = textwrap.dedent("""
    import django, os, sys
    django.setup()
    from payments import services
    from payments.enums import Rail
    from payments.services import provider_for_rail
    from payments.models import PaymentOperation
    op = PaymentOperation.objects.get(id=sys.argv[1])
    provider_for_rail(Rail.STRIPE).arm_drill(key_prefix=op.idempotency_key, step="confirm",
                                             mode="hang_after_send")
    services.operation_dispatch(operation_id=op.id)
""")


@pytest.mark.alone  # a child interpreter must charge within 30 s (make test runs xdist workers)
def test_worker_killed_after_send_leaves_unknown_then_reconciled(new_purchase, api_client,
                                                                 localstripe, settings):
    purchase = new_purchase()
    op = services.payment_create(purchase_id=purchase.id, api_client=api_client,
                                 payment_method="pm_card_visa")
    db = settings.DATABASES["default"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "DISPATCH_LEASE_SECONDS": "1"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, op.id], cwd=ROOT, env=env)
    try:
        wait_for(lambda: localstripe.succeeded_charges_for(purchase.id), timeout=30)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    op = PaymentOperation.objects.get(id=op.id)
    assert op.outcome == Outcome.DISPATCHING and op.confirm_claimed_at is not None

    wait_for(lambda: services.operations_sweep_dead_dispatches() or
             PaymentOperation.objects.get(id=op.id).outcome != Outcome.DISPATCHING, timeout=10)
    assert PaymentOperation.objects.get(id=op.id).outcome == Outcome.UNKNOWN
    services.operation_dispatch(operation_id=op.id)  # never dispatched again
    assert ProviderCall.objects.filter(operation_id=op.id, purpose="dispatch",
                                       step="confirm").count() == 1
    op = services.operation_reconcile(operation_id=op.id)
    assert op.outcome == Outcome.SUCCEEDED and op.verification == "provider"
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
