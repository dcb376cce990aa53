"""While PostgreSQL is unreachable, requests get 503 `database_unavailable` with
Retry-After (a retry with the same key resumes), never a 500 that looks like a bug.

The server under test runs in its own process whose DATABASE_URL names a loopback port
where nothing listens: a real refused connection, as during `pg_ctl restart`."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.stack import free_port

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import hashlib, hmac, json, time
import django
django.setup()
from django.test import Client

client = Client(raise_request_exception=False)
out = {}
r = client.post("/api/v1/quotes", data=json.dumps({"items": [{"sku": "X", "quantity": 1}],
                "currency": "usd"}), content_type="application/json",
                HTTP_AUTHORIZATION="Api-Key abcdefgh.secretsecretsecret",
                HTTP_IDEMPOTENCY_KEY="db-down-1")
out["api"] = [r.status_code, r.headers.get("Retry-After"), r.headers.get("Content-Type"),
              r.content.decode()]
body = json.dumps({"id": "evt_db_down", "object": "event", "type": "payment_intent.succeeded",
                   "created": int(time.time()), "livemode": False,
                   "data": {"object": {"id": "pi_x", "object": "payment_intent",
                                       "status": "succeeded", "amount": 100,
                                       "currency": "usd", "metadata": {}}}}).encode()
ts = int(time.time())
sig = hmac.new(b"whsec_db_down", f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
r = client.post("/webhooks/stripe/", data=body, content_type="application/json",
                HTTP_STRIPE_SIGNATURE=f"t={ts},v1={sig}")
out["webhook"] = [r.status_code, r.headers.get("Retry-After"), r.headers.get("Content-Type"),
                  r.content.decode()]
print(json.dumps(out))
"""


def test_requests_get_503_with_retry_after_while_the_database_is_unreachable():
    # given a server whose database refuses connections
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{free_port()}/verity",
        "STRIPE_WEBHOOK_SECRETS": "whsec_db_down",
        "ALLOWED_HOSTS": "testserver",
    }

    # when an API client and the provider's webhook call it
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])

    # then both answer 503 with Retry-After and a problem document with a stable code,
    # and nothing about the database error leaks into the body
    for surface in ("api", "webhook"):
        status, retry_after, content_type, body = out[surface]
        assert status == 503, (surface, body)
        assert int(retry_after) > 0
        assert content_type.startswith("application/problem+json")
        problem = json.loads(body)
        assert problem["code"] == "database_unavailable"
        assert problem["next_action"]["retry"] == "same_key"
        assert "connection" not in body.lower() and "psycopg" not in body.lower()
