"""Runbook placeholders cannot print secrets to console users, and ids that
came from outside (a signed event's metadata) cannot 500 the audit page."""

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User

from support import runbooks
from support.access import Role, ensure_groups
from support.models import AuditEntry

pytestmark = pytest.mark.django_db


@pytest.fixture
def support_client(client):
    ensure_groups()
    user = User.objects.create_user(username="sam", password="unused-in-this-test")
    user.groups.add(Group.objects.get(name=Role.SUPPORT))
    client.force_login(user)
    return client


def test_setting_placeholders_print_only_allow_listed_settings():
    # given placeholders naming secrets and a timing setting
    text = " ".join(
        f"[[setting:{n}]]"
        for n in (
            "SECRET_KEY",
            "STRIPE_API_KEY",
            "STRIPE_WEBHOOK_SECRETS",
            "DATABASES",
            "RECONCILE_DEADLINE_SECONDS",
        )
    )

    # when substituted
    out = runbooks._substitute(text)

    # then no secret value appears; the timing does, in words
    for secret in (settings.SECRET_KEY, settings.STRIPE_API_KEY, *settings.STRIPE_WEBHOOK_SECRETS):
        assert secret not in out
    assert "(setting SECRET_KEY is not shown in runbooks)" in out
    assert runbooks.duration_words(settings.RECONCILE_DEADLINE_SECONDS) in out


def test_every_rendered_runbook_is_free_of_secrets(support_client):
    # given every runbook page as a support user sees it; then no secret is in any
    pages = [support_client.get(f"/console/runbooks/{slug}/") for slug in runbooks.runbook_slugs()]
    assert pages and all(p.status_code == 200 for p in pages)
    body = b"".join(p.content for p in pages).decode()
    assert settings.SECRET_KEY not in body and settings.STRIPE_API_KEY not in body


def test_audit_page_survives_a_purchase_id_with_a_slash(support_client):
    # given an audit row whose purchase id came from a signed event's metadata
    AuditEntry.objects.create(
        actor="fred",
        action="event_triage",
        target_type="event",
        target_id="evt_1",
        purchase_id="pur_x/../admin",
        reason="triaged",
    )
    AuditEntry.objects.create(
        actor="fred",
        action="note",
        target_type="purchase",
        target_id="pur_ok",
        purchase_id="pur_ok",
        reason="ok",
    )

    # when the audit page is read
    page = support_client.get("/console/audit/")

    # then it answers, links the well-formed id, and shows the other as text only
    assert page.status_code == 200
    assert b'href="/console/purchases/pur_ok/"' in page.content
    assert b'href="/console/purchases/pur_x' not in page.content
