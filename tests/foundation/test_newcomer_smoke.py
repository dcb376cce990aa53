"""The newcomer's first run, end to end: boot exactly what `make run` boots (`make serve`:
the same Makefile recipe, Procfile.dev and settings — SQLite in a temporary var/, the
filesystem broker, localstripe, gunicorn, a Celery worker and beat) on free ports, then
paste the walk-through's blocks (docs/walkthrough.md), verbatim and in order, into bash.

It asserts effects, not answers: every signed delivery localstripe made was a 2xx by
localstripe's own account and is stored once in the SQLite database; one charge per
purchase at localstripe; the unknown payment from the drill ends `completed`; a console
user logs in; the status page opens; the banner is the last thing on screen. This is the
embedded default's only test on SQLite, and it runs in `make test`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.localstripe import Localstripe
from tools import x402_chain

from .serve import ROOT, processes_of, serve_env, stop

WALKTHROUGH = ROOT / "docs" / "walkthrough.md"
# A timeout, not a target: a quiet 2-core machine boots in 30-60 s, a fresh clone's first
# boot (no bytecode yet) on a loaded one took 120 s.
BOOT_SECONDS = 240
BANNER_END = "Ctrl-C stops everything."
# With Node (tools/chain installed) `make serve` starts the x402 chain and facilitator too.
X402_LOCAL = x402_chain.available()


def walkthrough_blocks() -> list[str]:
    """docs/walkthrough.md's bash blocks marked `<!-- walkthrough -->`, in order."""
    blocks = re.findall(
        r"^<!-- walkthrough -->\n```bash\n(.*?)^```$", WALKTHROUGH.read_text(), re.M | re.S
    )
    assert len(blocks) >= 10, "docs/walkthrough.md lost its marked blocks"
    return blocks


def _honcho_text(line: str) -> str:
    # "09:38:39 banner.1      | text" -> "text"
    return line.split("| ", 1)[1] if "| " in line else line


@pytest.fixture
def embedded(tmp_path):
    """`make serve` on free ports with a temporary var/; yields (env, base URL, var dir,
    output file, the make process)."""
    var = tmp_path / "var"
    env = serve_env(var)
    web_port = env["VERITY_PORT"]
    out_path = tmp_path / "make-serve.log"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            ["make", "--no-print-directory", "serve"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + BOOT_SECONDS
        while BANNER_END not in out_path.read_text(errors="replace"):
            assert proc.poll() is None, "make serve exited:\n" + out_path.read_text()[-4000:]
            assert time.monotonic() < deadline, (
                f"no banner after {BOOT_SECONDS:.0f} s:\n" + out_path.read_text()[-4000:]
            )
            time.sleep(0.5)
        yield env, f"http://127.0.0.1:{web_port}", var, out_path, proc
    finally:
        stop(proc, var)


# The reader's own shell: nothing of make's or the test's environment, only what a login
# shell has. VERITY_VAR_DIR stands for "this checkout's var/" (the test's make serve runs
# in a temporary one); it is the only addition.
SHELL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def readers_shell(var: Path) -> dict[str, str]:
    home = var.parent / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": SHELL_PATH, "HOME": str(home), "VERITY_VAR_DIR": str(var)}


def _assigned(block: str) -> list[str]:
    """The shell variables a block sets (comment lines excluded)."""
    return [
        m.group(1)
        for line in block.splitlines()
        if not line.lstrip().startswith("#")
        for m in [re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)=", line)]
        if m
    ]


def run_walkthrough(base: str, var: Path) -> dict[str, str]:
    blocks = walkthrough_blocks()
    setup = blocks[0]
    # The only edits: this stack's port and var/ instead of make run's fixed ones.
    assert "B=http://127.0.0.1:8000/api/v1" in setup and "$(cat var/demo-api-key)" in setup
    blocks[0] = setup.replace("http://127.0.0.1:8000", base).replace(
        "$(cat var/demo-api-key)", f"$(cat {var}/demo-api-key)"
    )
    # After each block: every variable it set is non-empty (a command that printed nothing
    # would otherwise send the next curls to /operations/ with no id).
    checked = []
    for n, block in enumerate(blocks, 1):
        checked.append(block)
        for name in _assigned(block):
            checked.append(
                f'[ -n "${{{name}:-}}" ] || {{ echo "EMPTY VARIABLE {name} after '
                f'block {n}" >&2; exit 97; }}'
            )
    script = "\n".join(
        [
            "set -euo pipefail",
            *checked,
            'echo "WALKTHROUGH PURCHASE=$PURCHASE OP=$OP '
            "UNKNOWN_PURCHASE=$UNKNOWN_PURCHASE UNKNOWN_OP=$UNKNOWN_OP "
            'PURCHASE2=$PURCHASE2 DECLINED=$DECLINED"',
        ]
    )
    # Answers go to one regular file, as `… 2>&1 | tee` or a terminal log would: a block
    # that reopens /dev/stderr (and so truncates that file) shows up as lost answers.
    log = var.parent / "walkthrough.log"
    with open(log, "w") as out:
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            env=readers_shell(var),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=180,
        )
    output = log.read_text()
    assert "Traceback" not in output and "EMPTY VARIABLE" not in output, output
    assert done.returncode == 0, f"walk-through failed:\n{output}"
    for answer in (
        '"sku":"TEA-001"',
        "Idempotent-Replayed: true",
        "idempotency_key_reused",
        "already_paid",
        "idempotency_key_required",
        "outcome=unknown",
        '"code":"card_declined"',
        '"retry_of":',
    ):
        assert answer in output, f"{answer} missing from the walk-through's answers:\n{output}"
    last = [line for line in output.splitlines() if line.startswith("WALKTHROUGH ")][-1]
    ids = dict(pair.split("=", 1) for pair in last.split()[1:])
    assert all(ids.values()), ids
    return ids


def run_the_other_key_line(base: str, var: Path) -> None:
    """The setup block's commented alternative (a key of your own), uncommented, as pasted."""
    (line,) = [
        line.lstrip("# ").split("   #")[0]
        for line in walkthrough_blocks()[0].splitlines()
        if line.startswith("# KEY=$(")
    ]
    script = "\n".join(
        [
            "set -euo pipefail",
            line,
            '[ -n "$KEY" ]',
            f'curl -sf -H "Authorization: Api-Key $KEY" {base}/api/v1/products',
        ]
    )
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env=readers_shell(var),
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in said, f"{line}\n{said}"
    assert '"sku":"TEA-001"' in said.replace(" ", ""), said


def run_the_documented_mcp_config(var: Path) -> None:
    """docs/mcp.md's stdio configuration, as an MCP host runs it (the official client:
    the SDK's default inherited variables plus the config's `env`, nothing else), with
    its placeholders filled: this checkout's path and the demo key."""
    import anyio
    from mcp import Client, StdioServerParameters

    text = (ROOT / "docs" / "mcp.md").read_text()
    config = json.loads(re.search(r"```json\n(\{\n  \"mcpServers\".*?)```", text, re.S).group(1))
    server = json.loads(
        json.dumps(config["mcpServers"]["verity"])
        .replace("/path/to/verity", str(ROOT))
        .replace("<the demo API key>", (var / "demo-api-key").read_text().strip())
    )
    assert set(server["env"]) == {"VERITY_API_KEY"}, server  # what a reader copies
    # The SDK's client passes its safe defaults (HOME, PATH, …) from this process: give it
    # the reader's shell's, and this checkout's var/ (the only addition, as above).
    shell = readers_shell(var)
    params = StdioServerParameters(
        command=server["command"],
        args=server["args"],
        env={**server["env"], "VERITY_VAR_DIR": shell["VERITY_VAR_DIR"]},
        cwd=shell["HOME"],
    )  # a host starts it from anywhere

    async def list_products():
        async with Client(params, read_timeout_seconds=60) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            answer = await client.call_tool("list_products", {})
            return tools, answer.structured_content

    saved = {k: os.environ.get(k) for k in ("PATH", "HOME")}
    os.environ.update({"PATH": shell["PATH"], "HOME": shell["HOME"]})
    try:
        tools, products = anyio.run(list_products)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert "list_products" in tools and "TEA-001" in json.dumps(products), products


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_make_run_then_the_walkthrough_works_on_the_embedded_default(embedded):
    env, base, var, out_path, make = embedded

    # the banner is the last thing on screen once everything is up, and stays so while
    # idle: once beat's outbox sweep (every 5 s), whose INFO lines used to scroll it away,
    # has been sent and taken by the worker after the banner (the filesystem broker's
    # folder changed since, and holds no message again)
    broker, shown = var / "broker", time.time()
    _wait_for(
        lambda: broker.stat().st_mtime > shown and not any(broker.glob("*.msg")),
        60,
        "a beat tick sent and taken after the banner",
    )
    screen = [_honcho_text(line).strip() for line in out_path.read_text().splitlines()]
    screen = [line for line in screen if line]
    assert screen[-1] == "=" * 78 and screen[-2] == BANNER_END, screen[-15:]
    banner = "\n".join(screen[-40:])
    assert "NOT UP" not in banner, banner
    for needle in (
        "support1 / support-demo-pass",
        "operator1 / operator-demo-pass",
        "finance1 / finance-demo-pass",
        (var / "demo-api-key").read_text().strip(),
        f"{base}/console/",
        f"{base}/status/",
        "curl -s -H 'Authorization",
    ):
        assert needle in banner, needle
    assert not (ROOT / "control").exists()  # runtime folders stay under var/
    if X402_LOCAL:
        assert "x402 rail: on (eip155:31337" in banner, banner
        assert f"127.0.0.1:{env['X402_FACILITATOR_PORT']}" in banner, banner
    else:
        assert "x402 rail: off" in banner, banner

    # when: a newcomer pastes the walk-through (docs/walkthrough.md)
    ids = run_walkthrough(base, var)
    # and: the setup's other way to a key, and the stdio MCP server as docs/mcp.md configures
    # it, work from the reader's shell too
    run_the_other_key_line(base, var)
    run_the_documented_mcp_config(var)

    # then: the purchases ended as the walk-through says, one charge each at localstripe
    key = (var / "demo-api-key").read_text().strip()
    api = requests.Session()
    api.headers["Authorization"] = f"Api-Key {key}"

    def purchase(pid: str) -> dict:
        return api.get(f"{base}/api/v1/purchases/{pid}", timeout=10).json()

    _wait_for(
        lambda: purchase(ids["UNKNOWN_PURCHASE"])["status"] == "completed",
        60,
        "the drilled purchase to complete",
    )
    assert (
        api.get(f"{base}/api/v1/operations/{ids['UNKNOWN_OP']}", timeout=10).json()["outcome"]
        == "succeeded"
    )
    assert purchase(ids["PURCHASE"])["status"] in ("paid", "fulfilling", "completed")
    assert purchase(ids["PURCHASE2"])["status"] in ("paid", "fulfilling", "completed")
    provider = Localstripe(env["STRIPE_API_BASE"], "sk_test_verity_local")
    for pid in (ids["PURCHASE"], ids["UNKNOWN_PURCHASE"], ids["PURCHASE2"]):
        assert len(provider.succeeded_charges_for(pid)) == 1, pid
    assert len(provider.payment_intents_for(ids["PURCHASE2"])) == 2  # declined + retry

    # and: every signed delivery localstripe made was a 2xx and is stored once
    deliveries_log = var / "log" / "localstripe-deliveries.log"
    # at least: PURCHASE succeeded, the drilled one succeeded, PURCHASE2 failed+succeeded
    _wait_for(
        lambda: (
            deliveries_log.exists()
            and len(
                [line for line in deliveries_log.read_text().splitlines() if 'webhook "' in line]
            )
            >= 4
        ),
        30,
        "four deliveries",
    )
    db_uri = f"file:{var / 'verity.sqlite3'}?mode=ro"

    def delivered_and_stored():
        deliveries = [
            line for line in deliveries_log.read_text().splitlines() if 'webhook "' in line
        ]
        with contextlib.closing(sqlite3.connect(db_uri, uri=True)) as db:
            stored = db.execute(
                "SELECT event_id, result FROM webhooks_providerevent "
                "WHERE event_id NOT LIKE 'evt_demo_%'"
            ).fetchall()
            applied_to = {
                row[0]
                for row in db.execute(
                    "SELECT operation_id FROM webhooks_providerevent WHERE operation_id != ''"
                )
            }
        return deliveries, stored, applied_to

    # a delivery in flight is stored before localstripe logs it: wait until every stored
    # event's delivery is in the log (at most 30 s; a refused one is reported below)
    deadline = time.monotonic() + 30
    deliveries, stored, applied_to = delivered_and_stored()
    while len(deliveries) != len(stored) and time.monotonic() < deadline:
        time.sleep(0.2)
        deliveries, stored, applied_to = delivered_and_stored()
    refused = [line for line in deliveries if "successfully delivered" not in line]
    assert not refused, refused
    assert len(stored) == len(deliveries), (stored, deliveries)
    assert len({event_id for event_id, _ in stored}) == len(stored)
    assert ids["UNKNOWN_OP"] in applied_to  # the drilled payment's webhook reached it
    metrics = requests.get(f"{base}/metrics", timeout=10).text
    failed = re.findall(
        r'^verity_webhook_failures_total\{reason="(\w+)"\} ([0-9.]+)$', metrics, re.M
    )
    assert failed and all(float(n) == 0 for _, n in failed), failed
    assert requests.get(f"{base}/readyz", timeout=10).status_code == 200
    if X402_LOCAL:  # and: an x402 quote's deliverable answers 402 on make run's chain
        _x402_quote_answers_402(base, key, env["X402_CHAIN_PORT"])
        # and: docs/x402.md's example, pasted into the reader's shell, buys the report
        _x402_doc_example_pays(base, var, key, env["X402_CHAIN_PORT"])

    # and: a console user logs in, and the customer's status page opens
    console = requests.Session()
    login = console.get(f"{base}/console/login/", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
    answer = console.post(
        f"{base}/console/login/",
        timeout=10,
        allow_redirects=False,
        data={
            "username": "support1",
            "password": "support-demo-pass",
            "csrfmiddlewaretoken": token,
        },
    )
    assert answer.status_code == 302, answer.text[:500]
    home = console.get(f"{base}/console/", timeout=10)
    assert home.status_code == 200 and "support1" in home.text
    status_url = purchase(ids["UNKNOWN_PURCHASE"])["status_url"]
    assert status_url.startswith(f"{base}/status/")
    page = requests.get(status_url, timeout=10)
    assert page.status_code == 200 and ids["UNKNOWN_PURCHASE"] in page.text

    # and: Ctrl-C (to make's foreground process group, as a terminal sends it) stops every
    # process and ends the run quietly: exit 0, no "make: *** … Error 130", nothing left
    os.killpg(make.pid, signal.SIGINT)
    make.wait(60)
    said = out_path.read_text(errors="replace")
    assert make.returncode in (0, -signal.SIGINT) and "make: ***" not in said, said[-3000:]
    _wait_for(lambda: not processes_of(var), 20, "every process of the run to stop")


def _x402_quote_answers_402(base: str, key: str, chain_port: str) -> None:
    """A digital good in usd (the seeded EBOOK-003): its deliverable is an x402 resource on
    the chain `make serve` started; unpaid, it answers 402 with the requirements."""
    api = requests.Session()
    api.headers.update({"Authorization": f"Api-Key {key}", "Content-Type": "application/json"})
    quote = api.post(
        f"{base}/api/v1/quotes",
        timeout=10,
        headers={"Idempotency-Key": "smoke-q"},
        json={"items": [{"sku": "EBOOK-003", "quantity": 1}], "currency": "usd"},
    )
    assert quote.status_code == 201, quote.text
    purchase = api.post(
        f"{base}/api/v1/purchases",
        timeout=10,
        headers={"Idempotency-Key": "smoke-p"},
        json={
            "quote_id": quote.json()["id"],
            "quote_version": 1,
            "customer": {"reference": "smoke-x402", "email": "agent@example.com"},
        },
    )
    assert purchase.status_code == 201, purchase.text
    pid = purchase.json()["id"]
    answer = api.get(f"{base}/api/v1/purchases/{pid}/deliverable", timeout=10)
    assert answer.status_code == 402, answer.text
    assert answer.json()["code"] == "payment_required"
    required = json.loads(base64.b64decode(answer.headers["PAYMENT-REQUIRED"]))
    (accepts,) = required["accepts"]
    local = x402_chain.local_env(port=0, facilitator_port=0)
    assert accepts["network"] == "eip155:31337" and accepts["amount"] == str(900 * 10**4)
    assert accepts["asset"].lower() == local["X402_ASSET"].lower()
    assert accepts["payTo"].lower() == local["X402_PAY_TO"].lower()
    # the token the requirements name is the one deployed on the chain make serve started
    from web3 import Web3

    w3 = Web3(Web3.HTTPProvider(f"http://127.0.0.1:{chain_port}"))
    assert len(w3.eth.get_code(Web3.to_checksum_address(accepts["asset"]))) > 0


def x402_example_block() -> str:
    """docs/x402.md's pasteable end-to-end example (the bash block marked
    `<!-- x402-example -->`)."""
    (block,) = re.findall(
        r"^<!-- x402-example -->\n```bash\n(.*?)^```$",
        (ROOT / "docs" / "x402.md").read_text(),
        re.M | re.S,
    )
    return block


def _x402_doc_example_pays(base: str, var: Path, key: str, chain_port: str) -> None:
    """The example as a reader pastes it (their shell's environment only; this stack's port
    and var/ are the only edits, as for the walk-through). Judged on the chain: make run's
    pay_to received exactly the report's 9.00 USDC, and Verity holds one succeeded x402
    payment for the purchase."""
    from web3 import Web3

    block = x402_example_block()
    assert "B=http://127.0.0.1:8000/api/v1" in block and "$(cat var/demo-api-key)" in block
    block = block.replace("http://127.0.0.1:8000", base).replace(
        "$(cat var/demo-api-key)", f"$(cat {var}/demo-api-key)"
    )
    local = x402_chain.local_env(port=0, facilitator_port=0)
    w3 = Web3(Web3.HTTPProvider(f"http://127.0.0.1:{chain_port}"))
    usdc = w3.eth.contract(
        address=Web3.to_checksum_address(local["X402_ASSET"]),
        abi=[
            {
                "type": "function",
                "name": "balanceOf",
                "stateMutability": "view",
                "inputs": [{"name": "a", "type": "address"}],
                "outputs": [{"name": "", "type": "uint256"}],
            }
        ],
    )
    pay_to = Web3.to_checksum_address(local["X402_PAY_TO"])
    before = usdc.functions.balanceOf(pay_to).call()

    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + block],
        cwd=ROOT,
        env=readers_shell(var),
        capture_output=True,
        text=True,
        timeout=240,
    )

    said = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in said, said
    (pid,) = re.findall(r"^PURCHASE (pur_\w+)$", done.stdout, re.M)
    assert re.search(r"^200 \{", done.stdout, re.M), said
    assert usdc.functions.balanceOf(pay_to).call() - before == 900 * 10**4
    api = requests.Session()
    api.headers["Authorization"] = f"Api-Key {key}"
    view = api.get(f"{base}/api/v1/purchases/{pid}", timeout=10).json()
    assert view["status"] in ("paid", "fulfilling", "completed"), view
    assert view["payment"]["rail"] == "x402" and view["payment"]["outcome"] == "succeeded", view


def test_the_walkthrough_covers_the_whole_story():
    text = "\n".join(walkthrough_blocks())
    for step in (
        "$B/products",
        "$B/quotes",
        "$B/purchases",
        "/payments",
        "demo_unknown_payment",
        "/reconcile",
        "retry_of",
    ):
        assert step in text, step
    # pasteable: ids come from the previous answer, never from the walk-through's examples
    # (comment lines may show an example answer)
    commands = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"\b(pur|op|quo)_[0-9a-f]{8,}", commands)
    assert "python manage.py" not in text.replace(".venv/bin/python manage.py", "")
