"""`make drill` (`python -m tools.drill [--quiet]`): every fault drill against the configured
test-mode provider, one fresh purchase each; exits non-zero on any double charge or
evidence-free settlement. The drills themselves are `payments.drills` (the runtime's
fault-drill HTTP client); this is the development command around them, with its progress
line (drills done / failures so far, on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys


class DrillFailed(Exception):
    """The drills could not run (refused for this provider) or one violated a rule."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.drill", description=__doc__)
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress line (drills done / failures so far, on stderr)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    drills_print(quiet=args.quiet)


def drills_print(*, quiet: bool = False, out=None) -> None:
    """Run every drill, print one row each; raise DrillFailed on a refusal or violation."""
    # Imported here, not at the top: `main` sets Django up first (models need the app
    # registry), and tests call this with Django already set up.
    from payments.drills import DRILLS, drills_run
    from payments.providers.stripe import DrillRefused
    from tools.progress import Progress

    out = out or sys.stdout
    rows = []
    state = {"current": ""}

    def status() -> str:
        failures = sum(1 for r in rows if r.violation)
        return f"drills {len(rows)}/{len(DRILLS)} done, {failures} failure(s)" + (
            f"; running {state['current']}" if state["current"] else ""
        )

    # One drill at a time, so the progress line can say which one is running.
    with Progress(status, label="drill", quiet=quiet) as progress:
        for mode in DRILLS:
            state["current"] = str(mode)
            try:
                (row,) = drills_run(modes=[mode])
            except DrillRefused as exc:
                raise DrillFailed(str(exc)) from exc
            rows.append(row)
            if row.violation:
                progress.note(
                    f"VIOLATION in drill {row.drill} (purchase {row.purchase}): {row.violation}"
                )
        state["current"] = ""
    header = f"{'drill':26} {'recorded':10} {'charges':>7}  {'after reconcile':16} verification"
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        print(
            f"{r.drill:26} {r.recorded:10} {r.charges:>7}  {r.after_reconcile:16} "
            f"{r.verification}" + (f"   VIOLATION: {r.violation}" if r.violation else ""),
            file=out,
        )
    bad = [r for r in rows if r.violation]
    if bad:
        raise DrillFailed(f"{len(bad)} drill(s) violated an invariant")
    print("one charge at most per purchase; no unknown settled without evidence", file=out)
    left = [r for r in rows if r.after_reconcile == "unknown"]
    if left:
        # Left on purpose (absence of evidence is not failure): say where they are so
        # nobody mistakes them for a real incident.
        print(
            f"{len(left)} drill operation(s) stay unknown and remain in the console's "
            "Unknown operations queue (customer references drill-…): "
            + ", ".join(r.purchase for r in left),
            file=out,
        )


if __name__ == "__main__":
    try:
        main()
    except DrillFailed as exc:
        sys.exit(f"drill: {exc}")
