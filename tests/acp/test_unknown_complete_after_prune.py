"""An ACP complete whose answer was lost, the keys
pruned by retention, then every way an agent could try again.

The complete's answer is dropped after localstripe applied the confirm (fault-drill HTTP
client): the payment is `unknown`. Time passes (records backdated) and retention runs.
Then the agent replays the complete (same key), completes with a new key and a new token,
and opens a second session for the same basket and completes it. Counted at localstripe:
one PaymentIntent charged for this buyer, whatever Verity answered (held before and after
the fix). Found: retention pruned the session's keys although its purchase was open
(kept=0, against docs/retention.md's rule; no money effect seen, since complete answers
from the session's state); the ACP keys are now held like REST ones while the session's
purchase is open (kept=2).
"""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from payments.enums import OperationKind, Outcome, Rail
from payments.models import IdempotencyRecord, PaymentOperation, Purchase
from payments.providers.stripe import DrillMode
from payments.services import provider_for_rail
from recovery.retention import policy_for, retention_prune_table
from tests.acp.agent import new_email
from tests.acp.tokens import issue_spt

pytestmark = pytest.mark.django_db(transaction=True)


def test_acp_complete_lost_then_keys_pruned_charges_once(agent, tea, localstripe):  # noqa: F811
    provider = provider_for_rail(Rail.STRIPE)
    email = new_email()
    s = agent.create(tea.sku)
    assert s.status_code == 201, s.text
    session = s.json()
    amount = next(t["amount"] for t in session["totals"] if t["type"] == "total")
    key, token = "complete-1", issue_spt(amount)
    provider.arm_drill(key_prefix="*", step="confirm", mode=DrillMode.DROP_RESPONSE_AFTER_SEND)
    try:
        first = agent.complete(session["id"], token, email, key=key)
    finally:
        provider.drill_client.disarm_all()
    assert first.status_code == 202, first.text  # the answer was lost: not known yet
    op = PaymentOperation.objects.get(
        kind=OperationKind.CHARGE, purchase__customer_reference=f"acp:{email}"
    )
    assert op.outcome == Outcome.UNKNOWN
    purchase_id = op.purchase_id
    assert len(localstripe.succeeded_charges_for(purchase_id)) == 1

    # 31 days on: retention's beat run.
    IdempotencyRecord.objects.update(
        created_at=timezone.now() - timedelta(days=settings.RETENTION_IDEMPOTENCY_DAYS + 1)
    )
    retention_prune_table(policy=policy_for(IdempotencyRecord._meta.db_table))
    kept = IdempotencyRecord.objects.filter(resource_id=session["id"]).count()

    replay = agent.complete(session["id"], token, email, key=key)
    reused = agent.complete(session["id"], issue_spt(amount), email, key=key)
    new_key = agent.complete(session["id"], issue_spt(amount), email, key="complete-2")
    s2 = agent.create(tea.sku)
    second = agent.complete(s2.json()["id"], issue_spt(amount), email, key="complete-3")
    print(
        f"acp_session records kept={kept} replay={replay.status_code} "
        f"reused={reused.status_code} new key={new_key.status_code} "
        f"second session={second.status_code}"
    )

    purchases = list(
        Purchase.objects.filter(customer_reference=f"acp:{email}").values_list("id", flat=True)
    )
    charged = sum(len(localstripe.succeeded_charges_for(p)) for p in purchases)
    intents = sum(len(localstripe.payment_intents_for(p)) for p in purchases)
    print(f"purchases={len(purchases)} intents={intents} charged={charged}")
    assert charged == 1, f"one buyer, one basket: {charged} charges at localstripe"
    assert intents == 1
    assert second.status_code >= 400 and replay.status_code == 202
    # The open purchase keeps its session's keys; the same key with another body is
    # refused.
    assert kept >= 1, "retention pruned the ACP keys of an open purchase"
    assert reused.status_code == 422, reused.text
