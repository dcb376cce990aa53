"""The purchase view of an x402 purchase (rail, network, payer, transaction hash)
read by FastPathMiddleware and by the DRF view alone — while the settlement waits for the
chain, and once it is mined — answers the same bytes and headers. Real anvil chain and
facilitator."""

import pytest

from payments.models import PaymentOperation
from tests.api.test_fast_path_equivalence import _both, _same
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_settings")]


def test_an_x402_purchase_reads_the_same_pending_and_paid(
    agent,
    report,
    chain,  # noqa: F811
    fast_settings,
):
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    payer = chain.new_payer()
    header, _ = sign(agent.get(url).headers["PAYMENT-REQUIRED"], payer)
    chain.automine(False)
    agent.get(url, **{SIGNATURE: header})
    op = PaymentOperation.objects.get(purchase_id=purchase["id"])
    assert op.outcome == "awaiting_provider"
    agent.get(f"purchases/{purchase['id']}")  # verified: cache warm

    fast, drf = _both(fast_settings, lambda: agent.get(f"purchases/{purchase['id']}"))
    assert getattr(fast, "verity_fast_path", False)
    _same(fast, drf)

    chain.automine(True)
    chain.mine(2)
    agent.get(url, **{SIGNATURE: header})
    settle_outbox()
    fast, drf = _both(fast_settings, lambda: agent.get(f"purchases/{purchase['id']}"))
    assert getattr(fast, "verity_fast_path", False)
    print(fast.json().get("status"), fast.json().get("payment"))
    _same(fast, drf)
