"""Whole flows through real Celery worker processes: a lost answer converging on its own,
a worker SIGKILLed in the middle of sending the confirmation e-mail, and a worker whose
provider is unreachable during reconciliation (while a checkout halt is on).

Dedicated workers listen on their own Redis database so the session worker never takes
their messages; the test hands them work with a plain `send_task`.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from django.conf import settings
from django.utils import timezone
from kombu import Connection

from payments import services as pay
from payments.enums import Outcome, PurchaseStatus
from payments.models import PaymentOperation, ProviderCall, Purchase
from payments.services import DomainError
from recovery.halts import halt_set
from recovery.models import (
    CrmUpdate,
    EmailMessage,
    Order,
    OutboxCategory,
    OutboxMessage,
    RecoveryDecision,
    StepRun,
    StepState,
    WorkflowHalt,
)
from recovery.orchestrator import purchase_fulfil
from recovery.reconciler import reconcile_due
from tests.outbox import settle, wait_outbox_idle
from tests.stack import ROOT, free_port
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("worker_logs")]


def _broker(db_index: int) -> str:
    base = os.environ["CELERY_BROKER_URL"].rsplit("/", 1)[0]
    return f"{base}/{db_index}"


def _start_worker(db_index: int, **env_overrides) -> subprocess.Popen:
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": _broker(db_index),
        "REDIS_URL": _broker(db_index),
        **{k: str(v) for k, v in env_overrides.items()},
    }
    log = open(Path(os.environ.get("VERITY_STACK_DIR", "/tmp")) / f"worker-{db_index}.log", "ab")
    return subprocess.Popen(
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
            "1",
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


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _kick(db_index: int) -> None:
    # An explicit connection: Celery lets the CELERY_BROKER_URL environment variable win
    # over a constructor argument, and that names the session worker's database.
    sender = Celery()
    try:
        with Connection(_broker(db_index)) as conn:
            sender.send_task("recovery.relay_drain", connection=conn)
    finally:
        sender.close()


class _HangingSmtp:
    """Accepts connections and never answers: a mail server stuck mid-conversation."""

    def __init__(self):
        self.port = free_port()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(8)
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


def _drain_here() -> None:
    from recovery.relay import relay_drain_once

    while relay_drain_once():
        pass
    wait_outbox_idle()


def _make_steps_due(purchase_id: str) -> None:
    """A due RUN_STEPS row without an on-commit kick (the session worker must not see it)."""
    key = f"steps:{purchase_id}"
    OutboxMessage.objects.bulk_create(
        [
            OutboxMessage(
                category=OutboxCategory.RUN_STEPS, payload={"purchase": purchase_id}, dedupe_key=key
            )
        ],
        ignore_conflicts=True,
    )
    OutboxMessage.objects.filter(dedupe_key=key, processed_at__isnull=True).update(
        available_at=timezone.now(), claimed_until=None
    )


def test_lost_answer_converges_through_the_worker(
    celery_worker, new_purchase, api_client, drill, localstripe
):
    purchase = new_purchase()
    op = pay.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, "drop_response_after_send")
    assert pay.operation_dispatch(operation_id=op.id).outcome == Outcome.UNKNOWN

    PaymentOperation.objects.filter(id=op.id).update(
        next_reconcile_at=timezone.now() - timedelta(seconds=1)
    )
    reconcile_due()  # the beat job; its commit kicks the worker

    wait_for(
        lambda: Purchase.objects.get(id=purchase.id).status == PurchaseStatus.COMPLETED, timeout=30
    )
    assert PaymentOperation.objects.get(id=op.id).outcome == Outcome.SUCCEEDED
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert Order.objects.filter(purchase_id=purchase.id).count() == 1
    assert EmailMessage.objects.filter(purchase_id=purchase.id, sent_at__isnull=False).count() == 1
    wait_outbox_idle()


def test_worker_killed_mid_send_leaves_the_email_unknown_and_unsent(new_purchase, pay_now):
    purchase = new_purchase()
    halt_set(name="step:confirmation", reason="fence for the drill", actor="test")
    pay_now(purchase)
    purchase_fulfil(purchase_id=purchase.id)  # order, inventory, ledger; waits at e-mail
    _drain_here()  # whatever the session worker might take is handled now, halted
    WorkflowHalt.objects.all().delete()  # lifted without a kick: only our worker acts
    _make_steps_due(purchase.id)

    smtp = _HangingSmtp()
    sender = _start_worker(
        7,
        EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=smtp.port,
        EMAIL_TIMEOUT=120,
        OUTBOX_LEASE_SECONDS=2,
    )
    restarted = None
    try:
        _kick(7)
        wait_for(
            lambda: (
                StepRun.objects.get(purchase_id=purchase.id, step="confirmation").state
                == StepState.RUNNING
            ),
            timeout=30,
        )
        _stop(sender, signal.SIGKILL)  # dies while the mail server has the message
        claimed = OutboxMessage.objects.filter(dedupe_key=f"steps:{purchase.id}").latest("id")
        assert claimed.processed_at is None and claimed.claimed_until is not None

        restarted = _start_worker(7, STEP_LEASE_SECONDS=1)

        def settled():
            _kick(7)
            time.sleep(0.3)
            return (
                StepRun.objects.get(purchase_id=purchase.id, step="confirmation").state
                == StepState.UNKNOWN
            )

        wait_for(settled, timeout=30, interval=0.5)
    finally:
        _stop(sender, signal.SIGKILL)
        if restarted is not None:
            _stop(restarted)
        smtp.close()

    [email] = EmailMessage.objects.filter(purchase_id=purchase.id)
    assert email.sent_at is None  # never resent without review
    assert Purchase.objects.get(id=purchase.id).status == PurchaseStatus.MANUAL_REVIEW
    assert CrmUpdate.objects.filter(purchase_id=purchase.id).count() == 0
    assert Order.objects.filter(purchase_id=purchase.id).count() == 1
    assert RecoveryDecision.objects.filter(purchase_id=purchase.id, decision="manual").count() == 1


def test_provider_unreachable_during_reconcile_stays_unknown_and_halt_blocks_charges(
    new_purchase, api_client, drill, localstripe
):
    purchase, other = new_purchase(), new_purchase()
    op = pay.payment_create(
        purchase_id=purchase.id, api_client=api_client, payment_method="pm_card_visa"
    )
    drill(op, "drop_response_after_send")
    op = pay.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    halt_set(name="checkout", reason="provider incident", actor="op1")
    _drain_here()

    dead_port = free_port()  # nothing listens here
    reader = _start_worker(8, STRIPE_API_BASE=f"http://127.0.0.1:{dead_port}")
    try:
        OutboxMessage.objects.filter(dedupe_key=f"reconcile:{op.id}").update(
            available_at=timezone.now()
        )
        _kick(8)
        wait_for(
            lambda: ProviderCall.objects.filter(operation_id=op.id, purpose="reconcile").exists(),
            timeout=30,
        )
        wait_for(lambda: PaymentOperation.objects.get(id=op.id).reconcile_attempts >= 1, timeout=10)
    finally:
        _stop(reader)

    still = PaymentOperation.objects.get(id=op.id)
    assert still.outcome == Outcome.UNKNOWN  # absence of evidence is not failure
    assert still.next_reconcile_at > timezone.now()
    assert Purchase.objects.get(id=purchase.id).status == PurchaseStatus.PAYMENT_UNKNOWN
    assert not Order.objects.filter(purchase_id=purchase.id).exists()

    # The halt refuses a new charge, while reconciliation still settles the unknown one.
    with pytest.raises(DomainError) as refused:
        pay.payment_create(
            purchase_id=other.id, api_client=api_client, payment_method="pm_card_visa"
        )
    assert refused.value.code == "workflow_halted"
    assert pay.operation_reconcile(operation_id=op.id).outcome == Outcome.SUCCEEDED
    settle()
    assert Purchase.objects.get(id=purchase.id).status == PurchaseStatus.COMPLETED
    assert len(localstripe.succeeded_charges_for(purchase.id)) == 1
    assert localstripe.payment_intents_for(other.id) == []


def test_mail_server_down_the_email_is_retried_and_sent_once(new_purchase, pay_now):
    purchase = new_purchase()
    halt_set(name="step:confirmation", reason="fence for the drill", actor="test")
    pay_now(purchase)
    purchase_fulfil(purchase_id=purchase.id)
    _drain_here()
    WorkflowHalt.objects.all().delete()
    _make_steps_due(purchase.id)
    log = Path(os.environ.get("VERITY_STACK_DIR", "/tmp")) / "worker-9.log"

    refused = _start_worker(
        9,
        EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=free_port(),
    )  # nothing listens
    try:
        _kick(9)
        wait_for(
            lambda: (
                StepRun.objects.get(purchase_id=purchase.id, step="confirmation").state
                == StepState.FAILED
            ),
            timeout=30,
        )
    finally:
        _stop(refused)
    failed = StepRun.objects.get(purchase_id=purchase.id, step="confirmation")
    assert "ConnectionRefused" in failed.last_error and failed.attempts == 1
    message = OutboxMessage.objects.filter(dedupe_key=f"steps:{purchase.id}").latest("id")
    assert message.processed_at is None and message.available_at > message.created_at

    # The console backend (its output is the worker log, read below) is development-only:
    # DEBUG on, or Verity refuses to start with it (config/settings/security.py).
    working = _start_worker(
        9, EMAIL_BACKEND="django.core.mail.backends.console.EmailBackend", DEBUG="true"
    )  # the mail server is back
    try:

        def sent():
            _kick(9)
            time.sleep(0.3)
            return Purchase.objects.get(id=purchase.id).status == PurchaseStatus.COMPLETED

        wait_for(sent, timeout=30, interval=0.5)
        wait_outbox_idle()
    finally:
        _stop(working)

    [email] = EmailMessage.objects.filter(purchase_id=purchase.id)
    assert email.sent_at is not None
    assert StepRun.objects.get(purchase_id=purchase.id, step="confirmation").attempts == 2
    subject = f"Subject: {email.subject}"
    assert log.read_text(errors="replace").count(subject) == 1  # sent once
