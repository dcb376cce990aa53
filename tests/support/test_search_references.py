"""Search finds what customers, the provider and runbooks hand a person: an order
reference (`ord_…`), a balance transaction (`txn_…`, read from the provider), and a
partial customer reference or e-mail (prefix, served by an index)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from payments.enums import PurchaseStatus
from recovery.models import Order, SettlementDiscrepancy

from .builders import SUCCEEDED, purchase_in


def _found(response, purchase):
    return response.status_code == 302 and response["Location"] == reverse(
        "support:purchase", args=[purchase.pk]
    )


def test_order_reference_finds_its_purchase(login, db):
    purchase = purchase_in(PurchaseStatus.FULFILLING, ops=[SUCCEEDED])
    Order.objects.create(purchase_id=purchase.pk, reference="ord_5f3a9c01d2e4b677")
    purchase_in(PurchaseStatus.FULFILLING, ops=[SUCCEEDED], order="ord_0000000000000000")

    client = login("support")

    assert _found(client.get(reverse("support:search"), {"q": "ord_5f3a9c01d2e4b677"}), purchase)
    # Customers read it off an e-mail and may type it in capitals.
    assert _found(client.get(reverse("support:search"), {"q": "ORD_5F3A9C01D2E4B677"}), purchase)


@pytest.mark.django_db(transaction=True)
def test_balance_transaction_id_finds_the_purchase_through_the_provider(
    login, new_purchase, pay_now, localstripe
):
    purchase = new_purchase()
    charge = pay_now(purchase)
    assert charge.provider_charge.startswith("ch_")
    [txn] = [
        t["id"]
        for t in localstripe.list("balance_transactions")
        if t.get("source") == charge.provider_charge
    ]
    assert txn.startswith("txn_")

    response = login("finance").get(reverse("support:search"), {"q": txn})

    assert _found(response, purchase), (txn, charge.provider_charge)


def test_unknown_balance_transaction_finds_nothing_and_says_so(login, db, localstripe):
    purchase_in(PurchaseStatus.COMPLETED, ops=[SUCCEEDED])
    SettlementDiscrepancy.objects.create(
        provider_reference="ch_elsewhere",
        kind="missing_locally",
        provider_amount=100,
        currency="usd",
    )

    response = login("finance").get(reverse("support:search"), {"q": "txn_doesnotexist"})

    assert response.status_code == 200
    assert "No purchase matches “txn_doesnotexist” as a balance transaction" in (
        response.content.decode()
    )


@pytest.mark.parametrize("q", ["ada.love", "ADA.LOVELACE@exa", "acme-cust-77"])
def test_partial_email_or_customer_reference_finds_by_prefix(login, db, q):
    purchase = purchase_in(
        PurchaseStatus.PAID,
        ops=[SUCCEEDED],
        customer_reference="acme-cust-7731",
        customer_email="ada.lovelace@example.com",
    )
    purchase_in(
        PurchaseStatus.PAID,
        ops=[SUCCEEDED],
        customer_reference="other-1",
        customer_email="grace@example.com",
    )

    assert _found(login("support").get(reverse("support:search"), {"q": q}), purchase)


def test_prefix_search_never_matches_the_middle_or_too_short(login, db):
    purchase_in(
        PurchaseStatus.PAID,
        ops=[SUCCEEDED],
        customer_reference="acme-cust-7731",
        customer_email="ada.lovelace@example.com",
    )
    client = login("support")

    for q in ("lovelace", "cust-77", "ad"):
        response = client.get(reverse("support:search"), {"q": q})
        assert response.status_code == 200 and "No purchase matches" in (
            response.content.decode()
        ), q


def test_prefix_search_is_served_by_an_index(db):
    from django.db.models import Q

    from payments.models import Purchase

    qs = Purchase.objects.filter(
        Q(customer_reference__startswith="acme") | Q(customer_email__istartswith="ada")
    )
    sql, params = qs.query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN " + sql, params)
        plan = "\n".join(r[0] for r in cur.fetchall())

    assert "purchase_ref_prefix_idx" in plan and "purchase_email_prefix_idx" in plan, plan
