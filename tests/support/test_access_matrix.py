"""Every console view and action x every role (anonymous, no role, support, operator,
finance): allowed cells answer (200 for pages, a redirect back for actions), denied cells
answer 403, anonymous is sent to the login page. The expectation comes from
support.access.MATRIX, so a policy change and this test cannot drift apart silently."""

from __future__ import annotations

import pytest
from django.urls import reverse

from payments.enums import PurchaseStatus
from support.access import MATRIX, Action, Role
from webhooks.models import EventResult, ProviderEvent

from .builders import UNKNOWN, purchase_in

ROLES = [None, "nobody", "support", "operator", "finance"]


@pytest.fixture
def targets(db):
    purchase = purchase_in(PurchaseStatus.PAYMENT_UNKNOWN, ops=[UNKNOWN])
    op = purchase.operations.get()
    event = ProviderEvent.objects.create(
        event_id="evt_matrix",
        type="payment_intent.succeeded",
        payload={"id": "pi_test_unknown"},
        result=EventResult.QUARANTINED,
    )
    return {"purchase": purchase.pk, "op": op.pk, "event": event.pk}


def _cells(t):
    """(method, url, action needed)"""
    return [
        ("get", reverse("support:dashboard"), Action.VIEW),
        ("get", reverse("support:search") + "?q=nothing", Action.VIEW),
        *[
            (
                "get",
                reverse("support:queue", args=[name]),
                Action.VIEW_SETTLEMENT if name in ("settlement", "disputes") else Action.VIEW,
            )
            for name in (
                "unknown",
                "paid_without_order",
                "compensation",
                "quarantined",
                "stuck_outbox",
                "settlement",
                "escalated",
                "refund_approval",
                "disputes",
                "external",
            )
        ],
        ("get", reverse("support:purchase", args=[t["purchase"]]), Action.VIEW),
        ("get", reverse("support:event", args=[t["event"]]), Action.VIEW),
        ("get", reverse("support:halts"), Action.VIEW),
        ("get", reverse("support:audit"), Action.VIEW),
        ("post", reverse("support:note-add", args=[t["purchase"]]), Action.ADD_NOTE),
        ("post", reverse("support:refund-request", args=[t["purchase"]]), Action.REQUEST_REFUND),
        ("post", reverse("support:reconcile", args=[t["op"]]), Action.RECONCILE),
        ("post", reverse("support:resolve", args=[t["op"]]), Action.RESOLVE),
        ("post", reverse("support:replay", args=[t["op"]]), Action.REPLAY),
        ("post", reverse("support:refund-approve", args=[t["op"]]), Action.APPROVE_REFUND),
        ("post", reverse("support:external-review", args=[t["op"]]), Action.REVIEW_EXTERNAL),
        ("post", reverse("support:halt-set"), Action.HALT),
        ("post", reverse("support:halt-clear"), Action.HALT),
        (
            "post",
            reverse("support:event-triage", args=[t["event"], "release"]),
            Action.TRIAGE_QUARANTINE,
        ),
        (
            "post",
            reverse("support:event-triage", args=[t["event"], "dismiss"]),
            Action.TRIAGE_QUARANTINE,
        ),
        (
            "post",
            reverse("support:step-decide", args=[t["purchase"], "ledger"]),
            Action.DECIDE_STEP,
        ),
        ("post", reverse("support:discrepancy-explain", args=[1]), Action.SETTLE_DISCREPANCY),
        ("post", reverse("support:outbox-retry", args=[1]), Action.RETRY_OUTBOX),
        ("get", reverse("support:webhooks"), Action.VIEW),
        (
            "post",
            reverse("support:webhook-endpoint-enabled", args=["we_matrix", "disable"]),
            Action.MANAGE_WEBHOOKS,
        ),
        ("post", reverse("support:webhook-delivery-resend", args=[1]), Action.MANAGE_WEBHOOKS),
    ]


def _allowed(role: str | None, action: Action) -> bool:
    if role in (None, "nobody"):
        return False
    return action in MATRIX[Role(role)]


@pytest.mark.parametrize("role", ROLES)
def test_every_console_cell(role, login, targets):
    client = login(role)
    seen = []
    for method, url, action in _cells(targets):
        # Actions are posted without the confirmation tick, so an allowed cell is
        # answered by a redirect back (nothing changes) and never reaches a service.
        response = getattr(client, method)(url, data={} if method == "post" else None)
        if role is None:
            expected = 302
            assert response.status_code == 302, (method, url)
            assert response["Location"].startswith("/console/login/"), url
        elif _allowed(role, action):
            expected = 200 if method == "get" else 302
            assert response.status_code == expected, (role, method, url, response.status_code)
            if method == "post":
                assert not response["Location"].startswith("/console/login/")
        else:
            expected = 403
            assert response.status_code == 403, (role, method, url, response.status_code)
        assert "Content-Security-Policy" in response, url
        seen.append((url, expected))
    # Every permission the matrix grants is exercised by a cell here, so a new Action
    # cannot ship without one (the two below are gated by other pages: the incident
    # views, tests/support/test_incidents.py, and the redacted payload on the event page,
    # tests/security/test_console_disclosure.py).
    covered = {action for _, _, action in _cells(targets)}
    assert set(Action) - covered == {Action.MANAGE_INCIDENTS, Action.VIEW_REDACTED_PAYLOAD}
    assert covered <= set().union(*MATRIX.values())


def test_denied_action_changes_nothing(login, targets):
    """403 is enforced by the view, not only by a hidden button: a support user who posts
    a confirmed manual resolution gets 403 and the operation stays unknown."""
    from payments.models import PaymentOperation
    from support.models import AuditEntry, Resolution

    client = login("support")
    response = client.post(
        reverse("support:resolve", args=[targets["op"]]),
        {"outcome": "succeeded", "reason": "looks paid", "confirm": "yes"},
    )
    assert response.status_code == 403
    assert PaymentOperation.objects.get(pk=targets["op"]).outcome == "unknown"
    assert Resolution.objects.count() == 0
    assert AuditEntry.objects.count() == 0


def test_get_on_action_is_refused(login, targets):
    client = login("operator")
    response = client.get(reverse("support:resolve", args=[targets["op"]]))
    assert response.status_code == 405


def test_support_does_not_see_operator_forms(login, targets):
    html = (
        login("support")
        .get(reverse("support:purchase", args=[targets["purchase"]]))
        .content.decode()
    )
    assert "Resolve manually" not in html
    assert "Reconcile now" in html
    html = (
        login("operator")
        .get(reverse("support:purchase", args=[targets["purchase"]]))
        .content.decode()
    )
    assert "Resolve manually" in html


def test_login_page_and_rate_limit(client, users):
    url = reverse("support:login")
    assert client.get(url).status_code == 200
    ok = client.post(url, {"username": "olga", "password": "pw-olga"})
    assert ok.status_code == 302 and ok["Location"] == "/console/"
    client.logout()
    for _ in range(5):
        assert client.post(url, {"username": "olga", "password": "wrong"}).status_code == 200
    throttled = client.post(url, {"username": "olga", "password": "pw-olga"})
    assert throttled.status_code == 429
    assert "_auth_user_id" not in client.session


def test_not_allowed_names_a_role_that_can_open_the_page(login, db):
    response = login("support").get(reverse("support:queue", args=["settlement"]))

    assert response.status_code == 403
    assert "Ask someone with the <strong>finance</strong> role." in response.content.decode()
    response = login("support").post(reverse("support:halt-set"), {"name": "checkout"})
    assert "Ask someone with the <strong>operator</strong> role." in response.content.decode()
