"""Refunds leave from a separate refund account (a
float finance tops up), never from the receiving account pay_to, whose key Verity does not
hold; the float's balance is on the console and in /metrics; x402 settle attempts are
limited per API client (429 with Retry-After, nothing stored)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User

from payments import services
from payments.models import PaymentOperation, ProviderCall, X402Authorization, X402RefundTransfer
from support.access import Role, ensure_groups
from tests.api.client import Api
from tests.factories import make_client
from tests.outbox import settle_outbox
from tests.x402.chain import SIGNATURE, sign

pytestmark = pytest.mark.django_db(transaction=True)

PRICE_ATOMIC = 1250 * 10**4  # the report's 12.50 USD in USDC's 6 decimals


def _paid(agent, report, chain):
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    payer = chain.new_payer()
    header, _auth = sign(agent.get(url).headers["PAYMENT-REQUIRED"], payer)
    r = agent.get(url, **{SIGNATURE: header})
    assert r.status_code in (200, 202), r.content
    assert chain.transfers(payer.address) == 1
    return purchase, payer, header


def _console(client):
    ensure_groups()
    user = User.objects.create_user(username="fred-float", password="pw")
    user.groups.add(*Group.objects.filter(name=Role.FINANCE))
    client.force_login(user)
    return client


def test_a_refund_is_one_transfer_from_the_refund_account_and_pay_to_keeps_its_money(
    agent, report, chain, django_user_model
):
    # given a purchase paid over x402 (the money is at pay_to)
    assert chain.refund_account and chain.refund_account.lower() != chain.pay_to.lower()
    purchase, payer, _header = _paid(agent, report, chain)
    pay_to_before = chain.balance(chain.pay_to)
    float_before = chain.balance(chain.refund_account)
    requester = django_user_model.objects.create(username="support-float")
    approver = django_user_model.objects.create(username="finance-float")

    # when the refund is requested, approved and sent
    refund = services.refund_request(purchase_id=purchase["id"], acting_user=requester)
    services.refund_approve(operation_id=refund.id, acting_user=approver, reason="returned")
    done = services.operation_dispatch(operation_id=refund.id)
    settle_outbox()

    # then exactly one Transfer(refund account -> payer), none from pay_to
    assert (done.outcome, done.verification) == ("succeeded", "provider"), done.reason
    assert chain.transfers_back(payer.address) == 1
    assert chain.transfers_back(payer.address, sender=chain.pay_to) == 0
    assert chain.balance(payer.address) == 1_000 * 10**6  # all of it came back
    # pay_to's balance is untouched by the refund; the float paid it
    assert chain.balance(chain.pay_to) == pay_to_before
    assert chain.balance(chain.refund_account) == float_before - PRICE_ATOMIC
    row = X402RefundTransfer.objects.get(operation=refund)
    assert row.from_address == chain.refund_account and row.value == str(PRICE_ATOMIC)
    # the read-back accepts the refund account as the sender (confirmed, nothing sent)
    seen = services.operation_read_canonical(operation_id=refund.id)
    assert (seen.status, seen.id) == ("confirmed", row.transaction_hash)
    assert ProviderCall.objects.filter(operation=refund, purpose="dispatch").count() == 1
    assert chain.transfers_back(payer.address) == 1


def test_the_console_and_the_metrics_show_the_refund_float(chain, client, settings):
    balance = chain.balance(chain.refund_account)
    tokens = balance / 10**6
    settings.X402_REFUND_LOW_BALANCE = 1.0  # far below the stack's float

    page = _console(client).get("/console/").content.decode()
    metrics = client.get("/metrics").content.decode()

    assert "data-refund-float" in page and chain.refund_account in page
    shown = re.search(r"data-refund-balance>([^<]*)<", page).group(1)
    assert f"{tokens:,.2f}".replace(",", "") in shown.replace(",", "") and "top it up" not in shown
    assert "data-refund-float-low" not in page
    assert f"verity_x402_refund_balance {float(tokens)}" in metrics
    assert "verity_x402_refund_low_balance 1.0" in metrics

    # below the level: flagged on the console (the alert reads the same two gauges)
    settings.X402_REFUND_LOW_BALANCE = tokens + 1
    page = client.get("/console/").content.decode()
    assert "data-refund-float-low" in page and "top it up" in page
    assert (
        f"verity_x402_refund_low_balance {float(tokens + 1)}"
        in client.get("/metrics").content.decode()
    )


def test_settle_attempts_past_the_per_client_limit_are_429_and_store_nothing(
    agent, report, chain, settings
):
    # given a limit of two settle attempts per client per minute
    settings.X402_SETTLE_RATE = "2/min"
    first, first_payer, first_header = _paid(agent, report, chain)
    _paid(agent, report, chain)
    purchase = agent.new_purchase(report.sku)
    url = f"purchases/{purchase['id']}/deliverable"
    payer = chain.new_payer()
    header, auth = sign(agent.get(url).headers["PAYMENT-REQUIRED"], payer)

    # when a third new authorization is sent within the minute
    r = agent.get(url, **{SIGNATURE: header})

    # then 429 with Retry-After, and nothing was stored, settled or moved
    assert r.status_code == 429, r.content
    assert r.json()["code"] == "x402_settle_rate_limited"
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert not PaymentOperation.objects.filter(purchase_id=purchase["id"]).exists()
    assert not X402Authorization.objects.filter(payer=payer.address).exists()
    assert chain.transfers(payer.address) == 0
    assert not chain.authorization_used(payer.address, auth["nonce"])
    # a replay of a stored payment (the same signature again) is not an attempt
    replay = agent.get(f"purchases/{first['id']}/deliverable", **{SIGNATURE: first_header})
    assert replay.status_code in (200, 202) and replay.headers["Payment-Replayed"] == "true"
    assert chain.transfers(first_payer.address) == 1
    # another API client has its own count
    other_client, key = make_client(
        scopes=("purchases:read", "purchases:write"), limit=10_000_000, name="agent-2"
    )
    other = Api(key, other_client)
    other_purchase, _other_payer, _ = _paid(other, report, chain)
    assert PaymentOperation.objects.filter(purchase_id=other_purchase["id"]).count() == 1
    settle_outbox()


def test_an_unreadable_chain_shows_the_float_unreadable_and_metrics_still_answer(
    chain, client, settings
):
    settings.X402_RPC_URL = "http://127.0.0.1:9"  # nothing listens: connection refused

    page = _console(client).get("/console/")
    metrics = client.get("/metrics")

    assert page.status_code == 200 and "unreadable" in page.content.decode()
    assert chain.refund_account in page.content.decode()
    body = metrics.content.decode()
    assert metrics.status_code == 200 and "# TYPE verity_x402_refund_balance gauge" in body
    assert not re.search(r"^verity_x402_refund_balance ", body, re.M)  # no sample: no alert
