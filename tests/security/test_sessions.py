"""Console sessions end 30 minutes idle and 12 h after login at most
(ASVS V3.3), and the session cookie is Secure outside development. Effects counted:
sessions in the database and whether the console answers or sends to the login page."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.contrib.sessions.models import Session

from config.sessions import LOGIN_AT, SEEN_AT
from support.access import Role, ensure_groups

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def signed_in(client):
    ensure_groups()
    user = User.objects.create_user(username="sam", password="unused-in-this-test")
    user.groups.add(Group.objects.get(name=Role.SUPPORT))
    client.force_login(user)
    assert client.get("/console/").status_code == 200
    return client


def _age(client, key: str, seconds: float) -> None:
    session = client.session
    session[key] = session[key] - seconds
    session.save()


def test_a_session_idle_for_30_minutes_is_over(signed_in):
    # given a console session last used 31 minutes ago
    _age(signed_in, SEEN_AT, 31 * 60)
    old_key = signed_in.cookies["sessionid"].value

    # when it is used again
    answer = signed_in.get("/console/")

    # then it goes to the login page and the session row is gone
    assert answer.status_code == 302 and answer["Location"].startswith("/console/login/")
    assert not Session.objects.filter(session_key=old_key).exists()
    assert "_auth_user_id" not in signed_in.session


def test_an_active_session_still_ends_12_hours_after_login(signed_in):
    # given a session in use all along (seen a minute ago) that began 12 h 1 min ago
    _age(signed_in, LOGIN_AT, 12 * 3600 + 60)

    # when it is used again; then it is over
    answer = signed_in.get("/console/")
    assert answer.status_code == 302 and answer["Location"].startswith("/console/login/")


def test_a_session_in_use_stays_open(signed_in):
    # given a session used 29 minutes ago, begun 11 h ago; when used; then it answers
    _age(signed_in, SEEN_AT, 29 * 60)
    _age(signed_in, LOGIN_AT, 11 * 3600)
    assert signed_in.get("/console/").status_code == 200


def _setting(name: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("DEBUG", name)}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django,os;"
            "os.environ.setdefault('DJANGO_SETTINGS_MODULE','config.settings');"
            f"django.setup();from django.conf import settings;print(settings.{name})",
        ],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip()


def test_session_cookie_is_secure_outside_development():
    # given no SESSION_COOKIE_SECURE in the environment; then it follows DEBUG
    assert _setting("SESSION_COOKIE_SECURE") == "True"
    assert _setting("SESSION_COOKIE_SECURE", DEBUG="true") == "False"
    assert _setting("SESSION_COOKIE_AGE") == str(12 * 3600)
