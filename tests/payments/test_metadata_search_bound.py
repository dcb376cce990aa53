"""The read-back by metadata pages through the provider's list, bounded. Giving up at the
bound with pages left is "not read", never "the provider has no such refund": a refund's
read-back acts on the latter (no money moved: a person's "succeeded" is refused and a later
read-back overturns it), so a bound reached must keep the person's word standing.
Counted at localstripe; faults only through the fault-drill HTTP client."""

import time
from contextlib import contextmanager
from datetime import timedelta

import pytest

from payments import services
from payments.enums import CallStep, Grade, Outcome
from payments.models import PaymentOperation, ProviderCall
from payments.providers.stripe import DrillMode
from tests.payments.one_call_helpers import wait_intents
from tests.payments.test_create_answer_lost import _intents_of, _start
from tests.payments.test_persons_failed_refund_then_follow_up import _paid, _refund

pytestmark = pytest.mark.django_db(transaction=True)


def _one_intent_is(localstripe, op, outcome, status: str, reference: str | None = None) -> None:
    """The purchase's one PaymentIntent at the provider has `status`, and the operation has
    `outcome` and names it (`reference`, when given, is the intent the test saw made)."""
    [pi] = _intents_of(localstripe, op)
    assert (op.outcome, op.provider_reference, pi["status"]) == (
        outcome,
        reference or pi["id"],
        status,
    )
    assert len(localstripe.payment_intents_for(op.purchase_id)) == 1


def _person_says(op, outcome, reason, resolver=None):
    """A person's manual resolution of `op`, as the console records it."""
    return services.operation_resolve_manual(
        operation_id=op.id,
        outcome=outcome,
        reason=reason,
        actor="resolver" if resolver is not None else "support:alice",
        acting_user=resolver,
    )


def test_a_search_that_gave_up_at_its_page_bound_is_no_verdict_on_a_refund(
    new_purchase, api_client, drill, people, localstripe, settings
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    resolver, requester, approver = people
    # two refunds the provider made for other purchases: the list has more than one page
    for _ in range(2):
        other, _pay = _paid(new_purchase, api_client)
        done = services.operation_dispatch(operation_id=_refund(other, requester, approver).id)
        assert done.outcome == Outcome.SUCCEEDED
    purchase, pay = _paid(new_purchase, api_client)
    refund = _refund(purchase, requester, approver)
    drill(refund, DrillMode.HTTP_409, step="refund")
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.UNKNOWN
    settings.PROVIDER_LIST_PAGE_LIMIT = 1
    settings.PROVIDER_LIST_MAX_PAGES = 1  # the search gives up after one page of one

    refund = _person_says(refund, "succeeded", "the buyer's bank shows it", resolver)
    assert (refund.outcome, refund.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    services.operation_reconcile(operation_id=refund.id)

    refund = PaymentOperation.objects.get(pk=refund.pk)
    assert (refund.outcome, refund.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    assert localstripe.refunds_for(pay.provider_reference) == []


def test_a_search_reads_only_what_the_provider_made_since_the_operation(
    new_purchase, api_client, drill, pay_now, localstripe, settings
):
    """A payment whose create never reached the provider: the read by metadata lists only
    the PaymentIntents created since the operation (Stripe's `created[gte]`, less a margin
    for the two clocks), so others' older ones cost it no page. Paging from the newest with
    one page of one, it stopped at its bound ("not read") however few payments were new;
    bounded by the operation's own time it reaches the end and says "none"."""
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 0
    for _ in range(2):
        assert pay_now(new_purchase()).outcome == Outcome.SUCCEEDED
    time.sleep(1.1)  # the provider's clock counts whole seconds
    settings.PROVIDER_LIST_PAGE_LIMIT = 1
    settings.PROVIDER_LIST_MAX_PAGES = 1
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.HTTP_409, step=CallStep.CREATE)  # answered here, never forwarded

    op = services.operation_dispatch(operation_id=op.id)  # then reads back at once

    reads = ProviderCall.objects.filter(operation_id=op.id, step="list")
    assert list(reads.values_list("classification", flat=True)) == ["not_found"]
    assert op.outcome == Outcome.FAILED
    assert _intents_of(localstripe, op) == []


def test_a_payment_sent_long_after_its_operation_was_created_is_found(
    new_purchase, api_client, drill, localstripe, settings
):
    """An operation may wait long before its send (a queue, a halted workflow): the bound
    is the operation's creation, a floor, so the PaymentIntent its late create made is
    inside it. The create's answer lost, the read finds it, adopts it and confirms it."""
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 0
    purchase = new_purchase()
    op = _start(purchase, api_client)
    PaymentOperation.objects.filter(pk=op.pk).update(created_at=op.created_at - timedelta(hours=2))
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)

    op = services.operation_dispatch(operation_id=op.id)

    _one_intent_is(localstripe, op, Outcome.SUCCEEDED, "succeeded")


def test_a_refund_sent_long_after_its_operation_was_created_is_found(
    new_purchase, api_client, drill, people, localstripe, settings
):
    """A refund approved hours after it was asked for is sent then: its read by metadata,
    bounded by the operation's creation, still finds the refund its lost answer made, and
    the refund is settled succeeded, never sent a second time."""
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 0
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    _resolver, requester, approver = people
    purchase, pay = _paid(new_purchase, api_client)
    refund = _refund(purchase, requester, approver)
    PaymentOperation.objects.filter(pk=refund.pk).update(
        created_at=refund.created_at - timedelta(hours=2)
    )
    drill(refund, DrillMode.DROP_RESPONSE_AFTER_SEND, step="refund")
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.UNKNOWN

    refund = services.operation_reconcile(operation_id=refund.id)

    [made] = localstripe.refunds_for(pay.provider_reference)
    assert (refund.outcome, refund.provider_reference) == (Outcome.SUCCEEDED, made["id"])
    reads = ProviderCall.objects.filter(operation_id=refund.id, step="list")
    assert list(reads.values_list("classification", flat=True)) == ["ok"]


def test_a_late_read_back_is_not_crowded_out_by_newer_payments(
    new_purchase, api_client, drill, read_drill, pay_now, localstripe, settings
):
    """A create whose answer was lost while the provider could not be read: the payment is
    `unknown`, its PaymentIntent payable at the provider. Other buyers pay meanwhile. The
    read-back, bounded below by the operation's creation only, pages from the newest: the
    newer payments fill its page bound and it never reaches the PaymentIntent it looks
    for, though that one sits near the operation's own time. Correct: it is found,
    cancelled, and the payment settled failed on the provider's record. Bounded above by
    the operation's last answer it lists only the payments made near its sends."""
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 0
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)
    read_drill("*")  # the search right after cannot read the provider
    op = services.operation_dispatch(operation_id=op.id)
    [orphan] = _intents_of(localstripe, op)
    assert op.outcome == Outcome.UNKNOWN
    time.sleep(1.1)  # the provider's clock counts whole seconds: theirs come after
    for _ in range(2):
        assert pay_now(new_purchase()).outcome == Outcome.SUCCEEDED
    settings.PROVIDER_LIST_PAGE_LIMIT = 1
    settings.PROVIDER_LIST_MAX_PAGES = 2

    op = services.operation_reconcile(operation_id=op.id)

    assert (op.outcome, op.provider_reference) == (Outcome.FAILED, orphan["id"])
    [orphan] = _intents_of(localstripe, op)
    assert orphan["status"] == "canceled"


def test_a_late_read_of_a_create_that_never_arrived_overturns_a_persons_succeeded(
    new_purchase, api_client, drill, people, pay_now, localstripe, settings
):
    """The soak's case: a create answered here and never forwarded, a person's wrong
    "succeeded", and other buyers paying before the reconciler reads. Bounded below only,
    the read pages from the newest, the newer payments fill its page bound and it stays
    "not read", so the person's word stands on money that never moved. Bounded above by
    the latest its one send can have made an object, it reads the whole window: none, and
    the payment is settled failed on the provider's record."""
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 0
    resolver, _requester, _approver = people
    purchase = new_purchase()
    # The provider's `created` counts whole seconds: the lower bound (its second) would also
    # hold the payments an earlier test on this stack made in that second.
    time.sleep(1.1)
    op = _start(purchase, api_client)
    drill(op, DrillMode.HTTP_409, step=CallStep.CREATE)  # answered here, never forwarded
    settings.PROVIDER_LIST_MAX_PAGES = 0  # the read at once reads nothing: "not read"
    op = services.operation_dispatch(operation_id=op.id)
    assert op.outcome == Outcome.UNKNOWN
    op = _person_says(op, "succeeded", "the buyer says the bank shows it", resolver)
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    time.sleep(1.1)  # the provider's clock counts whole seconds: theirs come after
    for _ in range(2):
        assert pay_now(new_purchase()).outcome == Outcome.SUCCEEDED
    settings.PROVIDER_LIST_PAGE_LIMIT = 1
    settings.PROVIDER_LIST_MAX_PAGES = 2

    op = services.operation_reconcile(operation_id=op.id)

    assert (op.outcome, op.grade) == (Outcome.FAILED, Grade.CONFIRMED)
    assert _intents_of(localstripe, op) == []
    assert localstripe.payment_intents_for(purchase.id) == []


def test_a_read_whose_provider_clock_disagrees_is_no_verdict(
    new_purchase, api_client, drill, localstripe, settings
):
    """The bounds are our clock's. A provider whose clock runs ahead of ours by more than
    half the margin may have stamped the object outside them: its "none" is "not read"."""
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 60
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.HTTP_409, step=CallStep.CREATE)  # answered here, never forwarded
    localstripe.clock_offset(120)
    try:
        op = services.operation_dispatch(operation_id=op.id)
    finally:
        localstripe.clock_offset(0)

    reads = ProviderCall.objects.filter(operation_id=op.id, step="list")
    assert list(reads.values_list("classification", "safe_fields__detail")) == [
        ("unknown", "provider_clock_skew")
    ]
    assert op.outcome == Outcome.UNKNOWN
    assert localstripe.payment_intents_for(purchase.id) == []


def test_a_read_whose_answer_reaches_a_loaded_host_late_still_reads_a_verdict(
    new_purchase, api_client, drill, settings
):
    """The provider's clock agrees with ours, but its answer reaches Verity 3 s after it
    was made (a loaded host): its `Date` is 3 s older than our clock after the answer.
    Measured against that one reading, the clocks "disagree" by more than the check's
    3 s (half a 6 s margin) and a "none" the provider gave is thrown away; measured
    against the request's own span (the Date was stamped between the send and the
    answer), they agree, and the span leaves them at most 4 s apart, inside the margin."""
    from payments.enums import Rail
    from payments.services import provider_for_rail

    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 6
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.HTTP_409, step=CallStep.CREATE)  # answered here, never forwarded
    provider_for_rail(Rail.STRIPE).arm_drill(
        key_prefix="*", step="read", mode=DrillMode.READ_LATE_ANSWER, times=1
    )
    op = services.operation_dispatch(operation_id=op.id)

    reads = ProviderCall.objects.filter(operation_id=op.id, step="list")
    assert list(reads.values_list("classification", "safe_fields__detail")) == [("not_found", "")]


def _wait_past(moment, seconds: float, timeout: float = 30.0) -> None:
    """Wait until `seconds` have passed since `moment` (our clock)."""
    from django.utils import timezone

    deadline = time.monotonic() + timeout
    while (timezone.now() - moment).total_seconds() < seconds:
        assert time.monotonic() < deadline, "the clock did not move on"
        time.sleep(0.05)


def _held_past_the_window(new_purchase, api_client, one_call, settings, *, hold: float):
    """A one-call payment whose first request the provider holds `hold` seconds: its send
    times out, and the reconcile's re-send under its key, past the in-flight window
    (scaled down to 1 s, the clock margin to 0), is answered 409 "in progress"."""
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 1
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 0
    settings.STRIPE_READ_TIMEOUT = 0.5
    one_call.idempotency(hold_seconds=hold)
    purchase = new_purchase()
    op = services.operation_dispatch(operation_id=_start(purchase, api_client).id)
    assert op.outcome == Outcome.UNKNOWN
    first = ProviderCall.objects.get(operation_id=op.id, purpose="dispatch", step=CallStep.PAY)
    _wait_past(first.started_at, 1.5)
    services.operation_reconcile(operation_id=op.id)  # asked again, past the window
    return purchase, op


def test_a_payment_the_provider_makes_after_answering_in_progress_is_found(
    new_purchase, api_client, one_call, settings
):
    """A one-call payment whose first request the provider holds: our send times out, and
    each re-send under its key is answered 409, "in progress", the last one sent after the
    in-flight window had passed, so the provider is seen taking longer than that window.
    A person, told the provider has nothing, says "succeeded". The provider then completes
    the first request: the buyer is charged. A later read-back must find that payment and
    confirm the person, not call it "never received" and overturn the person to "failed"
    (the buyer, told the payment failed, pays a second time). (The in-flight window and
    the clock margin are scaled down so the test waits seconds, not minutes.)"""
    purchase, op = _held_past_the_window(new_purchase, api_client, one_call, settings, hold=6)
    replays = ProviderCall.objects.filter(operation_id=op.id, purpose="replay")
    assert list(replays.order_by("started_at").values_list("http_status", flat=True)) == [
        409,
        409,
    ]
    one_call.idempotency(hold_seconds=0)
    op = _person_says(op, Outcome.SUCCEEDED, "the buyer's bank shows the charge")
    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    assert wait_intents(one_call, purchase, 1)  # the held first request completes
    [pi] = one_call.payment_intents_for(purchase.id)
    assert pi["status"] == "succeeded"

    op = services.operation_reconcile(operation_id=op.id)

    assert (op.outcome, op.provider_reference) == (Outcome.SUCCEEDED, pi["id"])
    assert len(one_call.succeeded_charges_for(purchase.id)) == 1


def test_a_payment_the_provider_is_still_making_is_not_called_never_received(
    new_purchase, api_client, one_call, settings
):
    """As above, but read back while the provider still holds the first request: its
    re-sends answered 409 "in progress" past the in-flight window, the provider has shown
    it takes longer than that window, so a read that finds nothing yet is no verdict. The
    person's "succeeded" stands, and the read after the provider completed confirms it."""
    purchase, op = _held_past_the_window(new_purchase, api_client, one_call, settings, hold=8)
    one_call.idempotency(hold_seconds=0)
    op = _person_says(op, Outcome.SUCCEEDED, "the buyer's bank shows the charge")
    last = ProviderCall.objects.filter(operation_id=op.id, purpose="replay").latest("started_at")
    assert last.http_status == 409
    _wait_past(last.started_at, 1.5)
    assert one_call.payment_intents_for(purchase.id) == []  # still held at the provider

    op = services.operation_reconcile(operation_id=op.id)

    assert (op.outcome, op.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    assert wait_intents(one_call, purchase, 1)  # the held first request completes
    [pi] = one_call.payment_intents_for(purchase.id)
    op = services.operation_reconcile(operation_id=op.id)
    assert (op.outcome, op.grade, op.provider_reference) == (
        Outcome.SUCCEEDED,
        Grade.CONFIRMED,
        pi["id"],
    )
    assert len(one_call.succeeded_charges_for(purchase.id)) == 1


@contextmanager
def _host_clock(monkeypatch, seconds: float):
    """Inside: this process is a host whose clock runs `seconds` off the others' (ahead
    when positive), as far as Django's clock reaches (every `timezone.now()`)."""
    from django.utils import timezone

    true_now = timezone.now
    with monkeypatch.context() as patched:
        patched.setattr(timezone, "now", lambda: true_now() + timedelta(seconds=seconds))
        yield


def test_a_refund_asked_on_a_host_whose_clock_runs_ahead_is_found(
    new_purchase, api_client, drill, people, localstripe, settings, monkeypatch
):
    """The refund is asked on a web host whose clock runs 90 s ahead of the provider's and
    of the worker's that sends and reads it back (their clocks agree, so the Date check
    passes). Were its operation's creation stamped by that host's clock, it would lie
    90 s late, more than the clock margin: a read bounded below by it misses the refund
    the lost answer made and says "none", a person's "failed" is accepted and the money
    went back all the same (a second refund may follow). The provider's record must
    refuse the person."""
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 60
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    resolver, requester, approver = people
    purchase, pay = _paid(new_purchase, api_client)
    with _host_clock(monkeypatch, 90):
        refund = services.refund_request(
            purchase_id=purchase.id, amount=None, acting_user=requester
        )
    refund = services.refund_approve(
        operation_id=refund.id, acting_user=approver, reason="buyer returned it"
    )
    drill(refund, DrillMode.DROP_RESPONSE_AFTER_SEND, step="refund")
    refund = services.operation_dispatch(operation_id=refund.id)
    assert refund.outcome == Outcome.UNKNOWN
    [made] = localstripe.refunds_for(pay.provider_reference)
    with pytest.raises(services.DomainError) as refused:
        _person_says(refund, "failed", "the provider shows no refund", resolver)

    assert refused.value.code == "provider_contradicts"
    refund = PaymentOperation.objects.get(pk=refund.pk)
    assert (refund.outcome, refund.provider_reference) == (Outcome.SUCCEEDED, made["id"])
    assert len(localstripe.refunds_for(pay.provider_reference)) == 1


def _sent_by_an_off_clock_worker(
    new_purchase, api_client, drill, read_drill, localstripe, settings, monkeypatch, offset
):
    """A payment's create sent by a worker whose clock is `offset` s off, its answer lost
    and the worker's own read right after refused: (purchase, operation, the intent made)."""
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 60
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.DROP_RESPONSE_AFTER_SEND, step=CallStep.CREATE)
    read_drill("*")  # the worker's own read right after cannot read the provider
    with _host_clock(monkeypatch, offset):
        op = services.operation_dispatch(operation_id=op.id)
    [made] = _intents_of(localstripe, op)
    return purchase, op, made


@pytest.mark.parametrize("offset", [-90, 90], ids=["behind", "ahead"])
def test_a_payment_sent_by_a_worker_whose_clock_is_off_is_found(
    new_purchase, api_client, drill, read_drill, localstripe, settings, monkeypatch, offset
):
    """A worker whose clock runs 90 s off the provider's and the reader's sends the
    payment's create, and its answer is lost (its own read right after cannot read the
    provider). Were the send's stamps (when it left, when its answer came) that worker's,
    a clock behind would end the read's window before the PaymentIntent was made: the
    reader, its clock and the provider's agreeing, would say "none" and settle the payment
    failed beside a PaymentIntent anyone with the key can still pay. The read finds it,
    adopts it and cancels it, and the payment is failed on the provider's record."""
    purchase, op, made = _sent_by_an_off_clock_worker(
        new_purchase, api_client, drill, read_drill, localstripe, settings, monkeypatch, offset
    )
    assert op.outcome == Outcome.UNKNOWN

    op = services.operation_reconcile(operation_id=op.id)

    _one_intent_is(localstripe, op, Outcome.FAILED, "canceled", made["id"])
    assert localstripe.succeeded_charges_for(purchase.id) == []


def test_the_sweep_reads_back_a_payment_sent_by_a_worker_whose_clock_runs_behind(
    new_purchase, api_client, drill, read_drill, localstripe, settings, monkeypatch
):
    """As above, read by the sweep: its reads run on other threads without the database,
    on the bounds and the database's clock read once for the batch."""
    from recovery.sweep import reconcile_sweep

    purchase, op, made = _sent_by_an_off_clock_worker(
        new_purchase, api_client, drill, read_drill, localstripe, settings, monkeypatch, -90
    )
    assert op.outcome == Outcome.UNKNOWN

    swept = reconcile_sweep(operation_ids=[op.id], concurrency=2)

    assert (swept.reconciled, swept.failed) == (1, 0)
    op = PaymentOperation.objects.get(pk=op.pk)
    _one_intent_is(localstripe, op, Outcome.FAILED, "canceled", made["id"])
    reads = ProviderCall.objects.filter(operation_id=op.id, purpose="reconcile", step="list")
    # the worker's own read, refused by the drill before it left, then the sweep's
    assert list(reads.values_list("classification", flat=True)) == ["not_sent", "ok"]


def test_a_reader_whose_own_clock_is_off_still_reads_a_verdict(
    new_purchase, api_client, drill, localstripe, settings, monkeypatch
):
    """The provider's `Date` is checked against the clock the bounds were stamped by, the
    database's, not the reading host's: a worker whose clock runs 90 s ahead, the
    provider's and the database's agreeing, reads a create that never arrived completely
    and its "none" is a verdict: the payment is failed, nothing made at the provider."""
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 60
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.HTTP_409, step=CallStep.CREATE)  # answered here, never forwarded
    with _host_clock(monkeypatch, 90):
        op = services.operation_dispatch(operation_id=op.id)  # then reads back at once

    reads = ProviderCall.objects.filter(operation_id=op.id, step="list")
    assert list(reads.values_list("classification", flat=True)) == ["not_found"]
    assert op.outcome == Outcome.FAILED
    assert localstripe.payment_intents_for(purchase.id) == []


def test_a_read_whose_provider_clock_cannot_be_read_is_no_verdict(
    new_purchase, api_client, drill, localstripe, settings
):
    """ "None" is said only while the provider's clock agrees with ours. An answer whose
    `Date` header nobody can read (a proxy that rewrites it, a provider that garbles it)
    tells nothing about that clock, so its "none" is "not read", as for a clock seen off."""
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    settings.PROVIDER_READ_CLOCK_MARGIN_SECONDS = 60
    purchase = new_purchase()
    op = _start(purchase, api_client)
    drill(op, DrillMode.HTTP_409, step=CallStep.CREATE)  # answered here, never forwarded
    localstripe.clock_date("not a date")
    try:
        op = services.operation_dispatch(operation_id=op.id)
    finally:
        localstripe.clock_date("")

    reads = ProviderCall.objects.filter(operation_id=op.id, step="list")
    assert list(reads.values_list("classification", "safe_fields__detail")) == [
        ("unknown", "provider_clock_unknown")
    ]
    assert op.outcome == Outcome.UNKNOWN
    assert localstripe.payment_intents_for(purchase.id) == []
