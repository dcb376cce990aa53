"""On the card rail, a duplicate's return (its compensation) a
person called "failed" while the provider could not be read is not asked again on that
word: the first return may still land. Once the provider's read-back confirms that none
was made, a new return is asked and sent: the duplicate comes back exactly once.
Counted at localstripe; faults only through the fault-drill HTTP client."""

import pytest

from payments import services
from payments.enums import Grade, Outcome, Rail
from payments.models import PaymentOperation
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail
from tests.outbox import settle
from tests.payments.test_provider_outranks_people import _charged_twice

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_duplicates_return_is_asked_again_only_once_the_provider_confirms_the_failure(
    new_purchase, api_client, drill, read_drill, resolver, localstripe, settings, django_user_model
):
    settings.PROVIDER_INFLIGHT_WINDOW_SECONDS = 0
    person = django_user_model.objects.create(username="return-resolver")
    purchase, first, retry = _charged_twice(
        new_purchase, api_client, drill, read_drill, resolver, localstripe
    )
    services.operation_reconcile(operation_id=first.id)
    first = PaymentOperation.objects.get(pk=first.pk)
    assert first.is_duplicate
    [comp] = PaymentOperation.objects.filter(parent=first, kind="refund")
    drill(comp, DrillMode.HTTP_409, step="refund")  # refused before the provider: nothing
    comp = services.operation_dispatch(operation_id=comp.id)
    assert comp.outcome == Outcome.UNKNOWN

    read_drill("*", times=10)  # unreadable: the person's word is taken, acknowledged
    comp = services.operation_resolve_manual(
        operation_id=comp.id,
        outcome="failed",
        reason="bank says nothing came back",
        actor="resolver",
        acting_user=person,
    )
    assert (comp.outcome, comp.grade) == (Outcome.FAILED, Grade.ACKNOWLEDGED)
    settle()
    assert PaymentOperation.objects.filter(parent=first, kind="refund").count() == 1, (
        "a new return was asked on a person's unconfirmed word"
    )

    provider_for_rail(Rail.STRIPE).drill_client.disarm_all()
    services.operation_reconcile(operation_id=comp.id)  # the provider: no refund made
    assert PaymentOperation.objects.get(pk=comp.pk).grade == Grade.CONFIRMED
    settle()
    returns = PaymentOperation.objects.filter(parent=first, kind="refund").exclude(pk=comp.pk)
    assert returns.count() == 1, "the confirmed failure asked for no new return"
    for op in returns:
        services.operation_dispatch(operation_id=op.id)
    settle()
    assert [
        r["amount"]
        for r in localstripe.refunds_for(first.provider_reference)
        if r["status"] == "succeeded"
    ] == [first.amount]
