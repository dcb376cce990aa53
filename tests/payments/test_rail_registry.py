"""The rail is a seam (docs/architecture.md): every `Rail` value has a registered adapter
that says what the rail can do, an unknown rail is refused by name (no default rail), and
the provider's vocabulary ("unapplied", "cancellable", "canceled", in flight) is answered
by each rail's own object, never by sets of status strings in the services."""

import pytest

from payments import services
from payments.enums import OperationKind, Rail
from payments.models import PaymentOperation
from payments.providers.base import ProviderObject, RailAdapter
from payments.providers.registry import UnknownRail, adapter_for_rail, registered_rails
from payments.providers.stripe import StripeObject
from payments.providers.x402 import ChainStatus, X402Transfer
from tests.factories import PurchaseFactory, make_client

# What the services ask of every adapter (payments.providers.base.RailAdapter).
_ASKED = [
    *RailAdapter.__annotations__,
    "object_type_for",
    "dedupes_idempotency_keys",
    "refund_refusal",
]


@pytest.mark.parametrize("rail", list(Rail))
def test_every_rail_of_the_enum_has_an_adapter_that_answers_the_services(rail):
    adapter = adapter_for_rail(rail)
    assert adapter.rail == rail.value
    missing = [name for name in _ASKED if not hasattr(adapter, name)]
    assert missing == []
    for kind in OperationKind:
        assert adapter.object_type_for(kind)
    assert isinstance(adapter.dedupes_idempotency_keys(), bool)
    assert sorted(registered_rails()) == sorted(r.value for r in Rail)


def test_an_unknown_rail_is_refused_by_name():
    with pytest.raises(UnknownRail) as refused:
        adapter_for_rail("paypal")
    message = str(refused.value)
    assert "'paypal'" in message and "stripe" in message and "x402" in message
    # The operation's rail picks the adapter: an operation on no registered rail has none.
    with pytest.raises(UnknownRail):
        services.provider_for(PaymentOperation(rail="paypal"))


@pytest.mark.django_db
def test_a_payment_on_an_unknown_rail_changes_nothing():
    client, _ = make_client()
    purchase = PurchaseFactory(api_client=client)
    before, status = PaymentOperation.objects.count(), purchase.status
    with pytest.raises(UnknownRail):
        services.payment_create(
            purchase_id=purchase.id, api_client=client, payment_method="pm_card_visa", rail="paypal"
        )
    assert PaymentOperation.objects.count() == before
    purchase.refresh_from_db()
    assert purchase.status == status


def _stripe(object_type, status):
    return StripeObject(object_type, id="x", status=status, amount=1, currency="usd")


def test_the_stripe_vocabulary_is_the_stripe_objects():
    assert _stripe("payment_intent", "requires_confirmation").confirm_unapplied
    assert not _stripe("payment_intent", "requires_action").confirm_unapplied
    assert all(
        _stripe("payment_intent", s).cancellable
        for s in ("requires_payment_method", "requires_confirmation", "requires_action")
    )
    assert not _stripe("payment_intent", "processing").cancellable
    assert _stripe("payment_intent", "canceled").canceled
    assert _stripe("payment_intent", "processing").money_in_flight
    assert _stripe("refund", "pending").money_in_flight
    assert _stripe("refund", "requires_action").refund_in_flight
    assert not _stripe("payment_intent", "pending").refund_in_flight
    assert _stripe("refund", "failed").refund_returned_nothing
    assert _stripe("refund", "canceled").refund_returned_nothing
    assert not _stripe("refund", "succeeded").refund_returned_nothing


def test_the_x402_vocabulary_is_the_chain_transfers():
    def transfer(status, tx=""):
        return X402Transfer("x402_transfer", id=tx, status=status, amount=1, currency="usdc")

    assert transfer(ChainStatus.PENDING).money_in_flight
    assert transfer(ChainStatus.UNUSED, tx="0xabc").money_in_flight  # broadcast, not mined
    assert not transfer(ChainStatus.UNUSED).money_in_flight  # nothing broadcast
    assert not transfer(ChainStatus.PENDING).cancellable  # no cancel on a chain
    assert not transfer(ChainStatus.PENDING).confirm_unapplied
    assert transfer(ChainStatus.CANCELED).canceled
    assert transfer(ChainStatus.CONFIRMED).succeeded


def test_a_bare_provider_object_belongs_to_no_rail_and_shows_nothing():
    bare = ProviderObject(
        "payment_intent", id="x", status="requires_confirmation", amount=1, currency="usd"
    )
    assert not (
        bare.confirm_unapplied
        or bare.cancellable
        or bare.canceled
        or bare.money_in_flight
        or bare.refund_in_flight
    )


def test_each_rails_object_reads_its_own_statuses_as_outcomes():
    from payments.enums import Outcome
    from payments.providers.base import outcome_from_object, shows_no_money_moved

    assert outcome_from_object(_stripe("refund", "pending"), kind="refund") == (
        Outcome.AWAITING_PROVIDER
    )
    assert outcome_from_object(_stripe("payment_intent", "canceled"), kind="void") == (
        Outcome.SUCCEEDED
    )
    assert shows_no_money_moved(_stripe("payment_intent", "requires_capture"), kind="capture")
    confirmed = X402Transfer(
        "x402_transfer", id="0x1", status=ChainStatus.CONFIRMED, amount=1, currency="usdc"
    )
    assert outcome_from_object(confirmed, kind="charge") == Outcome.SUCCEEDED
    unused = X402Transfer(
        "x402_transfer", id="0x1", status=ChainStatus.UNUSED, amount=1, currency="usdc"
    )
    assert outcome_from_object(unused, kind="charge") is None  # still usable: no verdict
    assert not shows_no_money_moved(unused, kind="charge")  # a broadcast may still land


def test_no_generic_service_branches_on_a_named_rail():
    """The services ask the adapter; only a rail's own modules (services/x402_*.py) and
    the card rail as payment_create's default name a rail (docs/architecture.md)."""
    import re
    from pathlib import Path

    services_dir = Path(services.__file__).parent
    branch = re.compile(
        r"\.rail\s*[!=]=|==\s*Rail\.|!=\s*Rail\.|rail\s*=\s*Rail\.X402"
        r"|Rail\.X402|\bin\s*\(?Rail\."
    )
    found = []
    for path in sorted(services_dir.glob("*.py")):
        if path.name.startswith("x402_"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if branch.search(line):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert found == []


def test_no_provider_status_is_spelled_outside_its_adapter():
    """Provider vocabulary stays in the adapter: the services and the webhook processing
    ask the provider object (`canceled`, `succeeded`, `final`, ...), never compare its
    status with one of Stripe's words (docs/architecture.md)."""
    import re
    from pathlib import Path

    import webhooks

    stripe_words = (
        "canceled",
        "succeeded",
        "requires_capture",
        "requires_confirmation",
        "requires_action",
        "requires_payment_method",
        "processing",
    )
    spelled = re.compile(
        r"\bstatus\s*(==|!=|in|not in)\s*[\(\{{\[]?\s*\"({})\"".format("|".join(stripe_words))
    )
    roots = [Path(services.__file__).parent, Path(webhooks.__file__).parent]
    found = []
    for root in roots:
        for path in sorted(root.glob("*.py")):
            if path.name.startswith("x402_"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if spelled.search(line):
                    found.append(f"{path.parent.name}/{path.name}:{number}: {line.strip()}")
    assert found == []
