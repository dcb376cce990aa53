"""The reconcile sweep applies many purchases' read-backs in one change batch (one view per
purchase, numbers taken in one statement) while the provider's webhooks for the same
payments are applied at once from other connections, in both payment modes. Each payment
settles once; each purchase's events are gapless, in commit order, with views it really
had; no fan-out message names a missing event. Counted at localstripe over plain HTTP."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from payments import services
from payments.enums import CallStep, Outcome
from payments.models import OperationTransition, PaymentOperation
from payments.providers.stripe import DrillMode
from recovery.sweep import reconcile_sweep
from tests.localstripe import provider_object
from tests.outbox import settle_outbox
from tests.payments.one_call_helpers import provider_count, start
from tests.webhooks.events import event_for, post

from .event_judge import event_rows, orphan_fanout, violations

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_set_based_sweep"


@pytest.fixture(params=["two_step", "one_call"])
def pay_mode(request, localstripe, settings):
    from tests.localstripe import one_call_off, one_call_on

    if request.param == "one_call":
        one_call_on(localstripe, settings)
        yield request.param
        one_call_off(localstripe)
    else:
        one_call_off(localstripe)
        yield request.param


def test_sweep_and_webhooks_together_number_events_once(
    pay_mode, new_purchase, api_client, drill, read_drill, localstripe, client, settings
):
    settings.STRIPE_WEBHOOK_SECRETS = [SECRET]
    settings.STRIPE_ACCOUNT = ""
    step = CallStep.PAY if pay_mode == "one_call" else "confirm"
    lost = []
    for _ in range(5):
        purchase = new_purchase()
        op = start(purchase, api_client)
        drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=step, times=2)
        read_drill(times=1)
        op = services.operation_dispatch(operation_id=op.id)
        assert op.outcome == Outcome.UNKNOWN, op.outcome
        lost.append((purchase, op))
    events = []
    for purchase, _ in lost:
        for pi in localstripe.payment_intents_for(purchase.id):
            obj = provider_object("payment_intents", pi["id"])
            if obj["status"] == "succeeded":
                events.append(event_for(obj, "payment_intent.succeeded"))
    errors: list = []

    def run(fn):
        try:
            fn()
        except services.DomainError:
            pass
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    def webhooks():
        from django.test import Client

        c = Client()
        for e in events:
            assert post(c, e, secret=SECRET).status_code == 200
        settle_outbox()

    threads = [
        threading.Thread(
            target=run, args=(lambda: reconcile_sweep(operation_ids=[o.id for _, o in lost]),)
        ),
        threading.Thread(target=run, args=(webhooks,)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [], errors
    settle_outbox()
    for purchase, op in lost:
        op = PaymentOperation.objects.get(id=op.id)
        if op.outcome != Outcome.SUCCEEDED:
            op = services.operation_reconcile(operation_id=op.id)
        assert op.outcome == Outcome.SUCCEEDED, op.outcome
        assert provider_count(localstripe, purchase) == (1, 1, 1)
        assert (
            OperationTransition.objects.filter(
                operation=op, field="outcome", target=Outcome.SUCCEEDED
            ).count()
            == 1
        )
        kinds = [e[2] for e in event_rows(purchase.id)]
        assert kinds.count("payment.resolved") + kinds.count("payment.succeeded") == 1, kinds
        assert violations(purchase.id) == [], (purchase.id, violations(purchase.id))
    assert orphan_fanout() == []
