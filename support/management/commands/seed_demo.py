"""Idempotent demo data for `make run`: catalogue, an API client, one user per role."""

import os

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from payments.clients import SCOPES, api_client_create
from payments.models import ApiClient, Product
from support.access import Role, ensure_groups

CATALOGUE = [
    ("TEA-001", "Sencha green tea, 100 g", 1250, 50, "physical"),
    ("MUG-002", "Stoneware mug", 1800, 20, "physical"),
    ("EBOOK-003", "Brewing guide (PDF)", 900, 100000, "digital"),
]
DEMO_CLIENT = "demo-storefront"


def demo_users() -> list[tuple[str, str, str]]:
    """(role, username, development password) of the demo console users; the banner of
    `make run` prints the same list."""
    return [(role.value, f"{role.value}1", f"{role.value}-demo-pass") for role in Role]


class Command(BaseCommand):
    help = "Create the demo catalogue, an API client and console users (idempotent)."

    def handle(self, *args, **options):
        for sku, name, price, stock, kind in CATALOGUE:
            Product.objects.get_or_create(
                sku=sku,
                defaults={
                    "name": name,
                    "price": price,
                    "currency": "usd",
                    "stock": stock,
                    "kind": kind,
                },
            )
        key_file = settings.VAR_DIR / "demo-api-key"
        if not ApiClient.objects.filter(name=DEMO_CLIENT).exists() or not key_file.exists():
            ApiClient.objects.filter(name=DEMO_CLIENT).update(revoked=True)
            _, key = api_client_create(
                name=DEMO_CLIENT,
                scopes=list(SCOPES),
                limit=100_000,
                currency="usd",
                auto_refund_limit=5_000,
            )
            key_file.parent.mkdir(parents=True, exist_ok=True)
            key_file.write_text(key)
            os.chmod(key_file, 0o600)
        key = key_file.read_text().strip()

        ensure_groups()
        User = get_user_model()
        lines = []
        for role, username, password in demo_users():
            # Development-only passwords, printed for the demo; production users are
            # created by an administrator.
            user, created = User.objects.get_or_create(username=username)
            if created:
                user.set_password(password)
                user.save(update_fields=["password"])
            user.groups.add(Group.objects.get(name=role))
            lines.append(f"  {role:9} {user.username} / {password}")
        self.stdout.write("Demo data ready.")
        self.stdout.write("Console users (development passwords):")
        self.stdout.write("\n".join(lines))
        self.stdout.write(f"Demo API key (client {DEMO_CLIENT}):")
        self.stdout.write(key)
