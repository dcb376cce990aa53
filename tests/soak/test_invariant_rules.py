"""bench/invariants.py is a registry of rules, one function each: a soak violation names the
rule it broke, and each rule runs in the phase it holds in (during the run, after the drain,
or both)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import invariants  # noqa: E402
from bench.invariants import INVARIANTS, Report, When  # noqa: E402


def test_each_rule_is_one_registered_function_with_a_unique_name():
    rules = [i.rule for i in INVARIANTS]
    assert len(rules) == len(set(rules)) >= 20
    assert len({i.fn for i in INVARIANTS}) == len(INVARIANTS)
    live = {i.rule for i in INVARIANTS if i.when is not When.DRAINED}
    drained = {i.rule for i in INVARIANTS if i.when is not When.LIVE}
    # The rules that hold at every instant are checked during the run as well.
    assert {
        "provider-objects-known",
        "charged-twice-compensated",
        "effects-once-live",
        "x402-one-transfer-per-purchase",
    } <= live
    assert {
        "paid-purchase-fulfilled-once",
        "ledger-matches-provider-balance",
        "outbox-drains",
        "effects-once",
    } <= drained
    assert "effects-once-live" not in drained


def test_a_violation_names_its_rule_in_the_list_and_in_the_table():
    rep = Report()
    rep.invariant = "charged-never-failed"
    rep.add("charged at provider but failed at Verity", 1, "must be 0", ok=False)
    rep.add("provider refunds", 3)
    assert rep.violations == [
        "[charged-never-failed] charged at provider but failed at Verity = 1 (must be 0)"
    ]
    name, value, rule = rep.rows[0]
    assert rule.endswith("VIOLATION") and "[charged-never-failed]" in rule
    assert rep.rows[1] == ("provider refunds", "3", "")


def test_registering_a_rule_twice_is_refused():
    before = list(INVARIANTS)
    try:
        invariants.invariant("outbox-drains")(lambda f, rep: None)
    except ValueError as e:
        assert "twice" in str(e)
    else:
        raise AssertionError("a second 'outbox-drains' was registered")
    assert INVARIANTS == before
