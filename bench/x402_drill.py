"""`make drill-x402`: every x402 fault through Verity on a throwaway chain, one table.

Run inside `python -m tests.stack --x402` (the Makefile does): PostgreSQL, Redis, anvil with
Circle's FiatTokenV2_2 and the SDK's facilitator. Each drill pays a fresh purchase's
deliverable with a real EIP-3009 authorization through the API, injects its fault from the
chain or the facilitator, reconciles from the chain (read-only) and counts the transfers
that really happened. Exits non-zero if any row breaks the rules: at most one transfer of
the price; succeeded only when the operation's recorded transaction carries
Transfer(payer -> pay_to, price), failed only without it; `unknown`/`awaiting` never shown
failed before the chain proves it (expired, cancelled, or the nonce used elsewhere); an
authorization Verity must refuse up front (nonce already used, validBefore far in the
future) creates no operation and moves nothing.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

PROVEN_FAILURES = (
    "authorization_expired",
    "authorization_canceled",
    "authorization_used_elsewhere",
)
REFUSED = "refused"  # 402 before any operation: nothing stored, nothing sent


@dataclass
class Row:
    drill: str
    recorded: str
    transfers: int
    after: str
    reason: str
    violation: str = ""


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.test.utils import override_settings, setup_test_environment
    from rest_framework.test import APIClient

    from bench.x402_judge import claims_from_rows, judge_from_env
    from payments import services
    from payments.models import PaymentOperation, Product, X402Authorization
    from payments.providers.x402 import DrillMode, get_facilitator
    from tests.factories import make_client
    from tests.x402.chain import SIGNATURE, Chain, craft, sign

    setup_test_environment()
    call_command("migrate", verbosity=0)
    chain = Chain()
    judge = judge_from_env()  # raw JSON-RPC and call traces: never Verity's proof

    def judged_paid(op) -> bool:
        claims = claims_from_rows(
            X402Authorization.objects.filter(operation=op).select_related("operation")
        )
        return judge.audit(claims).paid.get(op.id) is not None

    _client, key = make_client(
        scopes=("purchases:read", "purchases:write"), limit=10**9, name="x402-drill"
    )
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    product, _ = Product.objects.get_or_create(
        sku="X402-DRILL-REPORT",
        defaults={"name": "Drill report", "price": 500, "stock": 10**9, "kind": "digital"},
    )

    made: list[str] = []

    def purchase() -> str:
        q = http.post(
            "/api/v1/quotes",
            {"items": [{"sku": product.sku, "quantity": 1}], "currency": "usd"},
            format="json",
            HTTP_IDEMPOTENCY_KEY=os.urandom(8).hex(),
        )
        p = http.post(
            "/api/v1/purchases",
            {
                "quote_id": q.json()["id"],
                "quote_version": q.json()["version"],
                "customer": {
                    "reference": f"x402-drill-{os.urandom(4).hex()}",
                    "email": "drill@example.com",
                },
            },
            format="json",
            HTTP_IDEMPOTENCY_KEY=os.urandom(8).hex(),
        )
        made.append(p.json()["id"])
        return made[-1]

    def tx_of(op) -> str:
        return X402Authorization.objects.get(operation=op).transaction_hash

    # Each drill: (name, settings, before the signed request, after it -> more reconciles)
    def pending_before(ctx):
        chain.automine(False)

    def mine_after(ctx):
        chain.mine()

    def as_500_before(ctx):
        chain.facilitator_config(pending_status=500)
        chain.automine(False)

    def dropped_after(ctx):
        chain.drop(tx_of(ctx["op"]))
        chain.automine(True)
        chain.refill_facilitator_nonce()
        ctx["then"] = lambda: chain.expire(int(ctx["auth"]["validBefore"]))

    def cancel_after(ctx):
        chain.cancel_authorization(
            ctx["payer"], ctx["auth"]["nonce"], gas_price=chain.w3.eth.gas_price * 20
        )
        chain.mine()

    def blocklist_after(ctx):
        chain.token.functions.blacklist(ctx["payer"].address).transact(
            {"from": chain.admin, "gasPrice": chain.w3.eth.gas_price * 20}
        )
        chain.mine()

    def expire_after(ctx):
        chain.expire(int(ctx["auth"]["validBefore"]))  # the pending transfer reverts

    def reorg_after(ctx):
        chain.reorg(1)
        chain.refill_facilitator_nonce()
        chain.mine(3)

    def drop_answer_before(ctx):
        get_facilitator().arm_drill(
            payer=ctx["payer"].address,
            nonce=ctx["auth"]["nonce"],
            mode=DrillMode.DROP_ANSWER_AFTER_SEND,
        )

    def front_run_after(ctx):
        # The payer spends its own nonce on a 1-unit transfer to pay_to, ahead of the
        # facilitator's pending transaction: a Transfer to pay_to exists, not the payment.
        chain.spend_nonce(
            ctx["payer"],
            ctx["auth"]["nonce"],
            to=chain.pay_to,
            value=1,
            gas_price=chain.w3.eth.gas_price * 20,
        )
        chain.mine()

    def spent_before(ctx):
        chain.spend_nonce(ctx["payer"], ctx["auth"]["nonce"])

    def far_future(required, payer):
        import time

        return craft(required, payer, validBefore=int(time.time()) + 10 * 86400)

    short = {"X402_MAX_TIMEOUT_SECONDS": 60}
    drills = [
        ("settlement_pending", {}, pending_before, mine_after),
        ("pending_as_http_500", {}, as_500_before, mine_after),
        ("dropped_transaction", short, pending_before, dropped_after),
        ("reverted_cancelled", {}, pending_before, cancel_after),
        ("reverted_blocklisted", {}, pending_before, blocklist_after),
        ("expired_while_pending", short, pending_before, expire_after),
        ("reorg", {"X402_CONFIRMATIONS": 3}, lambda ctx: None, reorg_after),
        ("answer_dropped", {}, drop_answer_before, lambda ctx: None),
        ("nonce_used_elsewhere", {}, pending_before, front_run_after),
        ("nonce_used_before_settle", {}, spent_before, None),
        ("far_future_expiry", {}, lambda ctx: None, None),
    ]
    signers = {"far_future_expiry": far_future}
    only = set(sys.argv[1:])  # `python -m bench.x402_drill NAME...`: those drills only
    rows = []
    for name, overrides, before, after in drills:
        if only and name not in only:
            continue
        with override_settings(**overrides):
            pid = purchase()
            required = http.get(f"/api/v1/purchases/{pid}/deliverable").headers["PAYMENT-REQUIRED"]
            payer = chain.new_payer()
            header, auth = signers.get(name, sign)(required, payer)
            ctx = {"payer": payer, "auth": auth}
            try:
                before(ctx)
                answer = http.get(f"/api/v1/purchases/{pid}/deliverable", **{SIGNATURE: header})
                if after is None:  # must be refused before anything is stored or sent
                    ops = PaymentOperation.objects.filter(purchase_id=pid).count()
                    transfers = chain.transfers(payer.address, product.price * 10**4)
                    row = Row(
                        name,
                        REFUSED if answer.status_code == 402 else str(answer.status_code),
                        transfers,
                        f"{ops} operation(s)",
                        answer.json().get("code", ""),
                    )
                    if answer.status_code != 402 or "PAYMENT-REQUIRED" not in answer.headers:
                        row.violation = "not refused with 402 + PAYMENT-REQUIRED"
                    elif ops or transfers:
                        row.violation = "an operation or a transfer despite the refusal"
                    rows.append(row)
                    continue
                op = PaymentOperation.objects.get(purchase_id=pid)
                ctx["op"] = op
                recorded = op.outcome
                after(ctx)
                seen = []
                op = services.operation_reconcile(operation_id=op.id, actor="drill")
                seen.append(op.outcome)
                if "then" in ctx:
                    ctx["then"]()
                    op = services.operation_reconcile(operation_id=op.id, actor="drill")
                    seen.append(op.outcome)
            finally:
                chain.automine(True)
                chain.facilitator_config(pending_status=200)
                chain.reset_clock()
            price = product.price * 10**4  # USD cents -> USDC's 6 decimals
            transfers = chain.transfers(payer.address, price)
            # Judged per operation by the chain judge (bench.x402_judge): the Transfer log
            # THIS authorization's call emitted, from the call trace, not Verity's proof.
            paid = judged_paid(op)
        row = Row(name, recorded, transfers, " -> ".join(seen), op.reason or "")
        if transfers > 1:
            row.violation = "more than one transfer"
        elif op.outcome == "succeeded" and not (paid and transfers == 1):
            row.violation = "succeeded without its transfer on chain"
        elif op.outcome == "failed" and (paid or transfers):
            row.violation = "failed but the money moved"
        elif op.outcome == "failed" and op.reason not in PROVEN_FAILURES:
            row.violation = "failed without the chain proving it"
        elif recorded == "failed":
            row.violation = "shown failed at settle time"
        rows.append(row)

    if not only or "batched_transaction" in only:
        rows.append(batched_attack(http, purchase, chain, judge, product.price * 10**4))
    if not only or "reorg_after_fulfilment" in only:
        rows.append(reorg_after_fulfilment(http, purchase, chain, product.price * 10**4))
    # The whole run at once: every log claimed once, nothing counted that did not arrive,
    # every arrival of one of Verity's authorizations counted.
    audit = judge.audit(
        claims_from_rows(
            X402Authorization.objects.filter(operation__purchase_id__in=made).select_related(
                "operation"
            )
        ),
        settled=True,
    )
    whole = Row(
        "judge_all_drills",
        f"{audit.counted} counted",
        len(audit.paid),
        f"{audit.received} received",
        f"{len(audit.unexplained)} unexplained",
    )
    if audit.violations:
        whole.violation = "; ".join(audit.violations)[:300]
    rows.append(whole)

    print(f"{'drill':24} {'recorded':18} {'transfers':>9}  {'after reconcile':34} reason")
    for r in rows:
        print(
            f"{r.drill:24} {r.recorded:18} {r.transfers:>9}  {r.after:34} {r.reason}"
            + (f"  VIOLATION: {r.violation}" if r.violation else "")
        )
    bad = [r for r in rows if r.violation]
    print(f"{len(rows)} drills, {len(bad)} violation(s)")
    return 1 if bad else 0


def batched_attack(http, purchase, chain, judge, price: int) -> Row:
    """One transaction through a forwarder contract carries authorization M's genuine
    transfer to pay_to and a 1-unit self-transfer signed with nonce N, while the settles of
    N (purchase 1) and M (purchase 2) are both pending: one transfer arrived, so at most
    one purchase is paid, and no log is counted twice."""
    from bench.x402_judge import claims_from_rows
    from payments import services
    from payments.models import PaymentOperation, X402Authorization
    from payments.providers.x402 import decode_header
    from tests.x402.chain import SIGNATURE, sign

    payer = chain.new_payer()
    forwarder = chain.deploy_forwarder()
    first, second = purchase(), purchase()
    headers = {}
    for pid in (first, second):
        required = http.get(f"/api/v1/purchases/{pid}/deliverable").headers["PAYMENT-REQUIRED"]
        headers[pid] = sign(required, payer)
    chain.automine(False)
    try:
        recorded = []
        for pid in (first, second):
            answer = http.get(
                f"/api/v1/purchases/{pid}/deliverable", **{SIGNATURE: headers[pid][0]}
            )
            recorded.append(answer.json().get("code") or str(answer.status_code))
        auth_n, (header_m, auth_m) = headers[first][1], headers[second]
        m_signature = decode_header(header_m)["payload"]["signature"]
        self_n = chain.authorization_for(payer, to=payer.address, value=1, nonce=auth_n["nonce"])
        chain.batch_transfers(
            forwarder, [(auth_m, m_signature), self_n], gas_price=chain.w3.eth.gas_price * 20
        )
        chain.mine()
    finally:
        chain.automine(True)
    ops = [PaymentOperation.objects.get(purchase_id=pid, kind="charge") for pid in (first, second)]
    ops = [services.operation_reconcile(operation_id=op.id, actor="drill") for op in ops]
    http.get(f"/api/v1/purchases/{first}/deliverable", **{SIGNATURE: headers[first][0]})
    ops = [PaymentOperation.objects.get(id=op.id) for op in ops]
    audit = judge.audit(
        claims_from_rows(
            X402Authorization.objects.filter(operation__in=ops).select_related("operation")
        ),
        settled=True,
    )
    transfers = chain.transfers(payer.address, price)
    row = Row(
        "batched_transaction",
        "/".join(recorded),
        transfers,
        " / ".join(op.outcome for op in ops),
        " / ".join(op.reason or "-" for op in ops),
    )
    succeeded = [op for op in ops if op.outcome == "succeeded"]
    if audit.violations:
        row.violation = "; ".join(audit.violations)[:300]
    elif transfers != 1 or len(succeeded) > 1:
        row.violation = f"{len(succeeded)} purchases paid by {transfers} transfer(s)"
    elif ops[1].outcome != "succeeded":
        row.violation = "the genuine transfer did not pay its purchase"
    return row


def reorg_after_fulfilment(http, purchase, chain, price: int) -> Row:
    """Paid and delivered at one confirmation; then the payment's block is replaced
    (anvil_reorg) and the payer cancels the authorization: the transfer is gone for good.
    The finality sweep must turn it into a discrepancy with an owner: failed, support's,
    revenue reversed (the purchase's ledger nets to zero), goods withdrawn, customer told."""
    from django.db.models import Sum

    from payments.models import PaymentOperation, X402Authorization
    from payments.services.x402_finality import x402_finality_sweep
    from recovery.models import EmailMessage, LedgerEntry
    from recovery.relay import relay_drain
    from tests.x402.chain import SIGNATURE, sign

    payer = chain.new_payer()
    pid = purchase()
    required = http.get(f"/api/v1/purchases/{pid}/deliverable").headers["PAYMENT-REQUIRED"]
    header, auth = sign(required, payer)
    recorded = http.get(f"/api/v1/purchases/{pid}/deliverable", **{SIGNATURE: header})
    relay_drain()
    delivered = http.get(f"/api/v1/purchases/{pid}/deliverable").status_code == 200
    op = PaymentOperation.objects.get(purchase_id=pid, kind="charge")
    block = X402Authorization.objects.get(pk=op.id).block_number
    chain.reorg(int(chain.w3.eth.block_number) - int(block) + 1)
    chain.refill_facilitator_nonce()
    chain.cancel_authorization(payer, auth["nonce"])
    chain.mine()
    swept = x402_finality_sweep()
    relay_drain()
    op.refresh_from_db()
    transfers = chain.transfers(payer.address, price)
    ledger = (
        LedgerEntry.objects.filter(purchase_id=pid, account="provider_balance").aggregate(
            s=Sum("amount")
        )["s"]
        or 0
    )
    served = http.get(f"/api/v1/purchases/{pid}/deliverable").status_code == 200
    told = EmailMessage.objects.filter(purchase_id=pid, kind="payment_reversed").exists()
    row = Row(
        "reorg_after_fulfilment",
        f"{recorded.status_code} delivered={delivered}",
        transfers,
        f"succeeded -> {op.outcome} ({op.next_action_owner}) {swept}",
        op.reason or "",
    )
    if op.outcome == "succeeded" and not transfers:
        row.violation = "succeeded and delivered, the transfer is gone (a silent state)"
    elif op.outcome == "failed" and not (
        op.next_action_owner == "support" and ledger == 0 and not served and told
    ):
        row.violation = (
            f"no full discrepancy: owner={op.next_action_owner} ledger={ledger} "
            f"served={served} told={told}"
        )
    return row


def _mined(chain, tx: str) -> bool:
    try:
        chain.w3.eth.get_transaction_receipt(tx)
    except Exception:  # noqa: BLE001 - not mined (dropped, reorged out)
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
