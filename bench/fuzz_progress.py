"""pytest plugin for `make fuzz`: a progress line — cases sent against the budget, tests
done, failures so far (each failure is named the moment it is seen).

    pytest -p bench.fuzz_progress tests/api/test_schema_conformance.py

Loaded with `-p`, it is imported before pytest captures output, so it keeps its own copy of
the real stderr and the line is visible while a test runs (hypothesis runs every example
of one operation inside one test). `-qq` or VERITY_PROGRESS=0 turns it off.
"""

from __future__ import annotations

import os

import schemathesis

from tools.progress import Progress

# A duplicate of fd 2 taken before pytest's capture redirects it.
_TERM = os.fdopen(os.dup(2), "w", buffering=1)
_state = {"cases": 0, "failures": 0, "done": 0, "total": 0, "current": ""}
_progress: Progress | None = None


@schemathesis.hook
def after_call(context, case, response):
    _state["cases"] += 1


def _budget() -> int:
    return _state["total"] * int(os.environ.get("VERITY_FUZZ_EXAMPLES", "5"))


def _status() -> str:
    if not _state["total"]:
        return "collecting the schema's operations"
    # schemathesis names each operation's test `…[METHOD /path]` when it can.
    nodeid = _state["current"]
    current = nodeid.rsplit("[", 1)[-1].rstrip("]") if nodeid.endswith("]") else ""
    return (
        f"cases {_state['cases']:,} of a budget of ~{_budget():,} "
        f"({_state['total']} operations x {os.environ.get('VERITY_FUZZ_EXAMPLES', '5')} "
        f"examples, plus schema examples); tests {_state['done']}/{_state['total']}; "
        f"{_state['failures']} failure(s)" + (f"; now {current[:60]}" if current else "")
    )


def pytest_configure(config):
    global _progress
    quiet = config.getoption("verbose") < -1
    _progress = Progress(_status, label="fuzz", quiet=quiet, stream=_TERM).start()


def pytest_collection_modifyitems(session, config, items):
    _state["total"] = len(items)


def pytest_runtest_logstart(nodeid, location):
    _state["current"] = nodeid


def pytest_runtest_logreport(report):
    if report.failed:
        _state["failures"] += 1
        if _progress is not None:
            _progress.note(f"FAILED {report.nodeid} ({report.when})")
    if report.when == "teardown":
        _state["done"] += 1


def pytest_unconfigure(config):
    if _progress is not None:
        _progress.stop()
