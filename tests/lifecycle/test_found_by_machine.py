"""Defects the whole-lifecycle state machine found on the fixed code,
each reproduced on its own, small, on the real stack. A test here is marked xfail(strict)
while its defect is open, and loses its mark when the product is fixed."""

from __future__ import annotations

import re

import pytest
from django.core import mail
from django.test import Client

from payments.models import Purchase
from tests.api.conftest import Api
from tests.factories import ProductFactory, make_client

pytestmark = pytest.mark.django_db(transaction=True)

_CODE = re.compile(r"\b[A-Z0-9]{5}-[A-Z0-9]{5}\b")


def _buyer_code(purchase_id: str) -> str:
    """The buyer presses "Yes, start a new purchase" on the status page (a browser: the
    page's CSRF token and cookie) and reads the code in the e-mail it sends."""
    token = Purchase.objects.get(id=purchase_id).status_token
    browser = Client(enforce_csrf_checks=True)
    page = browser.get(f"/status/{token}/")
    csrf = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content)
    given = browser.post(
        f"/status/{token}/new-purchase",
        {"csrfmiddlewaretoken": csrf.group(1).decode() if csrf else ""},
    )
    assert given.status_code == 200, given.status_code
    about = [m for m in mail.outbox if f"next to {purchase_id})" in m.subject]
    return _CODE.search(about[-1].body).group(0)


def test_a_buyer_who_confirmed_once_can_confirm_a_third_purchase():
    """Found by the machine (buyer_lifts_the_guard): the buyer bought a basket, confirmed a
    second purchase of it with the e-mailed code, and now wants a third. The guard names
    one earlier purchase; the buyer confirms it; the guard then names the other one; a
    code for that one lifts it but not the first again. No sequence of codes opens the
    third purchase within the duplicate window: the buyer cannot lift the guard (the
    design says every status the guard asks can be lifted by the buyer)."""
    product = ProductFactory(sku="FBM-LOCK", price=2000, stock=100)
    client, key = make_client(
        name="shop-fbm", limit=100_000_000, scopes=("purchases:read", "purchases:write")
    )
    api = Api(key, client)
    first = api.purchase(api.quote(product.sku).json(), "cust-fbm")
    assert first.status_code == 201, first.content
    refused = api.purchase(api.quote(product.sku).json(), "cust-fbm")
    assert refused.json()["code"] == "probable_duplicate_purchase"
    second = api.purchase(
        api.quote(product.sku).json(),
        "cust-fbm",
        extra={"buyer_confirmation": _buyer_code(first.json()["id"])},
    )
    assert second.status_code == 201, second.content  # one lift works

    # the third: the buyer confirms whichever purchase the guard names, each in turn
    named, answer = [], None
    for _ in range(3):
        answer = api.purchase(
            api.quote(product.sku).json(),
            "cust-fbm",
            extra={"buyer_confirmation": _buyer_code(named[-1])} if named else {},
        )
        if answer.status_code == 201:
            break
        assert answer.json()["code"] == "probable_duplicate_purchase", answer.content
        named.append(answer.json()["purchase"])
    assert answer.status_code == 201, (
        f"the buyer confirmed {named} with e-mailed codes and is still refused: "
        f"{answer.json()['code']} naming {answer.json()['purchase']}"
    )
    assert Purchase.objects.filter(customer_reference="cust-fbm").count() == 3


def test_a_refund_a_person_called_failed_unread_holds_its_room(
    localstripe, drill, read_drill, django_user_model
):
    """Found by the machine (`refundable_room_is_one_payments_everywhere`, the console
    offering 1000 where the invariant expected 1500): the machine's `resolve` settled a
    refund whose answer was lost `failed` while the provider could not be read. The
    invariant counted only refunds not failed; the core (and so the console) also counts
    a refund only a person called failed until the provider is read back. The provider's
    record says the core is right — that refund did pay 500 back — so the invariant's
    rule was wrong, not the console: offering 1500 would pay that 500 back twice."""
    from django.contrib.auth.models import Group

    from payments import services
    from payments.enums import Outcome
    from payments.models import PaymentOperation
    from payments.providers.stripe import DrillMode
    from support.access import Role
    from support.selectors import refundable_amount

    product = ProductFactory(sku="FBM-ROOM", price=1500, stock=10)
    client, _ = make_client(name="shop-room", limit=100_000_000)
    quote = services.quote_create(
        api_client=client, currency="usd", items=[{"sku": product.sku, "quantity": 1}]
    )
    purchase = services.purchase_create(
        api_client=client,
        quote_id=quote.id,
        quote_version=quote.version,
        customer_reference="cust-room",
    )
    payment = services.operation_dispatch(
        operation_id=services.payment_create(
            purchase_id=purchase.id, api_client=client, payment_method="pm_card_visa"
        ).id
    )
    assert payment.outcome == Outcome.SUCCEEDED

    people = {}
    for name, role in (("asker", Role.SUPPORT), ("approver", Role.FINANCE)):
        people[name] = django_user_model.objects.create(username=name)
        people[name].groups.add(Group.objects.get_or_create(name=role.value)[0])
    refund = services.refund_request(
        purchase_id=purchase.id, amount=500, acting_user=people["asker"]
    )
    services.refund_approve(operation_id=refund.id, acting_user=people["approver"], reason="ok")
    drill(refund, DrillMode.DROP_RESPONSE_AFTER_SEND, step="refund")
    assert services.operation_dispatch(operation_id=refund.id).outcome == Outcome.UNKNOWN
    read_drill("*", times=5)  # the provider cannot be read back
    refund = services.operation_resolve_manual(
        operation_id=refund.id,
        outcome="failed",
        reason="looks failed to me",
        actor="approver",
        acting_user=people["approver"],
    )
    assert (refund.outcome, refund.grade) == ("failed", "acknowledged")

    # The provider's record: the refund did pay 500 back.
    [back] = localstripe.refunds_for(payment.provider_reference)
    assert (back["amount"], back["status"]) == (500, "succeeded")
    # The console offers what is left by that record; "not failed only" would say 1500.
    assert refundable_amount(Purchase.objects.get(id=purchase.id)) == 1000
    not_failed = sum(
        PaymentOperation.objects.filter(parent=payment, kind="refund")
        .exclude(outcome="failed")
        .values_list("amount", flat=True)
    )
    assert 1500 - not_failed == 1500  # the invariant's old rule: wrong by the provider
