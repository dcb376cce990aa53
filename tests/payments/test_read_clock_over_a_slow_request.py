"""The read-back by metadata says "none" only while the provider's clock agrees with the
database's closely enough that the read's window (the operation's creation and its sends'
stamps, each widened by the clock margin) holds every object the provider made for it.
The provider's `Date` is measured against the list request's own span; a slow request
leaves the clocks' distance uncertain by that span, and "none" must hold for the worst of
it. Counted at localstripe; faults only through the fault-drill HTTP client."""

from datetime import timedelta

import pytest
from django.db.models import F

from payments import services
from payments.enums import CallStep, Outcome, Rail
from payments.models import PaymentOperation, ProviderCall
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail
from tests.payments.test_create_answer_lost import _intents_of, _start
from tests.payments.test_persons_failed_refund_then_follow_up import _paid, _refund

pytestmark = pytest.mark.django_db(transaction=True)


def _stamped_ahead(op: PaymentOperation, seconds: int) -> None:
    """The operation's stamps that bound its read (its creation, its sends) as a database
    clock `seconds` ahead of the provider's would have written them (localstripe stamps
    its objects with the machine's clock)."""
    PaymentOperation.objects.filter(pk=op.pk).update(
        created_at=F("created_at") + timedelta(seconds=seconds)
    )
    calls = ProviderCall.objects.filter(operation_id=op.id, purpose__in=("dispatch", "replay"))
    calls.update(started_at=F("started_at") + timedelta(seconds=seconds))
    calls.exclude(finished_at=None).update(
        finished_at=F("finished_at") + timedelta(seconds=seconds)
    )


def _read_slowly_behind(localstripe, monkeypatch, read, *, seconds: int):
    """`read()` while the provider's clock runs `seconds` behind the database's and the
    list request takes as long to reach it (its `Date` lands inside the request's span)."""
    monkeypatch.setattr(DrillMode, "SLOW_READ_SECONDS", float(seconds))
    provider_for_rail(Rail.STRIPE).arm_drill(
        key_prefix="*", step="read", mode=DrillMode.READ_SLOW, times=1
    )
    localstripe.clock_offset(-seconds)
    try:
        return read()
    finally:
        localstripe.clock_offset(0)


def _reconcile(op_id: str, path: str) -> PaymentOperation:
    if path == "sweep":
        from recovery.sweep import reconcile_sweep

        swept = reconcile_sweep(operation_ids=[op_id], concurrency=2)
        assert swept.failed == 0
    else:
        services.operation_reconcile(operation_id=op_id)
    return PaymentOperation.objects.get(pk=op_id)


def _refund_answer_lost(new_purchase, api_client, drill, people, localstripe):
    """A paid purchase's refund the provider made, its answer lost: (refund, the refund
    at the provider, the payment)."""
    _resolver, requester, approver = people
    purchase, pay = _paid(new_purchase, api_client)
    refund = _refund(purchase, requester, approver)
    drill(refund, DrillMode.DROP_RESPONSE_AFTER_SEND, step="refund")
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.UNKNOWN
    [made] = localstripe.refunds_for(pay.provider_reference)
    return refund, made, pay


def test_a_slow_read_does_not_hide_a_provider_clock_past_the_margin(
    new_purchase, api_client, drill, read_drill, localstripe, settings, monkeypatch
):
    """The provider's clock runs 10 s behind the database's, past the 4 s margin: the
    PaymentIntent a lost create answer made is stamped before the read's lower bound. The
    list request takes 10 s to reach the provider, so its `Date` lands inside the
    request's span and, measured against the nearest end of it, the clocks look agreed.
    They may as well be 10 s apart: the read's "none" is "not read", and the payment stays
    unknown beside its PaymentIntent, never failed."""
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 4
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)
    read_drill("*")  # the read right after cannot read the provider
    op = services.operation_dispatch(operation_id=op.id)
    [made] = _intents_of(localstripe, op)
    assert op.outcome == Outcome.UNKNOWN
    _stamped_ahead(op, 10)
    monkeypatch.setattr(DrillMode, "SLOW_READ_SECONDS", 10.0)
    provider_for_rail(Rail.STRIPE).arm_drill(
        key_prefix="*", step="read", mode=DrillMode.READ_SLOW, times=1
    )
    localstripe.clock_offset(-10)
    try:
        op = services.operation_reconcile(operation_id=op.id)
    finally:
        localstripe.clock_offset(0)

    read = ProviderCall.objects.filter(operation_id=op.id, step="list").latest("started_at")
    assert (read.classification, read.safe_fields.get("detail")) == (
        "unknown",
        "provider_clock_skew",
    )
    assert op.outcome == Outcome.UNKNOWN
    [pi] = _intents_of(localstripe, op)
    assert (pi["id"], pi["status"]) == (made["id"], made["status"])


@pytest.mark.parametrize("path", ["single", "sweep"])
def test_a_slow_read_of_a_lost_refund_is_no_verdict_when_the_clocks_may_be_apart(
    new_purchase, api_client, drill, people, localstripe, settings, monkeypatch, path
):
    """As above for a refund the provider made, its answer lost, read back alone or by the
    sweep (on its threads, with the batch's bounds and the database's clock): the read's
    "none" would settle the refund failed ("no money moved") and let it be asked again.
    It stays unknown, and the provider holds the one refund."""
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 4
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    refund, made, pay = _refund_answer_lost(new_purchase, api_client, drill, people, localstripe)
    _stamped_ahead(refund, 10)

    refund = _read_slowly_behind(
        localstripe, monkeypatch, lambda: _reconcile(refund.id, path), seconds=10
    )

    read = ProviderCall.objects.filter(operation_id=refund.id, step="list").latest("started_at")
    assert (read.classification, read.safe_fields.get("detail")) == (
        "unknown",
        "provider_clock_skew",
    )
    assert (refund.outcome, refund.provider_reference) == (Outcome.UNKNOWN, "")
    assert [r["id"] for r in localstripe.refunds_for(pay.provider_reference)] == [made["id"]]


def test_the_sweep_reads_a_slow_read_of_a_lost_payment_as_no_verdict(
    new_purchase, api_client, drill, read_drill, localstripe, settings, monkeypatch
):
    """The first case read by the sweep: the payment stays unknown beside its
    PaymentIntent, which nobody cancelled or charged."""
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 4
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)
    read_drill("*")  # the read right after cannot read the provider
    op = services.operation_dispatch(operation_id=op.id)
    [made] = _intents_of(localstripe, op)
    _stamped_ahead(op, 10)

    op = _read_slowly_behind(
        localstripe, monkeypatch, lambda: _reconcile(op.id, "sweep"), seconds=10
    )

    read = ProviderCall.objects.filter(operation_id=op.id, step="list").latest("started_at")
    assert read.classification == "unknown"
    assert op.outcome == Outcome.UNKNOWN
    [pi] = _intents_of(localstripe, op)
    assert (pi["id"], pi["status"]) == (made["id"], made["status"])


def _db_clock_past(call: ProviderCall) -> None:
    """Wait until the database's clock is past the send's answer: the read's window then
    closes at that answer (its upper bound is set)."""
    from django.db.models.functions import Now

    for _ in range(200):
        if ProviderCall.objects.filter(pk=call.pk, finished_at__lt=Now()).exists():
            return
    raise AssertionError("the database's clock did not pass the answer")


def test_a_refund_made_in_the_second_its_window_closes_is_found(
    new_purchase, api_client, drill, people, localstripe, settings
):
    """No margin and no in-flight window: the read lists only the whole seconds from the
    refund's creation to its lost answer, both edges stamped by the database, the
    provider's `created` by a clock that agrees. The refund the provider made in those
    seconds (the edges included) is found and settled succeeded, never "none"."""
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 0
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    refund, made, pay = _refund_answer_lost(new_purchase, api_client, drill, people, localstripe)
    send = ProviderCall.objects.get(operation_id=refund.id, purpose="dispatch", step="refund")
    assert send.finished_at is not None
    _db_clock_past(send)

    refund = services.operation_reconcile(operation_id=refund.id)

    assert (refund.outcome, refund.provider_reference) == (Outcome.SUCCEEDED, made["id"])
    assert len(localstripe.refunds_for(pay.provider_reference)) == 1


def test_a_slow_read_of_a_charged_one_call_payment_is_no_verdict(
    new_purchase, api_client, drill, read_drill, one_call, settings, monkeypatch
):
    """A one-call payment (create with confirm=true) the provider charged, its answer
    lost, its key's window closed for a re-send (so it is read back, not asked again): a
    "none" would settle it failed while the buyer was charged. Read slowly with the
    provider's clock past the margin, it stays unknown beside the one charge."""
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 4
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    settings.STRIPE_RESEND_MARGIN_SECONDS = settings.STRIPE_IDEMPOTENCY_WINDOW_SECONDS
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.PAY)
    read_drill("*")  # the read right after cannot read the provider
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    assert len(one_call.succeeded_charges_for(purchase.id)) == 1
    _stamped_ahead(op, 10)

    op = _read_slowly_behind(one_call, monkeypatch, lambda: _reconcile(op.id, "single"), seconds=10)

    read = ProviderCall.objects.filter(operation_id=op.id, step="list").latest("started_at")
    assert (read.classification, read.safe_fields.get("detail")) == (
        "unknown",
        "provider_clock_skew",
    )
    assert op.outcome == Outcome.UNKNOWN
    assert len(one_call.succeeded_charges_for(purchase.id)) == 1


@pytest.mark.xfail(
    strict=True,
    reason="below 4 s the clock check's 2 s floor lets through a skew the window, "
    "widened by the margin alone, cannot hold: a deployment cannot set it (refused at "
    "start, tests/security/test_startup_refusals.py); the tests that read whole seconds "
    "run at margin 0 through settings",
)
def test_a_margin_below_the_checks_floor_says_no_none_for_a_made_payment(
    new_purchase, api_client, drill, read_drill, localstripe, settings
):
    """A margin of 0 (a setting), the provider's clock 2 s behind the database's: the
    check, floored at 2 s, lets the clocks pass as agreeing, but the window has no slack
    and the PaymentIntent a lost create answer made is stamped before its lower bound.
    The read must not say "none" beside it."""
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 0
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)
    read_drill("*")  # the read right after cannot read the provider
    op = services.operation_dispatch(operation_id=op.id)
    [made] = _intents_of(localstripe, op)
    _stamped_ahead(op, 2)
    localstripe.clock_offset(-2)
    try:
        op = services.operation_reconcile(operation_id=op.id)
    finally:
        localstripe.clock_offset(0)

    read = ProviderCall.objects.filter(operation_id=op.id, step="list").latest("started_at")
    assert read.classification != "not_found"
    assert op.outcome == Outcome.UNKNOWN
    [pi] = _intents_of(localstripe, op)
    assert (pi["id"], pi["status"]) == (made["id"], made["status"])


SQLITE_STAMPS = r"""
from datetime import timezone as tz
from django.db import connection
from django.db.models.functions import Now
from payments import services
from payments.enums import Classification
from payments.providers.base import CallResult
from payments.enums import CallPurpose, CallStep
from payments.models import PaymentOperation, ProviderCall
from payments.services.common import _record_call
from payments.services.reconcile import _last_send_age, _made_until_of
from tests.factories import ProductFactory, make_client

assert connection.vendor == "sqlite", connection.vendor
client, _key = make_client(name="sqlite-shop")
product = ProductFactory(price=1500)
quote = services.quote_create(
    api_client=client, items=[{"sku": product.sku, "quantity": 1}], currency="usd"
)
purchase = services.purchase_create(
    api_client=client, quote_id=quote.id, quote_version=quote.version,
    customer_reference="cust-sqlite", customer_email="buyer@example.com",
)
op = services.payment_create(
    purchase_id=purchase.id, api_client=client, payment_method="pm_card_visa"
)
op = PaymentOperation.objects.get(pk=op.pk)
assert op.created_at.tzinfo is not None and op.created_at.microsecond % 1000 == 0, op.created_at
[(_id, db_now)] = PaymentOperation.objects.filter(pk=op.pk).annotate(n=Now()).values_list("id", "n")
assert db_now.tzinfo is not None and db_now >= op.created_at, (db_now, op.created_at)
call = ProviderCall.objects.create(
    operation=op, purpose=CallPurpose.DISPATCH, step=CallStep.CREATE, attempt=1,
    key=op.provider_key(CallStep.CREATE),
)
call.refresh_from_db()
assert op.created_at <= call.started_at, (op.created_at, call.started_at)
_record_call(call, CallResult(Classification.UNKNOWN, detail="ReadTimeout"))
call.refresh_from_db()
assert call.started_at <= call.finished_at, (call.started_at, call.finished_at)
made_until, clock = _made_until_of([op.id])
assert made_until[op.id] >= call.finished_at, (made_until, call.finished_at)
assert clock is not None and clock.now() >= call.finished_at, (clock, call.finished_at)
age = _last_send_age(op.provider_calls.filter(purpose=CallPurpose.DISPATCH))
assert age is not None and age.total_seconds() >= 0, age
print("SQLITE STAMPS OK", op.created_at.tzinfo == tz.utc or op.created_at.utcoffset())
"""


def test_the_database_stamps_and_clock_work_on_sqlite(embedded_sqlite):
    """`make run`'s embedded database: an operation's creation, a send's start and its
    answer are stamped by SQLite's clock, aware and in order, and the read's bounds and
    the database's clock are read from it."""
    assert "SQLITE STAMPS OK" in embedded_sqlite.shell(SQLITE_STAMPS)
