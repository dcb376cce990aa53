"""The soak's paid -> completed table (bench/soak_report.py): which purchases each series
counts, from rows made here (the soak reads them from the database)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.soak_report import Fault, Fulfilment, paid_to_completed  # noqa: E402


def test_a_purchase_a_fault_touched_counts_only_among_all():
    rows = [
        Fulfilment(paid=1.0, fulfilling=1.2, completed=1.3, status="completed"),
        Fulfilment(paid=2.0, fulfilling=2.5, completed=2.6, status="completed"),
        # a worker was killed at 10 s, while this one waited: only "all" counts it
        Fulfilment(paid=9.0, fulfilling=14.0, completed=14.2, status="completed"),
        # paid during the drain's restart: not paid while driving
        Fulfilment(paid=31.0, fulfilling=31.5, completed=31.6, status="completed"),
        Fulfilment(paid=5.0, fulfilling=None, completed=None, status="manual_review"),
    ]
    table, figures = paid_to_completed(
        rows,
        {"order": [0.01, 0.02]},
        faults=[Fault(t=10.0, kind="worker_sigkill")],
        drove=30.0,
        restarted=33.0,
    )
    assert figures["paid_while_driving"] == 4
    assert figures["completed"] == 3
    assert figures["paid -> completed, all"]["n"] == 3
    assert figures["paid -> completed, all"]["max_ms"] == 5200
    clear = figures["paid -> completed, no fault"]
    assert clear["n"] == 2 and clear["max_ms"] == 600
    assert figures["paid -> fulfilling (to a worker)"]["max_ms"] == 500
    assert figures["fulfilling -> completed (steps)"]["n"] == 2
    assert figures["step order"]["n"] == 2
    assert figures["not_completed"] == {"manual_review": 1}
    assert "paid while driving, not completed: manual_review 1" in table
