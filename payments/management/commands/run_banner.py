"""Printed by `make run` once the web server answers: where to go and a working curl line."""
import time
import urllib.request

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Wait for the web server, print the URLs, then idle (honcho stops all on exit)."

    def handle(self, *args, **options):
        base = "http://127.0.0.1:8000"
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        key_file = settings.BASE_DIR / "var" / "demo-api-key"
        key = key_file.read_text().strip() if key_file.exists() else "<key from seed_demo>"
        self.stdout.write(
            "\n".join([
                "",
                "Verity is running:",
                f"  console     {base}/console/   (support1 / support-demo-pass)",
                f"  API docs    {base}/api/docs/",
                f"  health      {base}/healthz",
                "  status page printed as status_url in every purchase view",
                "Try:",
                f"  curl -s -H 'Authorization: Api-Key {key}' {base}/api/v1/products",
                "Ctrl-C stops everything.",
                "",
            ])
        )
        while True:
            time.sleep(3600)
