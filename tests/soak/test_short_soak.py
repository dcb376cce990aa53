"""The chaos soak, short and seeded, so a regression fails CI (the long run is `make soak`).

60 s of driving with every fault kind, the first two being a PostgreSQL restart
(`pg_ctl restart -m immediate`, on a cluster that commits synchronously as production must:
with `synchronous_commit=off` the crash lost a webhook Verity had already accepted) and a
gunicorn worker SIGKILLed mid-request; a provider outage of 8-12 s instead of 30-60 s so
the drain fits in CI.

Wrong manual resolutions are on (20 %, as in `make soak`): the provider's record must win
over a person's wrong word — read back before the resolution and, when the provider could
not be read then, on the reconcile schedule afterwards. The provider's desk
refunds and disputes charges at the provider directly (signed events, redelivered until a
2xx): a refund of a charge whose answer Verity lost waits for Verity's record instead of
being quarantined (seen twice in CI before the fix), and a won dispute resumes the
fulfilment it paused. Finance declines some refunds.

When Node/npm and tools/chain/node_modules are present (`bench.soak.x402_available`), the
run also starts the chain and the x402 facilitator (behind its fault proxy: an outage and
dropped answers) and a seeded fifth of the agents buy reports over x402: at least one x402
payment must be made, and the chain's transfers must match Verity's rows.

It runs in both card payment modes: create then confirm (a provider that does not dedupe
keys), and one round trip (`--one-call`: localstripe's idempotency layer on and
STRIPE_DEDUPES_KEYS) — every provider write of a card payment then the `pay` step.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from bench.soak import x402_available  # noqa: E402


@pytest.mark.parametrize("mode", ["two_step", "one_call"])
def test_short_chaos_soak_holds_every_invariant(tmp_path, mode):
    result = subprocess.run(
        [
            sys.executable,
            "bench/soak.py",
            "--seconds",
            "60",
            "--agents",
            "20",
            "--seed",
            "7",
            "--drain",
            "120",
            "--outage",
            "8,12",
            "--wrong-resolutions",
            "0.2",
            "--out",
            str(tmp_path),
            *(["--one-call"] if mode == "one_call" else []),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(result.stdout[-8000:], result.stderr[-3000:])
    out = result.stdout
    assert "max charges per purchase" in out
    faults = out.split("== faults", 1)[1].split("== invariants", 1)[0]
    for kind in (
        "pg_restart",
        "web_kill",
        "provider_outage",
        "redis_restart",
        "worker_sigkill",
        "halt",
    ):
        assert re.search(rf"\s{kind}\s", faults), f"no {kind} in the fault log"
    if x402_available():
        assert re.search(r"\sfacilitator_outage\s", faults), "no facilitator outage"
        paid = re.search(r"x402 payments made \(succeeded\)\s+(\d+)", out)
        assert paid and int(paid.group(1)) >= 1, "no x402 payment was made"
        moved = re.search(r"x402 transfers on chain \(to pay_to\)\s+(\d+)", out)
        assert moved and int(moved.group(1)) >= 1, "no x402 transfer on chain"
    assert "== per endpoint ==" in out and "POST /api/v1/purchases/{pur}/payments" in out
    # progress reached stderr at once and the live checks ran
    assert "soak [0:00]" in result.stderr
    assert re.search(r"== invariants: [1-9]\d* live checks", out)
    assert (tmp_path / "soak.svg").read_text().startswith("<?xml")
    assert result.returncode == 0, out[-4000:]
    # the mode took effect: the provider's card payment writes are the mode's steps
    figures = json.loads((tmp_path / "soak.json").read_text())
    steps = figures["dispatch_calls_by_step"]
    if mode == "one_call":
        assert steps.get("pay", 0) > 0 and "create" not in steps and "confirm" not in steps, steps
    else:
        assert steps.get("create", 0) > 0 and "pay" not in steps, steps
    # paid -> completed, from the rows: the purchases paid while it drove did complete
    assert "== paid -> completed" in out
    assert figures["paid_to_completed"]["completed"] > 0, figures["paid_to_completed"]
