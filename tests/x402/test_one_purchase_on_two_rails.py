"""One purchase paid on both rails at once.

A card payment (REST, Stripe at localstripe) and a signed x402 authorization (the
deliverable's GET with PAYMENT-SIGNATURE, settled on the anvil chain) race on the same
purchase from two threads, each with its own key. Counted on the provider and the chain:
succeeded charges at localstripe plus Transfer logs payer -> Verity is at most one.
"""

import threading

import pytest
from django.db import connection

from payments.enums import OperationKind, Outcome
from payments.models import PaymentOperation
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_card_and_an_x402_payment_racing_on_one_purchase_move_money_once(
    agent, report, chain, localstripe
):  # noqa: F811
    for _ in range(3):
        purchase = agent.new_purchase(report.sku)
        required = agent.get(f"purchases/{purchase['id']}/deliverable").headers["PAYMENT-REQUIRED"]
        payer = chain.new_payer()
        header, _auth = sign(required, payer)
        start = threading.Barrier(2)
        answers = {}

        def card(start=start, answers=answers, purchase=purchase):
            try:
                start.wait()
                answers["card"] = agent.pay(purchase["id"]).status_code
            finally:
                connection.close()

        def x402(start=start, answers=answers, purchase=purchase, header=header):
            try:
                start.wait()
                answers["x402"] = agent.get(
                    f"purchases/{purchase['id']}/deliverable", **{SIGNATURE: header}
                ).status_code
            finally:
                connection.close()

        threads = [threading.Thread(target=card), threading.Thread(target=x402)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        settle_outbox()
        card_charges = len(localstripe.succeeded_charges_for(purchase["id"]))
        transfers = chain.transfers(payer.address)
        succeeded = PaymentOperation.objects.filter(
            purchase_id=purchase["id"],
            kind__in=[OperationKind.CHARGE, OperationKind.AUTHORIZE],
            outcome=Outcome.SUCCEEDED,
            is_duplicate=False,
        ).count()
        print(
            f"answers={answers} card charges={card_charges} transfers={transfers} "
            f"succeeded ops={succeeded}"
        )
        assert card_charges + transfers <= 1, answers
        assert succeeded <= 1
