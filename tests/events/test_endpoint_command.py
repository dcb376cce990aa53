"""The webhook_endpoint command: create prints the secret once (its last line), list and
disable never print it, and a private address is refused as the API refuses it."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from events.models import WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)


def _run(*args) -> str:
    out = StringIO()
    call_command("webhook_endpoint", *args, stdout=out)
    return out.getvalue()


def test_create_list_disable(shop, receiver, loopback_allowed):
    created = _run(
        "create",
        "--client",
        shop.client.name,
        "--url",
        receiver.url,
        "--types",
        "payment.resolved,purchase.completed",
    )
    secret = created.strip().splitlines()[-1]
    assert secret.startswith("whsec_")
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.event_types == ["payment.resolved", "purchase.completed"]
    listed = _run("list", "--client", shop.client.prefix)
    assert endpoint.id in listed and secret not in listed
    said = _run("disable", endpoint.id, "--reason", "maintenance")
    assert secret not in said
    assert not WebhookEndpoint.objects.get().enabled


def test_a_private_address_is_refused(shop, settings):
    settings.WEBHOOK_ALLOW_LOOPBACK = False
    with pytest.raises(CommandError):
        _run("create", "--client", shop.client.name, "--url", "https://10.1.2.3/hooks")
    assert WebhookEndpoint.objects.count() == 0
