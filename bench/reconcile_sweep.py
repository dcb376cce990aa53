"""Bench 4: reconcile sweep over N unknown operations whose PaymentIntents exist.

Set-up (not timed): for each operation a PaymentIntent is created and confirmed at
localstripe through the adapter (payments.services.provider_for_rail(Rail.STRIPE), the
operation's own keys and metadata, a few threads), then the rows Verity would hold after
a confirm whose answer was lost are bulk-inserted: quote, purchase `payment_unknown`,
charge operation `unknown` with its provider_reference, the create/confirm ProviderCall
claims and a reserved Hold.
Timed, with --latency-ms added to every provider answer by a proxy (bench/fault_proxy.py):
for each --concurrency level, its share of the operations in --runs chunks (ops/s is the
median of the chunks), through recovery.sweep.reconcile_sweep: --concurrency read-backs
at a time on a bounded pool under a provider rate limit, applied set-based
--batch-size at a time (one transaction per batch). Counted: ProviderCall rows with
purpose=reconcile per operation (must be 1: a read-back by reference, never a list) and
database statements per operation (every statement of the sweeps; the read-back threads
touch no database).

    .venv/bin/python bench/reconcile_sweep.py [--n 10000] [--runs 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Report, bench_stack, common_args, fmt, log, med  # noqa: E402

AMOUNT, CURRENCY = 1500, "usd"


def _make_intent(op_id: str, purchase_id: str, customer: str, key: str) -> str:
    from payments.enums import Classification, Rail
    from payments.services import provider_for_rail

    provider = provider_for_rail(Rail.STRIPE)
    meta = {"operation_id": op_id, "purchase_id": purchase_id, "customer_reference": customer}
    created = provider.create_payment_intent(
        key=f"{key}:create",
        amount=AMOUNT,
        currency=CURRENCY,
        payment_method="pm_card_visa",
        capture_method="automatic",
        metadata=meta,
    )
    assert created.classification == Classification.OK, created
    confirmed = provider.confirm_payment_intent(key=f"{key}:confirm", intent_id=created.object.id)
    assert confirmed.classification == Classification.OK, confirmed
    return created.object.id


def build(n: int) -> list[str]:
    """N unknown charge operations with their PaymentIntents at localstripe."""
    from django.utils import timezone

    from payments.clients import api_client_create
    from payments.enums import (
        CallPurpose,
        CallStep,
        Classification,
        HoldState,
        OperationKind,
        Outcome,
        Owner,
        PurchaseStatus,
        Stage,
    )
    from payments.models import (
        Hold,
        PaymentOperation,
        ProviderCall,
        Purchase,
        Quote,
        new_operation_id,
        new_provider_key,
        new_purchase_id,
    )

    client, _ = api_client_create(
        name="bench-reconcile", scopes=["purchases:write"], limit=0, currency=CURRENCY
    )
    now = timezone.now()
    specs = [
        (new_operation_id(), new_purchase_id(), f"bench-cust-{i}", new_provider_key())
        for i in range(n)
    ]
    log(f"creating and confirming {n} PaymentIntents at localstripe")
    t = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        refs = list(pool.map(lambda s: _make_intent(*s), specs))
    log(f"  {n} intents in {time.monotonic() - t:.0f}s; inserting rows")
    quotes, purchases, ops, calls, holds = [], [], [], [], []
    for (op_id, pur_id, cust, key), ref in zip(specs, refs, strict=False):
        q = Quote(
            items=[{"sku": "BENCH", "name": "Bench", "quantity": 1, "unit_price": AMOUNT}],
            amount=AMOUNT,
            currency=CURRENCY,
            expires_at=now + timedelta(minutes=30),
            api_client=client,
        )
        quotes.append(q)
        purchases.append(
            Purchase(
                id=pur_id,
                quote=q,
                api_client=client,
                amount=AMOUNT,
                currency=CURRENCY,
                customer_reference=cust,
                customer_email=f"{cust}@example.com",
                status=PurchaseStatus.PAYMENT_UNKNOWN,
            )
        )
        op = PaymentOperation(
            id=op_id,
            purchase_id=pur_id,
            kind=OperationKind.CHARGE,
            amount=AMOUNT,
            currency=CURRENCY,
            idempotency_key=key,
            provider_reference=ref,
            payment_method="pm_card_visa",
            outcome=Outcome.UNKNOWN,
            stage=Stage.RECONCILING,
            next_action_owner=Owner.RECONCILIATION,
            requested_by_client=client,
            confirm_claimed_at=now,
            next_reconcile_at=now,
            reconcile_deadline=now + timedelta(days=3),
        )
        ops.append(op)
        calls.append(
            ProviderCall(
                operation_id=op_id,
                purpose=CallPurpose.DISPATCH,
                step=CallStep.CREATE,
                key=f"{key}:create",
                http_status=200,
                classification=Classification.OK,
                finished_at=now,
            )
        )
        calls.append(
            ProviderCall(
                operation_id=op_id,
                purpose=CallPurpose.DISPATCH,
                step=CallStep.CONFIRM,
                key=f"{key}:confirm",
                classification=Classification.UNKNOWN,
                finished_at=now,
                fault_drill="drop_response_after_send",
            )
        )
        holds.append(
            Hold(
                api_client=client,
                operation_id=op_id,
                amount=AMOUNT,
                currency=CURRENCY,
                state=HoldState.RESERVED,
            )
        )
    Quote.objects.bulk_create(quotes, batch_size=2000)
    Purchase.objects.bulk_create(purchases, batch_size=2000)
    PaymentOperation.objects.bulk_create(ops, batch_size=2000)
    ProviderCall.objects.bulk_create(calls, batch_size=2000)
    Hold.objects.bulk_create(holds, batch_size=2000)
    return [s[0] for s in specs]


class _Counter:
    """connection.execute_wrapper: counts statements (BEGIN/COMMIT are not statements)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, execute, sql, params, many, context):
        self.n += 1
        return execute(sql, params, many, context)


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(parser)
    parser.add_argument("--n", type=int, default=10000, help="unknown operations")
    parser.add_argument(
        "--concurrency",
        default="1,4,16",
        help="concurrent read-backs (recovery.sweep.reconcile_sweep), each "
        "level gets n / levels operations",
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=150,
        help="added to every localstripe answer by a proxy (bench/"
        "fault_proxy.py); real Stripe answers in ~100-300 ms",
    )
    parser.add_argument(
        "--reads-per-second",
        type=float,
        default=100,
        help="the sweep's provider rate limit (Stripe live: 100 reads/s)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=50,
        help="read-backs applied in one transaction (RECONCILE_SWEEP_BATCH_SIZE)",
    )
    args = parser.parse_args(argv)
    report = Report()
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    with bench_stack() as (stack, env):
        from urllib.parse import urlparse

        from django.conf import settings
        from django.db import connection

        from bench.fault_proxy import FaultProxy
        from payments.enums import CallPurpose, Outcome
        from payments.models import PaymentOperation, ProviderCall
        from payments.providers.stripe import get_provider  # its per-process cache
        from recovery.sweep import reconcile_sweep

        op_ids = build(args.n)
        with connection.cursor() as c:
            c.execute("ANALYZE")
        # From here on every read-back goes through the latency proxy.
        proxy = FaultProxy(urlparse(settings.STRIPE_API_BASE).port)
        proxy.up()
        proxy.hold(args.latency_ms / 1000)
        settings.STRIPE_API_BASE = proxy.base
        get_provider.cache_clear()
        per_level = -(-len(op_ids) // len(levels))
        chunk = -(-per_level // args.runs)
        rates: dict[int, list[float]] = {c: [] for c in levels}
        queries = counted = 0
        for li, level in enumerate(levels):
            ops_level = op_ids[li * per_level : (li + 1) * per_level]
            for run in range(args.runs):
                part = ops_level[run * chunk : (run + 1) * chunk]
                if not part:
                    continue
                log(
                    f"concurrency {level}, run {run + 1}/{args.runs}: reconciling "
                    f"{len(part)} operations (+{args.latency_ms:.0f} ms per answer)"
                )
                # Every statement of the sweep runs on this thread's connection (the
                # read-back threads only talk to the provider): count them all.
                counter = _Counter()
                with connection.execute_wrapper(counter):
                    res = reconcile_sweep(
                        operation_ids=part,
                        concurrency=level,
                        reads_per_second=args.reads_per_second,
                        batch_size=args.batch_size,
                    )
                assert res.failed == 0, res.errors[:5]
                queries += counter.n
                counted += len(part)
                rates[level].append(len(part) / res.seconds)
        n = len(op_ids)
        reconcile_calls = ProviderCall.objects.filter(purpose=CallPurpose.RECONCILE).count()
        settled = PaymentOperation.objects.filter(outcome=Outcome.SUCCEEDED).count()
    base = med(rates[levels[0]]) if rates.get(levels[0]) else 0
    for level in levels:
        if not rates[level]:
            continue
        rate = med(rates[level])
        report.add(
            "reconcile sweep",
            f"ops/s, {level} concurrent read-back" + ("s" if level > 1 else ""),
            fmt(rate, 1),
            "",
            "",
            "" if level == levels[0] else "scales",
            f"+{args.latency_ms:.0f} ms/answer; "
            + (f"{rate / base:.1f}x of {levels[0]}; " if base and level != levels[0] else "")
            + f"limit {args.reads_per_second:.0f} reads/s, "
            + f"batches of {args.batch_size}",
        )
    n_q = counted or 1
    report.add(
        "reconcile sweep",
        "provider calls / op",
        f"{reconcile_calls / n:.2f}",
        "",
        "",
        "= 1",
        f"{reconcile_calls} reconcile ProviderCall rows",
    )
    report.add(
        "reconcile sweep",
        "DB queries / op",
        f"{queries / n_q:.1f}",
        "",
        "",
        "<= 5",
        f"every statement of the sweeps, {counted} ops (execute_wrapper)",
    )
    report.add("reconcile sweep", "check", f"{settled}/{n} settled succeeded", "", "", "", "")
    report.dump(args.json)
    report.print("reconcile sweep")
    return report


if __name__ == "__main__":
    main()
