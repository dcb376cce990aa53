import pytest

from payments.models import PaymentOperation, ProviderCall
from tools.drill import drills_print

pytestmark = pytest.mark.django_db(transaction=True)


def test_drill_command_prints_one_row_per_drill_and_one_charge_at_most(capsys, localstripe):
    drills_print()
    out = capsys.readouterr().out
    for mode in (
        "drop_response_after_send",
        "timeout_before_send",
        "reset_after_write",
        "http_500",
        "http_409",
    ):
        assert mode in out
    assert "VIOLATION" not in out
    purchases = set(PaymentOperation.objects.values_list("purchase_id", flat=True))
    assert len(purchases) == 5
    for pid in purchases:
        assert len(localstripe.succeeded_charges_for(pid)) <= 1
    # Operations a drill leaves unknown stay in the console's queue: the command says so.
    unknown = set(
        PaymentOperation.objects.filter(outcome="unknown").values_list("purchase_id", flat=True)
    )
    if unknown:
        assert "remain in the console's Unknown operations queue" in out
        assert all(pid in out for pid in unknown)


def test_drill_command_reports_progress_on_stderr_and_quiet_turns_it_off(capsys, localstripe):
    # when the drills run with output that is not a terminal
    drills_print()
    err = capsys.readouterr().err
    # then a plain line came at once and a final one counts every drill and no failure
    assert "drill [0:00] drills 0/5 done, 0 failure(s)" in err
    assert "drills 5/5 done, 0 failure(s) (done)" in err

    # when run with --quiet
    drills_print(quiet=True)
    # then there is no progress at all, and the table is still printed
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "http_409" in captured.out


def test_drill_command_in_one_round_trip_mode_charges_once_at_most(capsys, one_call):
    # when the provider dedupes keys and each payment is one request (create+confirm)
    drills_print()
    out = capsys.readouterr().out
    # then every drill hit that request, and none charged twice or settled without evidence
    assert "VIOLATION" not in out
    purchases = set(PaymentOperation.objects.values_list("purchase_id", flat=True))
    assert len(purchases) == 5
    for pid in purchases:
        assert len(one_call.succeeded_charges_for(pid)) <= 1
        assert len(one_call.payment_intents_for(pid)) == 1
    assert set(ProviderCall.objects.filter(purpose="dispatch").values_list("step", flat=True)) == {
        "pay"
    }
