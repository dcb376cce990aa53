"""Printed by `make run` once every service is up: where to go, every demo credential and
a working curl line — as the last thing on screen (the worker and beat log at WARNING and
gunicorn's access log goes to var/log/, so nothing scrolls it away while idle)."""

import socket
import time
import urllib.request
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand

from support.demo import demo_provider_payments_seed

from .seed_demo import DEMO_CLIENT, demo_users

WAIT_SECONDS = 240


class Command(BaseCommand):
    help = "Wait for web, localstripe, worker and beat, print the banner, then idle."

    def handle(self, *args, **options):
        base = settings.PUBLIC_BASE_URL.rstrip("/")
        provider = urlsplit(settings.STRIPE_API_BASE or "")
        run_dir = settings.VAR_DIR / "run"
        waiting = {
            "web": lambda: _http_ok(f"{base}/healthz"),
            "localstripe": lambda: _port_open(provider.hostname, provider.port),
            "worker": lambda: (run_dir / "worker.ready").exists(),
            "beat": lambda: (run_dir / "beat.ready").exists(),
        }
        if settings.X402_LOCAL_CHAIN:  # make run started the x402 chain (Node present)
            waiting["x402 chain"] = lambda: (run_dir / "chain.ready").exists()
        deadline = time.monotonic() + WAIT_SECONDS
        while waiting and time.monotonic() < deadline:
            waiting = {name: up for name, up in waiting.items() if not up()}
            time.sleep(0.5)
        demo_payment = ""
        if "localstripe" not in waiting:
            # localstripe starts empty on every run: the refund awaiting approval needs a
            # real payment there before finance can approve it (support.demo).
            try:
                demo_payment = demo_provider_payments_seed() or ""
            except Exception as exc:  # the banner still prints; say what is missing
                demo_payment = f"not created ({exc})"
            else:
                _wait_for_webhook(demo_payment)  # its log line goes above the banner
        time.sleep(1.0)  # let the last start-up lines of the others reach the screen
        key_file = settings.VAR_DIR / "demo-api-key"
        key = key_file.read_text().strip() if key_file.exists() else "<run seed_demo>"
        links_file = settings.VAR_DIR / "demo-status-links"
        links = links_file.read_text().splitlines() if links_file.exists() else []
        lines = ["", "=" * 78]
        if waiting:
            lines.append(
                f"NOT UP after {WAIT_SECONDS} s: {', '.join(sorted(waiting))} (see the lines above)"
            )
        lines += [
            "Verity is running:",
            f"  console        {base}/console/",
            f"  API docs       {base}/api/docs/",
            f"  health         {base}/healthz   {base}/readyz   {base}/metrics",
            "Console users (development passwords):",
            *[f"  {role:9} {username} / {password}" for role, username, password in demo_users()],
            f"Demo API key (client {DEMO_CLIENT}, also in {key_file}):",
            f"  {key}",
            "Customer status pages (one per state):",
            *[
                f"  {line.split(' ', 1)[0]:26} {line.split(' ', 1)[1]}"
                for line in links
                if " " in line
            ],
            *(
                [
                    f"Demo refund awaiting approval (finance approves it in the console): its "
                    f"payment is localstripe PaymentIntent {demo_payment}"
                ]
                if demo_payment
                else []
            ),
            _x402_line(),
            "Try:",
            f"  curl -s -H 'Authorization: Api-Key {key}' {base}/api/v1/products",
            f"Logs: requests in {settings.VAR_DIR / 'log' / 'access.log'}, localstripe's "
            f"webhook deliveries in {settings.VAR_DIR / 'log' / 'localstripe-deliveries.log'}",
            "Ctrl-C stops everything.",
            "=" * 78,
        ]
        self.stdout.write("\n".join(lines))
        self.stdout.flush()
        while True:
            time.sleep(3600)


def _wait_for_webhook(object_id: str, timeout: float = 10.0) -> None:
    """Until localstripe's webhook for the demo payment has been stored (or `timeout`)."""
    from webhooks.models import ProviderEvent

    deadline = time.monotonic() + timeout
    while (
        object_id
        and time.monotonic() < deadline
        and not ProviderEvent.objects.filter(object_id=object_id).exists()
    ):
        time.sleep(0.2)


def _x402_line() -> str:
    """Whether the x402 rail is on, or how to turn it on (it needs Node for the chain)."""
    if settings.X402_ENABLED and settings.X402_ASSET:
        return (
            f"x402 rail: on ({settings.X402_NETWORK}, facilitator "
            f"{settings.X402_FACILITATOR_URL}, chain {settings.X402_RPC_URL})"
        )
    return (
        "x402 rail: off. Install Node/npm (e.g. apt-get install nodejs npm) and run "
        "`make run` again: it installs tools/chain and starts the chain and facilitator."
    )


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def _port_open(host: str | None, port: int | None) -> bool:
    if not host or not port:
        return True  # real Stripe: nothing local to wait for
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
