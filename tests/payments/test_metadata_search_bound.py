"""The read-back by metadata pages through the provider's list, bounded. Giving up at the
bound with pages left is "not read", never "the provider has no such refund": a refund's
read-back acts on the latter (no money moved: a person's "succeeded" is refused and a later
read-back overturns it), so a bound reached must keep the person's word standing.
Counted at localstripe; faults only through the fault-drill HTTP client."""

import pytest

from payments import services
from payments.enums import Grade, Outcome
from payments.models import PaymentOperation
from payments.providers.stripe import DrillMode
from tests.payments.test_persons_failed_refund_then_follow_up import _paid, _refund

pytestmark = pytest.mark.django_db(transaction=True)


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

    refund = services.operation_resolve_manual(
        operation_id=refund.id,
        outcome="succeeded",
        reason="the buyer's bank shows it",
        actor="resolver",
        acting_user=resolver,
    )
    assert (refund.outcome, refund.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    services.operation_reconcile(operation_id=refund.id)

    refund = PaymentOperation.objects.get(pk=refund.pk)
    assert (refund.outcome, refund.grade) == (Outcome.SUCCEEDED, Grade.ACKNOWLEDGED)
    assert localstripe.refunds_for(pay.provider_reference) == []
