"""The login lockout counts the username as Django authenticates it,
covers /admin/, says how long it lasts, and keys on the client behind trusted proxies.
Effects counted: LoginFailure rows and whether a session was opened."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import Client

from support.models import LoginFailure
from support.services import LOGIN_FAILURES_PER_IP, LOGIN_FAILURES_PER_USERNAME

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"


@pytest.fixture
def olga(db):
    return get_user_model().objects.create_user(username="olga", password=PASSWORD, is_staff=True)


def _signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_username_variants_share_one_lockout(olga):
    # given five wrong passwords, each under a different spelling of olga, from many IPs
    variants = ["olga", "olga ", " olga", "\uff4flga", "OLGA"]
    for i, name in enumerate(variants):
        Client(REMOTE_ADDR=f"198.51.100.{i}").post(
            "/console/login/", {"username": name, "password": "wrong"}
        )

    # when the right password comes under yet another variant from a fresh address
    client = Client(REMOTE_ADDR="203.0.113.9")
    answer = client.post("/console/login/", {"username": " \uff4flga", "password": PASSWORD})

    # then the lockout holds, says for how long, and no session was opened
    assert LoginFailure.objects.filter(username="olga").count() == LOGIN_FAILURES_PER_USERNAME
    assert answer.status_code == 429
    assert 0 < int(answer["Retry-After"]) <= 15 * 60
    assert b"Try again in 15 minutes" in answer.content
    assert not _signed_in(client)


def test_admin_login_is_behind_the_same_lockout(olga):
    # given an attacker guessing at the admin login
    client = Client(REMOTE_ADDR="198.51.100.77")
    answers = [
        client.post("/admin/login/", {"username": "olga", "password": f"guess{i}"})
        for i in range(LOGIN_FAILURES_PER_USERNAME + 3)
    ]

    # when the right password arrives afterwards
    last = client.post("/admin/login/", {"username": "olga", "password": PASSWORD})

    # then failures were recorded, further tries refused, and the admin never opened
    assert LoginFailure.objects.filter(username="olga").count() == LOGIN_FAILURES_PER_USERNAME
    assert [a.status_code for a in answers].count(429) == 3
    assert last.status_code == 429 and not _signed_in(client)


def test_console_failures_lock_the_admin_too(olga):
    # given the username locked through the console
    for i in range(LOGIN_FAILURES_PER_USERNAME):
        Client().post("/console/login/", {"username": "olga", "password": f"x{i}"})

    # when the admin login is tried with the right password
    client = Client()
    answer = client.post("/admin/login/", {"username": "olga", "password": PASSWORD})

    # then it is refused as well
    assert answer.status_code == 429 and not _signed_in(client)


def test_password_policy_rejects_short_and_common_passwords(olga):
    # given Django's validators as configured; when weak passwords are checked; then refused
    olga.email = "olga.petrova@example.com"
    for weak in ("a", "password1234", "olga.petrova@example", "123456789012"):
        with pytest.raises(ValidationError):
            validate_password(weak, user=olga)
    validate_password("violet-tarmac-quiver-42", user=olga)


def test_behind_a_trusted_proxy_each_client_has_its_own_lockout(olga, settings):
    # given one reverse proxy in front (every request arrives from its address)
    settings.TRUSTED_PROXY_COUNT = 1
    proxy = "10.0.0.2"
    attacker = Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="1.2.3.4, 192.0.2.66")
    for i in range(LOGIN_FAILURES_PER_IP):
        attacker.post("/console/login/", {"username": f"nobody{i}", "password": "x"})

    # when another customer of the same proxy logs in correctly
    client = Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="192.0.2.10")
    answer = client.post("/console/login/", {"username": "olga", "password": PASSWORD})

    # then the attacker's address (the entry the proxy appended, not the spoofed one) is
    # locked, the other client is not
    assert set(LoginFailure.objects.values_list("ip", flat=True)) == {"192.0.2.66"}
    assert answer.status_code == 302 and _signed_in(client)
    again = attacker.post("/console/login/", {"username": "olga", "password": PASSWORD})
    assert again.status_code == 429
