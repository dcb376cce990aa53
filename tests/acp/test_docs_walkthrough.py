"""docs/acp.md's walk-through, pasted verbatim into bash against this stack's live server
and localstripe (the only edits: their addresses, localstripe's key, and the platform's
API key instead of the `create_api_client` line, which would write to `make run`'s own
database). Effects counted: one purchase, one charge at localstripe, the second session
canceled with no purchase, the unused token never presented.

localstripe is shared by every test of a run (and `make run`'s by every paste): the test
first fills it with more than a page of other PaymentIntents, so a command that reads one
page only (`limit=100`) misses this purchase's, as it did in long runs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from acp.models import CheckoutSession
from payments.models import Purchase, PurchaseChannel
from tests.acp.tokens import spt_state
from tests.factories import ProductFactory

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "acp.md"
MAKE_RUN_KEY = (
    "$(DEBUG=true .venv/bin/python manage.py create_api_client my-agent-platform "
    "--scopes acp --limit 1000000 --currency usd | tail -1)"
)


def _blocks() -> list[str]:
    blocks = re.findall(
        r"^<!-- acp-walkthrough -->\n```bash\n(.*?)^```$", DOC.read_text(), re.M | re.S
    )
    assert len(blocks) >= 6, "docs/acp.md lost its marked blocks"
    return blocks


def _others_traffic(count: int) -> None:
    """PaymentIntents nobody in this walk-through made, created before it (oldest first)."""
    import requests

    for _ in range(count):
        r = requests.post(
            f"{settings.STRIPE_API_BASE.rstrip('/')}/v1/payment_intents",
            auth=(settings.STRIPE_API_KEY, ""),
            timeout=10,
            data={"amount": 100, "currency": "usd"},
        )
        assert r.status_code == 200, r.text


def test_the_acp_walkthrough_runs_as_written(live_server, platform, localstripe, tmp_path):
    ProductFactory(sku="TEA-001", name="Sencha green tea, 100 g", price=1250, stock=50)
    _others_traffic(101)
    blocks = _blocks()
    setup = blocks[0]
    for needle in (
        "http://127.0.0.1:8000",
        "http://127.0.0.1:8420",
        "sk_test_verity_local",
        MAKE_RUN_KEY,
    ):
        assert needle in setup, needle
    blocks[0] = (
        setup.replace("http://127.0.0.1:8000", live_server.url)
        .replace("http://127.0.0.1:8420", settings.STRIPE_API_BASE.rstrip("/"))
        .replace("sk_test_verity_local", settings.STRIPE_API_KEY)
        .replace(MAKE_RUN_KEY, platform[1])
    )
    script = "\n".join(
        [
            "set -euo pipefail",
            *blocks,
            'echo "WALKTHROUGH SESSION=$SESSION SESSION2=$SESSION2 ORDER=$ORDER '
            'SPT=$SPT SPT2=$SPT2"',
        ]
    )
    log = tmp_path / "acp-walkthrough.log"
    with open(log, "w") as out:
        done = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=120
        )
    output = log.read_text()
    assert done.returncode == 0, f"walk-through failed:\n{output}"
    found = dict(re.findall(r"(\w+)=(\S+)", output.rsplit("WALKTHROUGH", 1)[1]))

    purchase = Purchase.objects.get()
    assert purchase.id == found["ORDER"] and purchase.channel == PurchaseChannel.ACP
    assert purchase.amount == 2500
    assert [
        (pi["status"], pi["amount"]) for pi in localstripe.payment_intents_for(purchase.id)
    ] == [("succeeded", 2500)]
    assert spt_state(found["SPT"])["deactivated_reason"] == "consumed"
    assert spt_state(found["SPT2"])["deactivated_reason"] is None  # never presented
    second = CheckoutSession.objects.get(id=found["SESSION2"])
    assert second.purchase_id is None and second.canceled_at is not None
    for text in (
        "\nready_for_payment\n",
        "\ncompleted\n",
        "Idempotent-Replayed: true",
        "charges at the provider: [('pi_",
        "probable_duplicate_purchase",
        "\n405\n",
        "\ncanceled\n",
    ):
        assert text in output, (text, output)
