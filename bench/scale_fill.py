"""Fill PostgreSQL with purchases in a realistic state mix, fast (INSERT … SELECT
generate_series, one statement per table and shape; no Python loop per row).

`fill(lo, hi, client_id)` adds purchases g = lo..hi (1-based, cumulative: fill(1, 10_000)
then fill(10_001, 100_000) grows the same data set). Everything is derived from g, so ids
are stable and opaque (md5-based hex, like the random ids Verity mints) and the same g
always has the same state. Mix, by g % 200:

    0-139   70 %  completed charge (2 dispatch calls, webhook applied, 5 steps done, order)
    140-159 10 %  failed charge (card_declined, webhook applied, hold released)
    160-169  5 %  awaiting payment (no operation yet)
    170-179  5 %  authorize + capture, completed
    180-187  4 %  charge then full refund, refunded
    188-191  2 %  unknown charge (confirm answer lost, 2 read-backs so far, hold reserved)
    192-193  1 %  paid, no order yet (order step pending)  -> paid-without-order queue
    194-195  1 %  manual review: inventory step failed      -> compensation queue
    196-197  1 %  expired
    198-199  1 %  completed charge plus a quarantined (mismatched) webhook event

Rows per purchase on average: 1 quote, ~1.2 operations, ~2.4 provider calls, ~5.5
transitions, ~1.1 events, ~4.5 steps, ~0.9 orders, ~0.9 holds, 1 processed outbox row,
~1.9 storefront events (`purchase.created`, then `payment.succeeded` / `payment.failed` /
`payment.unknown` when the purchase has a payment; the feed and webhooks read these).
"""

from __future__ import annotations

TABLES = [
    "payments_quote",
    "payments_purchase",
    "payments_paymentoperation",
    "payments_providercall",
    "payments_operationtransition",
    "payments_hold",
    "webhooks_providerevent",
    "recovery_steprun",
    "recovery_order",
    "recovery_outboxmessage",
    "events_event",
]

# Derived columns shared by every statement (g = purchase number, b = bucket).
_G = """
FROM (
  SELECT g, g % 200 AS b,
         'pur_' || substr(md5('p:' || g), 1, 24) AS pid,
         'quo_' || substr(md5('q:' || g), 1, 24) AS qid,
         'op_' || substr(md5('o:' || g), 1, 24) AS oid,
         'op_' || substr(md5('o2:' || g), 1, 24) AS oid2,
         'pi_' || substr(md5('pi:' || g), 1, 24) AS pi,
         'ch_' || substr(md5('ch:' || g), 1, 24) AS ch,
         're_' || substr(md5('re:' || g), 1, 24) AS re,
         'cust-' || (g / 3) AS cust,
         timestamptz '2026-01-01 00:00:00+00' + g * interval '25 seconds' AS ts
  FROM generate_series(%(lo)s, %(hi)s) AS g
) s
"""

# Buckets as SQL predicates.
HAS_OP = "NOT (b BETWEEN 160 AND 169 OR b BETWEEN 196 AND 197)"
COMPLETED = "(b < 140 OR b BETWEEN 170 AND 187 OR b >= 198)"
FAILED = "b BETWEEN 140 AND 159"
UNKNOWN = "b BETWEEN 188 AND 191"
SUCCEEDED_OP = f"({HAS_OP} AND NOT ({FAILED}) AND NOT ({UNKNOWN}))"
SECOND_OP = "b BETWEEN 170 AND 187"  # capture (170-179) or refund (180-187)

STATEMENTS: list[tuple[str, str]] = [
    (
        "quotes",
        f"""
INSERT INTO payments_quote (id, api_client_id, items, amount, currency, version, expires_at,
                            superseded_at, created_at)
SELECT qid, %(client)s,
       '[{{"sku": "SKU-1", "name": "Item", "quantity": 1, "unit_price": 1500}}]'::jsonb,
       1500, 'usd', 1, ts + interval '30 minutes', NULL, ts
{_G}""",
    ),
    (
        "purchases",
        f"""
INSERT INTO payments_purchase (id, quote_id, api_client_id, amount, currency,
    customer_reference, customer_key, basket_fingerprint, customer_email, status,
    status_token, recovery_owner, acknowledged_unresolved, created_at, updated_at, paid_at,
    channel)
SELECT pid, qid, %(client)s, 1500, 'usd', cust, cust, md5('basket:' || b), cust || '@example.com',
       CASE WHEN b < 140 OR b BETWEEN 170 AND 179 OR b >= 198 THEN 'completed'
            WHEN b BETWEEN 140 AND 159 THEN 'payment_failed'
            WHEN b BETWEEN 160 AND 169 THEN 'awaiting_payment'
            WHEN b BETWEEN 180 AND 187 THEN 'refunded'
            WHEN b BETWEEN 188 AND 191 THEN 'payment_unknown'
            WHEN b BETWEEN 192 AND 193 THEN 'paid'
            WHEN b BETWEEN 194 AND 195 THEN 'manual_review'
            ELSE 'expired' END,
       md5('t:' || g), CASE WHEN b BETWEEN 188 AND 195 THEN 'payments-oncall' ELSE '' END,
       '[]'::jsonb, ts, ts + interval '40 seconds',
       CASE WHEN {SUCCEEDED_OP} THEN ts + interval '3 seconds' END,  -- its 'paid' transition
       CASE WHEN b % 10 = 3 THEN 'mcp' WHEN b % 25 = 4 THEN 'acp' ELSE 'api' END
{_G}""",
    ),
    (
        "operations",
        f"""
INSERT INTO payments_paymentoperation (id, purchase_id, kind, amount, currency,
    idempotency_key, request_fingerprint, provider_reference, provider_charge,
    provider_account, parent_id, retry_of_id, payment_method, capture_method, outcome, stage,
    grade, verification, reason, next_action_owner, provider_status, requested_by_client_id,
    confirm_claimed_at, dispatch_deadline, reconcile_attempts, next_reconcile_at,
    reconcile_deadline, escalated_at, is_compensation, created_at, updated_at, settled_at,
    origin, reviewed_by, is_duplicate, rail)
SELECT oid, pid, CASE WHEN b BETWEEN 170 AND 179 THEN 'authorize' ELSE 'charge' END, 1500, 'usd',
       'vk_' || md5('k:' || g), md5('f:' || g), pi,
       CASE WHEN {UNKNOWN} OR {FAILED} THEN '' ELSE ch END, '', NULL, NULL,
       CASE WHEN {FAILED} THEN 'pm_card_chargeCustomerFail' ELSE 'pm_card_visa' END,
       CASE WHEN b BETWEEN 170 AND 179 THEN 'manual' ELSE 'automatic' END,
       CASE WHEN {FAILED} THEN 'failed' WHEN {UNKNOWN} THEN 'unknown' ELSE 'succeeded' END,
       CASE WHEN {UNKNOWN} THEN 'reconciling' ELSE 'settled' END,
       CASE WHEN {UNKNOWN} THEN '' ELSE 'confirmed' END,
       CASE WHEN {UNKNOWN} THEN 'unverified' WHEN b % 2 = 0 THEN 'provider' ELSE 'webhook' END,
       CASE WHEN {FAILED} THEN 'card_declined' ELSE '' END,
       CASE WHEN {FAILED} THEN 'buyer' WHEN {UNKNOWN} THEN 'reconciliation' ELSE 'none' END,
       CASE WHEN {FAILED} THEN 'requires_payment_method' WHEN {UNKNOWN} THEN ''
            WHEN b BETWEEN 170 AND 179 THEN 'requires_capture' ELSE 'succeeded' END,
       %(client)s, ts + interval '2 seconds', ts + interval '92 seconds',
       CASE WHEN {UNKNOWN} THEN 2 ELSE 0 END,
       CASE WHEN {UNKNOWN} THEN now() + (g % 600) * interval '1 second' END,
       CASE WHEN {UNKNOWN} THEN now() + interval '3 days' END, NULL, false,
       ts + interval '1 second', ts + interval '3 seconds',
       CASE WHEN {UNKNOWN} THEN NULL ELSE ts + interval '3 seconds' END,
       'verity', '', false, 'stripe'
{_G} WHERE {HAS_OP}""",
    ),
    (
        "second operations",
        f"""
INSERT INTO payments_paymentoperation (id, purchase_id, kind, amount, currency,
    idempotency_key, request_fingerprint, provider_reference, provider_charge,
    provider_account, parent_id, retry_of_id, payment_method, capture_method, outcome, stage,
    grade, verification, reason, next_action_owner, provider_status, requested_by_client_id,
    confirm_claimed_at, dispatch_deadline, reconcile_attempts, next_reconcile_at,
    reconcile_deadline, escalated_at, is_compensation, created_at, updated_at, settled_at,
    origin, reviewed_by, is_duplicate, rail)
SELECT oid2, pid, CASE WHEN b < 180 THEN 'capture' ELSE 'refund' END, 1500, 'usd',
       'vk_' || md5('k2:' || g), md5('f2:' || g), CASE WHEN b < 180 THEN pi ELSE re END, '', '',
       oid, NULL, '', 'automatic', 'succeeded', 'settled', 'confirmed', 'provider', '', 'none',
       'succeeded', %(client)s, NULL, ts + interval '120 seconds', 0, NULL, NULL, NULL, false,
       ts + interval '30 seconds', ts + interval '31 seconds', ts + interval '31 seconds',
       'verity', '', false, 'stripe'
{_G} WHERE {SECOND_OP}""",
    ),
    (
        "provider calls",
        f"""
INSERT INTO payments_providercall (operation_id, purpose, step, attempt, key, request_id,
    http_status, classification, safe_fields, error_code, fault_drill, started_at, finished_at)
SELECT c.op, c.purpose, c.step, c.attempt, c.key,
       'req_' || substr(md5(c.op || c.step || c.attempt), 1, 14),
       c.http, c.cls, jsonb_build_object('id', s.pi, 'status', c.status), c.err, '',
       s.ts + c.off, s.ts + c.off + interval '200 milliseconds'
{_G}
CROSS JOIN LATERAL (VALUES
  (s.oid, 'dispatch', 'create', 1, 'vk_' || md5('k:' || s.g) || ':create', 200, 'ok',
   'requires_payment_method', '', interval '1 second', {HAS_OP}),
  (s.oid, 'dispatch', 'confirm', 1, 'vk_' || md5('k:' || s.g) || ':confirm',
   CASE WHEN {FAILED} THEN 402 WHEN {UNKNOWN} THEN NULL ELSE 200 END,
   CASE WHEN {FAILED} THEN 'declined' WHEN {UNKNOWN} THEN 'unknown' ELSE 'ok' END,
   CASE WHEN {FAILED} THEN 'requires_payment_method' WHEN {UNKNOWN} THEN '' ELSE 'succeeded' END,
   CASE WHEN {FAILED} THEN 'card_declined' ELSE '' END, interval '2 seconds', {HAS_OP}),
  (s.oid, 'reconcile', 'retrieve', 1, '', 200, 'ok', 'processing', '', interval '40 seconds',
   {UNKNOWN}),
  (s.oid, 'reconcile', 'retrieve', 2, '', 200, 'ok', 'processing', '', interval '160 seconds',
   {UNKNOWN}),
  (s.oid2, 'dispatch', CASE WHEN s.b < 180 THEN 'capture' ELSE 'refund' END, 1,
   'vk_' || md5('k2:' || s.g) || CASE WHEN s.b < 180 THEN ':capture' ELSE ':refund' END, 200,
   'ok', 'succeeded', '', interval '30 seconds', {SECOND_OP})
) AS c(op, purpose, step, attempt, key, http, cls, status, err, off, keep)
WHERE c.keep""",
    ),
    (
        "transitions",
        f"""
INSERT INTO payments_operationtransition (purchase_id, operation_id, field, source, target,
    cause, evidence, actor, created_at)
SELECT s.pid, t.op, t.field, t.source, t.target, t.cause, '{{}}'::jsonb, t.actor, s.ts + t.off
{_G}
CROSS JOIN LATERAL (VALUES
  (s.oid, 'outcome', 'pending', 'dispatching', 'claim:create', 'dispatcher',
   interval '1 second', {HAS_OP}),
  (s.oid, 'outcome', 'dispatching',
   CASE WHEN {FAILED} THEN 'failed' WHEN {UNKNOWN} THEN 'unknown' ELSE 'succeeded' END,
   'confirm_answer', 'dispatcher', interval '3 seconds', {HAS_OP}),
  (NULL, 'status', 'awaiting_payment',
   CASE WHEN {FAILED} THEN 'payment_failed' WHEN {UNKNOWN} THEN 'payment_unknown'
        ELSE 'paid' END, 'confirm_answer', 'dispatcher', interval '3 seconds', {HAS_OP}),
  (NULL, 'status', 'paid', 'fulfilling', 'steps', 'orchestrator', interval '5 seconds',
   {COMPLETED} OR s.b BETWEEN 194 AND 195),
  (NULL, 'status', 'fulfilling', 'completed', 'steps', 'orchestrator', interval '9 seconds',
   {COMPLETED}),
  (NULL, 'status', 'fulfilling', 'manual_review', 'step_failed:inventory', 'orchestrator',
   interval '9 seconds', s.b BETWEEN 194 AND 195),
  (s.oid2, 'outcome', 'pending', 'succeeded', 'capture_answer', 'dispatcher',
   interval '31 seconds', {SECOND_OP}),
  (NULL, 'status', 'completed', 'refunded', 'refund_answer', 'dispatcher',
   interval '31 seconds', s.b BETWEEN 180 AND 187),
  (NULL, 'status', 'awaiting_payment', 'expired', 'quote_expired', 'beat',
   interval '31 minutes', s.b BETWEEN 196 AND 197)
) AS t(op, field, source, target, cause, actor, off, keep)
WHERE t.keep""",
    ),
    (
        "holds",
        f"""
INSERT INTO payments_hold (api_client_id, operation_id, amount, currency, state,
    period_start, created_at, updated_at)
SELECT %(client)s, oid, 1500, 'usd',
       CASE WHEN {FAILED} THEN 'released' WHEN {UNKNOWN} THEN 'reserved' ELSE 'consumed' END,
       NULL, ts + interval '2 seconds', ts + interval '3 seconds'
{_G} WHERE {HAS_OP}""",
    ),
    (
        "events",
        f"""
INSERT INTO webhooks_providerevent (event_id, type, account, object_id, created, received_at,
    payload, result, result_reason, operation_id, purchase_id, attempts, processed_at)
SELECT 'evt_' || substr(md5(e.kind || ':' || s.g), 1, 24), e.type, '', e.obj, s.ts + e.off,
       s.ts + e.off + interval '1 second',
       jsonb_build_object('id', 'evt_' || substr(md5(e.kind || ':' || s.g), 1, 24), 'type', e.type,
                          'data', jsonb_build_object('object', jsonb_build_object(
                              'id', e.obj, 'status', e.status, 'amount', e.amount,
                              'currency', 'usd',
                              'metadata', jsonb_build_object('operation_id', s.oid,
                                                             'purchase_id', s.pid)))),
       e.result, e.reason, e.op, s.pid, 1, s.ts + e.off + interval '2 seconds'
{_G}
CROSS JOIN LATERAL (VALUES
  ('e1', CASE WHEN {FAILED} THEN 'payment_intent.payment_failed'
              ELSE 'payment_intent.succeeded' END, s.pi,
   CASE WHEN {FAILED} THEN 'requires_payment_method' ELSE 'succeeded' END, 1500, 'applied', '',
   s.oid, interval '4 seconds', {HAS_OP} AND NOT {UNKNOWN} AND NOT s.b BETWEEN 170 AND 179),
  ('e2', 'charge.refunded', s.ch, 'succeeded', 1500, 'applied', '', s.oid2,
   interval '32 seconds', s.b BETWEEN 180 AND 187),
  ('e3', 'payment_intent.succeeded', s.pi, 'succeeded', 999, 'quarantined',
   'mismatch:amount', s.oid, interval '60 seconds', s.b >= 198)
) AS e(kind, type, obj, status, amount, result, reason, op, off, keep)
WHERE e.keep""",
    ),
    (
        "steps",
        f"""
INSERT INTO recovery_steprun (purchase_id, step, state, key, attempts, external_reference,
    result, last_error, compensation_operation_id, result_expires_at, started_at,
    completed_at, created_at)
SELECT s.pid, st.step,
       CASE WHEN s.b BETWEEN 192 AND 193 THEN 'pending'
            WHEN s.b BETWEEN 194 AND 195 AND st.n = 2 THEN 'failed'
            ELSE 'done' END,
       s.pid || ':' || st.step, 1,
       CASE WHEN st.step = 'order' THEN 'ord_' || substr(md5('r:' || s.g), 1, 20) ELSE '' END,
       '{{}}'::jsonb,
       CASE WHEN s.b BETWEEN 194 AND 195 AND st.n = 2 THEN 'inventory writer refused' ELSE '' END,
       '', NULL,
       CASE WHEN s.b BETWEEN 192 AND 193 THEN NULL ELSE s.ts + interval '5 seconds' END,
       CASE WHEN s.b BETWEEN 192 AND 193 THEN NULL ELSE s.ts + interval '6 seconds' END,
       s.ts + interval '5 seconds'
{_G}
CROSS JOIN LATERAL (VALUES (1, 'order'), (2, 'inventory'), (3, 'ledger'), (4, 'confirmation'),
                           (5, 'crm')) AS st(n, step)
WHERE {COMPLETED} OR (s.b BETWEEN 192 AND 193 AND st.n = 1)
   OR (s.b BETWEEN 194 AND 195 AND st.n <= 2)""",
    ),
    (
        "orders",
        f"""
INSERT INTO recovery_order (purchase_id, reference, created_at)
SELECT pid, 'ord_' || substr(md5('r:' || g), 1, 20), ts + interval '6 seconds'
{_G} WHERE {COMPLETED} OR b BETWEEN 194 AND 195""",
    ),
    (
        "outbox (processed)",
        f"""
INSERT INTO recovery_outboxmessage (category, payload, dedupe_key, available_at,
    claimed_until, attempts, last_error, processed_at, created_at)
SELECT 2, jsonb_build_object('operation', oid), 'settled:' || oid, ts + interval '3 seconds',
       NULL, 1, '', ts + interval '4 seconds', ts + interval '3 seconds'
{_G} WHERE {HAS_OP}""",
    ),
    (
        "storefront events",
        f"""
INSERT INTO events_event (public_id, api_client_id, purchase_id, sequence, type, data,
    created_at)
SELECT 'evt_' || substr(md5(e.kind || ':' || s.g), 1, 24), %(client)s::text, s.pid, e.seq,
       e.type, jsonb_build_object('purchase', jsonb_build_object(
           'id', s.pid, 'status', e.status, 'amount', 1500, 'currency', 'usd')),
       s.ts + e.off
{_G}
CROSS JOIN LATERAL (VALUES
  ('s1', 1, 'purchase.created', 'awaiting_payment', interval '0 seconds', true),
  ('s2', 2, CASE WHEN {FAILED} THEN 'payment.failed' WHEN {UNKNOWN} THEN 'payment.unknown'
                 ELSE 'payment.succeeded' END,
   CASE WHEN {FAILED} THEN 'payment_failed' WHEN {UNKNOWN} THEN 'payment_unknown'
        ELSE 'paid' END, interval '3 seconds', {HAS_OP})
) AS e(kind, seq, type, status, off, keep)
WHERE e.keep""",
    ),
]


_SECONDARY_INDEXES_SQL = """
SELECT i.indexname, i.indexdef
FROM pg_indexes i
WHERE i.schemaname = 'public' AND i.tablename = ANY(%s)
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c
                  WHERE c.conindid = (quote_ident(i.indexname))::regclass)
"""


# Each statement runs over at most this many purchases at a time (same rows, same single
# transaction), so a long fill can report rows written as it goes.
CHUNK = 100_000


def fill(
    lo: int,
    hi: int,
    *,
    client_id: int,
    log=print,
    rebuild_indexes: bool | None = None,
    state: dict | None = None,
) -> None:
    """Add purchases lo..hi. For big batches the secondary indexes (not the primary keys
    or unique constraints) are dropped first and rebuilt after: building an index once is
    much cheaper than maintaining it row by row with random (md5) keys.

    `state`, if given, is kept current for a progress line: `phase`, `rows` written so far,
    `units_done` / `units_total` (purchases × statements) and `started`."""
    import time

    from django.db import connection, transaction

    if rebuild_indexes is None:
        rebuild_indexes = hi - lo >= 200_000
    params = {"lo": lo, "hi": hi, "client": client_id}
    chunks = [(a, min(a + CHUNK - 1, hi)) for a in range(lo, hi + 1, CHUNK)]
    state = state if state is not None else {}
    state.update(
        phase="indexes",
        rows=0,
        units_done=0,
        units_total=len(STATEMENTS) * (hi - lo + 1),
        started=time.monotonic(),
    )
    with transaction.atomic(), connection.cursor() as cursor:
        # Bulk load of rows that are consistent by construction: skip the per-row foreign
        # key triggers (Django's FKs are DEFERRABLE, so millions of checks would queue up
        # until COMMIT). Needs a superuser, which the throwaway cluster's `postgres` is.
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute("SET LOCAL maintenance_work_mem = '512MB'")
        dropped = []
        if rebuild_indexes:
            cursor.execute(_SECONDARY_INDEXES_SQL, [TABLES])
            dropped = cursor.fetchall()
            for name, _ in dropped:
                cursor.execute(f'DROP INDEX "{name}"')
            log(f"  dropped {len(dropped)} secondary indexes for the load")
        for name, sql in STATEMENTS:
            t = time.monotonic()
            rows = 0
            state["phase"] = name
            for a, b in chunks:
                cursor.execute(sql.replace(" % ", " %% "), {**params, "lo": a, "hi": b})
                rows += cursor.rowcount
                state["rows"] += cursor.rowcount
                state["units_done"] += b - a + 1
            log(f"  {name}: {rows:,} rows in {time.monotonic() - t:.1f}s")
        if dropped:
            state["phase"] = "rebuilding indexes"
            t = time.monotonic()
            for _, definition in dropped:
                cursor.execute(definition)
            log(f"  rebuilt {len(dropped)} indexes in {time.monotonic() - t:.1f}s")
    state["phase"] = "analyze"
    with connection.cursor() as cursor:
        t = time.monotonic()
        # VACUUM too: rows this old have been vacuumed by autovacuum in production, which
        # sets the visibility map that index-only scans (the covering indexes) rely on.
        for table in TABLES:
            cursor.execute(f"VACUUM ANALYZE {table}")
        log(f"  vacuum analyze: {time.monotonic() - t:.1f}s")
