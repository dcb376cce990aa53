"""What a newcomer reads from `make run` and from commands in their own shell carries no
warning that is not theirs to act on: no SQLite index notes from the system check before
the demo is seeded, no kombu "No hostname was supplied" from every process that touches the
embedded broker (the worker, beat, `manage.py demo_unknown_payment` in the walk-through)."""

from __future__ import annotations

import os
import subprocess

from .serve import ROOT

PY = str(ROOT / ".venv" / "bin" / "python")
# What the on-commit kick does: publish a message (to a task no worker runs here).
TOUCH_BROKER = (
    "from config.celery import app\napp.send_task('verity.quiet_start_probe')\nprint('broker ok')"
)


def _clean_shell(var) -> dict[str, str]:
    # A person's shell in a development checkout: PATH and HOME, and what `make run`
    # writes to var/.env (DEBUG), nothing from the test stack.
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "VERITY_VAR_DIR": str(var),
        "DEBUG": "true",
    }


def _run(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [PY, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


def test_migrate_and_the_broker_start_without_warnings(tmp_path):
    env = _clean_shell(tmp_path / "var")
    out = _run(["migrate", "--noinput", "-v", "0"], env)
    assert "WARNINGS" not in out and "W040" not in out, out
    out = _run(["shell", "-c", TOUCH_BROKER], env)
    assert "broker ok" in out and "No hostname was supplied" not in out, out
