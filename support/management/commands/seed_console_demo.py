"""`python manage.py seed_console_demo`: demo cases for every console queue and one
status-page link per customer state (idempotent; development databases only)."""

from django.conf import settings
from django.core.management.base import BaseCommand

from support.demo import demo_cases_seed


class Command(BaseCommand):
    help = "Create demo console cases and print one status-page link per state."

    def handle(self, *args, **options):
        from payments.models import Purchase
        from support.customer_copy import customer_state

        links = demo_cases_seed()
        self.stdout.write(
            "Customer status pages (one per state; the headline is what the page shows):"
        )
        for name, url in links:
            token = url.rstrip("/").rsplit("/", 1)[-1]
            state = customer_state(Purchase.objects.get(status_token=token))
            self.stdout.write(f"  {name:26} {state.headline}\n  {'':26} {url}")
        # `make run`'s banner prints them again once every service is up.
        links_file = settings.VAR_DIR / "demo-status-links"
        links_file.parent.mkdir(parents=True, exist_ok=True)
        links_file.write_text("".join(f"{name} {url}\n" for name, url in links))
