"""An agent pays for a report over x402, loses the settle answer,
retries with the same signature three times and with a new authorization once, and ends
with exactly one transfer on chain and the report delivered once."""

from __future__ import annotations

import pytest

from payments.models import PaymentOperation, ProviderCall
from payments.providers.x402 import DrillMode, decode_header, get_facilitator
from recovery.models import StepRun
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)


def test_lost_answer_three_same_retries_and_a_new_authorization_move_money_once(
    agent, report, chain, settings
):
    settings.RECONCILE_ON_DEMAND_COOLDOWN_SECONDS = 0  # every retry may read the chain
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    required = agent.get(url).headers["PAYMENT-REQUIRED"]
    payer = chain.new_payer()
    header, auth = sign(required, payer, payment_id="agent-report-0001-abcdef")
    get_facilitator().arm_drill(
        payer=payer.address, nonce=auth["nonce"], mode=DrillMode.DROP_ANSWER_AFTER_SEND
    )

    lost = agent.get(url, **{SIGNATURE: header})
    retries = [agent.get(url, **{SIGNATURE: header}) for _ in range(3)]
    settle_outbox()  # the paid purchase's fulfilment runs (the deliverable step)
    other, _auth2 = sign(required, payer, payment_id="agent-report-0002-abcdef")
    second = agent.get(url, **{SIGNATURE: other})
    final = agent.get(url, **{SIGNATURE: header})

    assert lost.status_code == 202 and lost.json()["code"] == "payment_unknown", lost.content
    assert all(r.headers.get("Payment-Replayed") == "true" for r in retries)
    assert second.status_code == 409 and second.json()["code"] == "already_paid", second.content
    assert final.status_code == 200, final.content
    assert decode_header(final.headers["PAYMENT-RESPONSE"])["success"] is True
    assert chain.transfers(payer.address) == 1
    ops = PaymentOperation.objects.filter(purchase_id=purchase["id"])
    assert [(o.rail, o.outcome) for o in ops] == [("x402", "succeeded")]
    assert (
        ProviderCall.objects.filter(
            operation__purchase_id=purchase["id"], purpose="dispatch", step="settle"
        ).count()
        == 1
    )
    run = StepRun.objects.get(purchase_id=purchase["id"], step="deliverable")
    assert run.state == "done" and run.attempts == 1  # the report was made (and sent) once
    assert final.json()["job_reference"] == run.external_reference


def test_the_same_payment_identifier_with_another_payload_is_409_and_changes_nothing(
    agent, report, chain
):
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    required = agent.get(url).headers["PAYMENT-REQUIRED"]
    payer = chain.new_payer()
    first, _ = sign(required, payer, payment_id="same-id-0000-0000-0001")
    agent.get(url, **{SIGNATURE: first})
    reused, _ = sign(required, payer, payment_id="same-id-0000-0000-0001")

    r = agent.get(url, **{SIGNATURE: reused})

    assert r.status_code == 409 and r.json()["code"] == "payment_identifier_reused", r.content
    assert chain.transfers(payer.address) == 1
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1


def test_a_second_authorization_while_the_first_is_unresolved_is_refused(agent, report, chain):
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    required = agent.get(url).headers["PAYMENT-REQUIRED"]
    payer = chain.new_payer()
    first, _ = sign(required, payer)
    chain.automine(False)
    assert agent.get(url, **{SIGNATURE: first}).status_code == 202

    second, _ = sign(required, payer)
    r = agent.get(url, **{SIGNATURE: second})

    assert r.status_code == 409 and r.json()["code"] == "payment_unresolved", r.content
    chain.mine()
    assert chain.transfers(payer.address) == 1
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 1


@pytest.mark.parametrize("header", ["not-base64!", "eyJ4NDAyVmVyc2lvbiI6IDJ9"])
def test_a_malformed_payment_signature_is_400_and_changes_nothing(agent, report, chain, header):
    purchase = agent.new_purchase(report.sku)

    r = agent.get(f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header})

    assert r.status_code == 400 and r.json()["code"] == "payment_signature_invalid"
    assert PaymentOperation.objects.filter(purchase_id=purchase["id"]).count() == 0


def test_an_authorization_for_another_amount_is_402_and_nothing_is_sent(agent, report, chain):
    cheap = agent.new_purchase(report.sku)
    other = type(report).objects.create(
        sku="REPORT-BIG", name="Big report", price=9900, stock=10, kind="digital"
    )
    dear = agent.new_purchase(other.sku)
    required = agent.get(f"purchases/{cheap['id']}/deliverable").headers["PAYMENT-REQUIRED"]
    payer = chain.new_payer()
    header, _ = sign(required, payer)

    r = agent.get(f"purchases/{dear['id']}/deliverable", **{SIGNATURE: header})

    # The x402 v2 transport: 402 with PAYMENT-REQUIRED (the SDK's reason), not 422.
    assert r.status_code == 402 and r.json()["code"] == "payment_requirements_mismatch"
    assert (
        decode_header(r.headers["PAYMENT-REQUIRED"])["error"] == "No matching payment requirements"
    )
    assert r.json()["error"] == "No matching payment requirements"
    assert chain.transfers(payer.address) == 0
    assert PaymentOperation.objects.filter(purchase_id=dear["id"]).count() == 0
