"""How `make run` starts, before the banner: the first install says it is working, and
when a port it needs is taken (an earlier `make run`, another project's server) it says
which port, what uses it for, and how to choose another, exits non-zero at once and leaves
nothing running, instead of seeding, printing links and then looping on a server that
cannot bind. (Ctrl-C on a healthy run: tests/foundation/test_newcomer_smoke.py.)"""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from tools import x402_chain

from .serve import PORT_VARIABLES, ROOT, processes_of, serve_env, stop

SERVICES = ["web", "localstripe"] + (["chain", "facilitator"] if x402_chain.available() else [])
# A timeout, not a target: the check runs before anything starts (a few seconds).
EXIT_SECONDS = 60


@pytest.mark.parametrize("busy", SERVICES)
def test_a_taken_port_is_named_and_nothing_is_left_running(tmp_path, busy):
    var = tmp_path / "var"
    env = serve_env(var)
    port = int(env[PORT_VARIABLES[busy]])
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", port))
        other_program.listen()
        started = time.monotonic()
        proc = subprocess.Popen(
            ["make", "--no-print-directory", "serve"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            stop(proc, var)
            out, _ = proc.communicate()
            pytest.fail(
                f"make serve with port {port} taken still ran after {EXIT_SECONDS} s:\n"
                + out.decode(errors="replace")[-3000:]
            )
        finally:
            left = processes_of(var)
            stop(proc, var)
    text = out.decode(errors="replace")
    assert proc.returncode != 0, text
    assert time.monotonic() - started < EXIT_SECONDS
    assert f"port {port} is already in use" in text.lower() and PORT_VARIABLES[busy] in text, text
    assert "Traceback" not in text and "SIGKILL" not in text, text
    assert not (var / "verity.sqlite3").exists()  # stopped before migrating and seeding
    assert left == [], left


# Held for a second in the starter once each child is started, before `Popen` returns:
# the window in which a stop lost anvil's handle (rarely hit in CI, under load).
SLOW_SPAWN = """
import subprocess, time
_start = subprocess.Popen._execute_child
def _slow(self, *args, **kwargs):
    _start(self, *args, **kwargs)
    time.sleep(1.0)
subprocess.Popen._execute_child = _slow
"""


@pytest.mark.skipif(not x402_chain.available(), reason="no local chain (Node/tools/chain)")
@pytest.mark.parametrize("stopped", ["deploying", "starting_anvil"])
def test_the_chain_stopped_while_it_deploys_leaves_nothing_running(tmp_path, stopped):
    """honcho stops every process when one fails; the chain may be deploying its token
    then, or only starting anvil. Its anvil and facilitator run in sessions of their own:
    if they outlive it, they hold honcho's pipe open and honcho loops on SIGKILL, deaf to
    Ctrl-C."""
    var = tmp_path / "var"
    env = {**serve_env(var), "PYTHONUNBUFFERED": "1"}
    if stopped == "starting_anvil":
        (tmp_path / "slow").mkdir()
        (tmp_path / "slow" / "sitecustomize.py").write_text(SLOW_SPAWN)
        env["PYTHONPATH"] = str(tmp_path / "slow")
    proc = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/python"),
            "-m",
            "tools.x402_chain",
            "--port",
            env["X402_CHAIN_PORT"],
            "--facilitator-port",
            env["X402_FACILITATOR_PORT"],
            "--ready-file",
            str(var / "run" / "chain.ready"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not any("anvil" in line for line in processes_of(var)):
            assert proc.poll() is None and time.monotonic() < deadline, "anvil never started"
            time.sleep(0.05)
        assert not (var / "run" / "chain.ready").exists()  # still deploying
        proc.terminate()  # honcho's SIGTERM
        proc.wait(20)
        deadline = time.monotonic() + 10
        while processes_of(var) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_of(var) == []
    finally:
        stop(proc, var)


def test_the_first_install_says_it_is_working_before_the_long_step():
    # -n: print the recipe only; -W: as if the lock had changed (a fresh clone)
    plan = subprocess.run(
        ["make", "-n", "-W", "requirements-dev.lock", ".venv/.installed"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = plan.splitlines()
    said = next(i for i, line in enumerate(lines) if "Installing the Python dependencies" in line)
    install = next(i for i, line in enumerate(lines) if "pip install -q -r" in line)
    assert said < install, plan
