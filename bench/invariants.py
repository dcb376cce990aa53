"""Invariant checker: compares localstripe's objects with Verity's database.

Used by bench/soak.py every 30 s during the run (`live=True`: only what must hold at every
instant) and after the system drained (everything). Needs Django set up against the soak's
database and the provider base URL in settings (the provider itself, not the soak's fault
proxy). With the x402 rail on (X402_ENABLED and X402_RPC_URL), the chain is read too: the
token's AuthorizationUsed and Transfer logs against Verity's x402 rows. Prints one table;
returns violations.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

import requests
from django.conf import settings
from django.db.models import Count, Min, Sum
from django.utils import timezone

PAID_STEPS = ("order", "inventory", "ledger", "confirmation", "crm")


@dataclass
class Report:
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # figure, value, rule
    violations: list[str] = field(default_factory=list)

    def add(self, name: str, value, rule: str = "", ok: bool = True) -> None:
        self.rows.append((name, str(value), rule + ("" if ok else "   <-- VIOLATION")))
        if not ok:
            self.violations.append(f"{name} = {value} ({rule})")

    def print(self) -> None:
        width = max(len(r[0]) for r in self.rows) + 2
        print(f"{'invariant / figure':{width}} {'value':>12}  rule")
        print("-" * (width + 40))
        for name, value, rule in self.rows:
            print(f"{name:{width}} {value:>12}  {rule}")


def _provider_list(resource: str) -> list[dict]:
    base, out, params = settings.STRIPE_API_BASE.rstrip("/"), [], {"limit": 100}
    while True:
        r = requests.get(f"{base}/v1/{resource}", params=params,
                         auth=(settings.STRIPE_API_KEY, ""), timeout=30)
        r.raise_for_status()
        body = r.json()
        out.extend(body["data"])
        if not body.get("has_more") or not body["data"]:
            return out
        params["starting_after"] = body["data"][-1]["id"]


def _provider_has(resource: str, object_id: str) -> bool:
    r = requests.get(f"{settings.STRIPE_API_BASE.rstrip('/')}/v1/{resource}/{object_id}",
                     auth=(settings.STRIPE_API_KEY, ""), timeout=30)
    return r.status_code == 200


def _provider_status(resource: str, object_id: str) -> str:
    if not object_id:
        return ""
    r = requests.get(f"{settings.STRIPE_API_BASE.rstrip('/')}/v1/{resource}/{object_id}",
                     auth=(settings.STRIPE_API_KEY, ""), timeout=30)
    return r.json().get("status", "") if r.status_code == 200 else ""


def _stray_refund_detail(rid: str, refunds: list[dict], by_ref: dict, events) -> str:
    """What Verity holds about a provider refund it did not record: the payment it refunds
    and every stored event about it (result, reason, attempts)."""
    refund = next((r for r in refunds if r["id"] == rid), {})
    payment = by_ref.get(refund.get("payment_intent") or "")
    held = [f"{e.type}:{e.result}:{e.result_reason or '-'}:x{e.attempts}"
            for e in events.objects.filter(payload__data__object__id=rid).order_by("id")]
    return (f"amount={refund.get('amount')} status={refund.get('status')} "
            f"intent={refund.get('payment_intent')} payment="
            + (f"{payment.id} {payment.kind} {payment.outcome} purchase={payment.purchase_id}"
               if payment else "absent")
            + f" events={held or 'none'}")


def check(*, live: bool = False) -> Report:
    from payments.enums import (
        OVERTURN_CAUSE,
        PAYMENT_KINDS,
        OperationKind,
        Outcome,
        Owner,
        PurchaseStatus,
        Rail,
    )
    from payments.models import Hold, PaymentOperation, Purchase
    from payments.selectors import purchase_next_action
    from recovery.models import (
        CrmUpdate,
        EmailMessage,
        InventoryCommit,
        LedgerEntry,
        Order,
        OutboxMessage,
        StepRun,
    )
    from webhooks.models import ProviderEvent

    rep = Report()
    chain = _chain_snapshot()  # the chain first: every transfer in it has its row below
    intents = _provider_list("payment_intents")
    refunds = _provider_list("refunds")
    moved = [pi for pi in intents if pi["status"] in ("succeeded", "requires_capture")]
    per_purchase = Counter((pi.get("metadata") or {}).get("purchase_id") for pi in moved)

    purchases = Purchase.objects.count()
    rep.add("purchases", purchases)
    rep.add("provider payment intents", len(intents))
    rep.add("provider charges (moved money)", len(moved))
    worst = max(per_purchase.values(), default=0)
    rep.add("max charges per purchase", worst, "reported (a second one must be compensated)")
    doubled = [pid for pid, n in per_purchase.items() if pid and n > 1]
    compensated = set(PaymentOperation.objects.filter(
        purchase_id__in=doubled, is_compensation=True).values_list("purchase_id", flat=True))
    uncompensated = [pid for pid in doubled if pid not in compensated]
    rep.add("purchases charged twice, compensation queued", len(doubled) - len(uncompensated))
    rep.add("purchases charged twice, no compensation queued", len(uncompensated),
            "must be 0" + ("" if not live else " (live: reported)"),
            ok=live or not uncompensated)
    for pid in uncompensated[:5]:
        rep.add(f"  {pid}", per_purchase[pid], "charges at the provider")

    # The card provider's checks see card operations; x402 ones are checked against the chain.
    ops = {o.id: o for o in PaymentOperation.objects.filter(kind__in=PAYMENT_KINDS,
                                                           rail=Rail.STRIPE)}
    by_ref = {o.provider_reference: o for o in ops.values() if o.provider_reference}
    status_of = {pi["id"]: pi["status"] for pi in intents}

    def detail(op_id: str) -> str:
        o = ops.get(op_id) or PaymentOperation.objects.get(id=op_id)
        return (f"{o.kind} {o.outcome} grade={o.grade or '-'} verification="
                f"{o.verification or '-'} reason={o.reason or '-'} purchase={o.purchase_id} "
                f"provider={status_of.get(o.provider_reference, 'absent')}")

    lost_at_verity = [pi["id"] for pi in intents
                      if (pi.get("metadata") or {}).get("operation_id") not in ops]
    rep.add("provider objects unknown to Verity", len(lost_at_verity), "must be 0",
            ok=not lost_at_verity)
    ids_at_provider = {pi["id"] for pi in intents}
    # The listing was read before Verity's rows: an object created in between is not in it,
    # so each reference missing from the listing is looked up on its own before it counts.
    lost_at_provider = [r for r in by_ref if r not in ids_at_provider
                        and not _provider_has("payment_intents", r)]
    rep.add("Verity references missing at provider", len(lost_at_provider), "must be 0",
            ok=not lost_at_provider)

    refund_ops = {o.id: o for o in PaymentOperation.objects.filter(kind=OperationKind.REFUND)}
    # A refund made in the provider's dashboard carries no Verity metadata: it is accounted
    # for once Verity recorded it as an external linked operation (its reference).
    refund_refs = {o.provider_reference for o in refund_ops.values() if o.provider_reference}
    stray_refunds = [r["id"] for r in refunds
                     if (r.get("metadata") or {}).get("operation_id") not in refund_ops
                     and r["id"] not in refund_refs]
    rep.add("provider refunds", len(refunds))
    rep.add("provider refunds unknown to Verity", len(stray_refunds), "must be 0"
            + (" after drain" if live else ""), ok=live or not stray_refunds)
    if not live:
        for rid in stray_refunds[:5]:
            rep.add(f"  {rid}", "", _stray_refund_detail(rid, refunds, by_ref, ProviderEvent))
    disputes = _provider_list("disputes")
    rep.add("provider disputes", len(disputes))
    refunded_ok = {r["id"] for r in refunds if r["status"] == "succeeded"}
    refund_contradicted = [o.id for o in refund_ops.values() if o.outcome == Outcome.SUCCEEDED
                           and o.provider_reference not in refunded_ok]
    rep.add("refund succeeded at Verity, not at provider", len(refund_contradicted),
            "must be 0", ok=not refund_contradicted)

    charged_but_failed = [pi["id"] for pi in moved
                          if pi["id"] in by_ref and by_ref[pi["id"]].outcome == Outcome.FAILED]
    # Live, a person's wrong "failed" may stand until verified evidence overturns it.
    rep.add("charged at provider but failed at Verity", len(charged_but_failed), "must be 0"
            + (" after drain" if live else ""), ok=live or not charged_but_failed)
    for pi_id in charged_but_failed[:5]:
        rep.add(f"  {by_ref[pi_id].id}", "", detail(by_ref[pi_id].id))
    moved_ids = {pi["id"] for pi in moved}
    # An authorization that was voided is canceled at the provider, as it should be.
    voided = set(PaymentOperation.objects.filter(kind=OperationKind.VOID,
                                                 outcome=Outcome.SUCCEEDED)
                 .values_list("provider_reference", flat=True))
    succeeded_not_charged = [o.id for o in ops.values() if o.outcome == Outcome.SUCCEEDED
                             and o.provider_reference not in moved_ids
                             and not (o.kind == OperationKind.AUTHORIZE
                                      and o.provider_reference in voided
                                      and status_of.get(o.provider_reference) == "canceled")]

    # The listing was read before Verity's rows: a payment confirmed in between shows its
    # older status there, so each one is read again on its own before it counts.
    confirmed_wrong = [i for i in succeeded_not_charged if ops[i].grade == "confirmed"
                       and _provider_status("payment_intents", ops[i].provider_reference)
                       not in ("succeeded", "requires_capture",
                               *(("canceled",) if ops[i].kind == OperationKind.AUTHORIZE
                                 else ()))]
    rep.add("succeeded at Verity, not at provider", len(succeeded_not_charged), "must be 0"
            + (" after drain" if live else ""), ok=live or not succeeded_not_charged)
    rep.add("provider-confirmed success the provider contradicts", len(confirmed_wrong),
            "must be 0", ok=not confirmed_wrong)
    for op_id in succeeded_not_charged[:5]:
        rep.add(f"  {op_id}", "", detail(op_id))
    if chain is not None:
        _x402(rep, chain, live=live)
    if live:
        _live_effects(rep)
        return rep

    unknown = PaymentOperation.objects.filter(outcome__in=[Outcome.UNKNOWN,
                                                           Outcome.AWAITING_PROVIDER,
                                                           Outcome.AWAITING_BUYER])
    oldest = unknown.aggregate(m=Min("created_at"))["m"]
    rep.add("unknown left (no evidence yet)", unknown.count(), "reported; held allowance")
    rep.add("oldest unknown age (s)",
            int((timezone.now() - oldest).total_seconds()) if oldest else 0)
    # What the provider shows once each kind has been applied there.
    applied = {OperationKind.CAPTURE: ("succeeded",), OperationKind.VOID: ("canceled",)}
    unknown_moved = [o.id for o in unknown if o.kind in (*PAYMENT_KINDS, *applied)
                     and status_of.get(o.provider_reference)
                     in applied.get(o.kind, ("succeeded", "requires_capture"))]
    rep.add("unknown left although the provider charged", len(unknown_moved),
            "must be 0 after drain (reconciler converges)", ok=not unknown_moved)
    for op_id in unknown_moved[:5]:
        rep.add(f"  {op_id}", "", detail(op_id))
    unheld = unknown.filter(kind__in=PAYMENT_KINDS, requested_by_client__isnull=False).exclude(
        id__in=Hold.objects.filter(state="reserved").values("operation_id")).count()
    rep.add("unknown without its reserved hold", unheld, "must be 0", ok=unheld == 0)
    dispatching = PaymentOperation.objects.filter(outcome=Outcome.DISPATCHING).count()
    rep.add("dispatching left after drain", dispatching, "must be 0", ok=dispatching == 0)

    paid_ids = set(PaymentOperation.objects.filter(kind__in=PAYMENT_KINDS,
                                                   outcome=Outcome.SUCCEEDED)
                   .values_list("purchase_id", flat=True))
    rep.add("paid purchases", len(paid_ids))
    steps = defaultdict(Counter)
    for pid, step, state in StepRun.objects.values_list("purchase_id", "step", "state"):
        steps[pid][(step, state)] += 1
    # An interrupted e-mail send is `unknown` (maybe sent): never resent without review.
    review = {pid for pid in paid_ids if steps[pid][("confirmation", "unknown")]
              or any(steps[pid][(s, "manual")] for s in PAID_STEPS)}
    # Refunded or voided before any step was done: nothing to fulfil, rightly (the
    # orchestrator re-checks the purchase before each step, so step rows may exist, pending).
    reversed_early = {pid for pid in Purchase.objects.filter(
        id__in=paid_ids, status__in=[PurchaseStatus.REFUNDED, PurchaseStatus.VOIDED])
        .values_list("id", flat=True)
        if not any(state == "done" for (_step, state) in steps[pid])}
    rep.add("paid purchases reversed before fulfilment", len(reversed_early), "reported")
    # Disputed before any step was done: fulfilment runs only on a paid purchase, so the
    # card network's dispute (its withdrawal booked against the sale) stops it (reported).
    # A dispute pauses fulfilment (nothing more ships while the money is contested): open
    # ones are reported; a lost one ships nothing more and its order is cancelled; a won one
    # resumes the remaining steps (after the drain, one still unfinished is a violation).
    live_orders = set(Order.objects.filter(cancelled_at__isnull=True)
                      .values_list("purchase_id", flat=True))
    paused = {status: {pid for pid in Purchase.objects.filter(id__in=paid_ids, status=status)
                       .values_list("id", flat=True)
                       if any(steps[pid][(s, "done")] != 1 for s in PAID_STEPS)}
              for status in (PurchaseStatus.DISPUTED, PurchaseStatus.DISPUTE_WON,
                             PurchaseStatus.DISPUTE_LOST)}
    disputed_early = set().union(*paused.values())
    rep.add("paid purchases whose fulfilment an open dispute paused",
            len(paused[PurchaseStatus.DISPUTED]), "reported")
    rep.add("won disputes whose fulfilment did not resume",
            len(paused[PurchaseStatus.DISPUTE_WON]), "must be 0" + (" after drain" if live else ""),
            ok=live or not paused[PurchaseStatus.DISPUTE_WON])
    lost_live = paused[PurchaseStatus.DISPUTE_LOST] & live_orders
    rep.add("lost disputes mid-fulfilment, no live order",
            len(paused[PurchaseStatus.DISPUTE_LOST] - live_orders), "reported")
    rep.add("lost disputes mid-fulfilment, order not cancelled", len(lost_live),
            "must be 0" + (" after drain" if live else ""), ok=live or not lost_live)
    # Voided or refunded while fulfilment was under way: the rest of the steps rightly never
    # run, as long as the order was cancelled (the void's compensation) -- reported.
    reversed_mid = {pid for pid in Purchase.objects.filter(
        id__in=paid_ids, status__in=[PurchaseStatus.REFUNDED, PurchaseStatus.VOIDED])
        .values_list("id", flat=True)
        if any(steps[pid][(s, "done")] != 1 for s in PAID_STEPS)} - reversed_early - live_orders
    rep.add("paid purchases reversed during fulfilment, order cancelled",
            len(reversed_mid), "reported")
    incomplete = [pid for pid in paid_ids - review - reversed_early - disputed_early
                  - reversed_mid
                  if any(steps[pid][(s, "done")] != 1 for s in PAID_STEPS)]
    rep.add("paid purchases with a step not done once", len(incomplete), "must be 0",
            ok=not incomplete)
    for pid in incomplete[:5]:
        purchase = Purchase.objects.get(id=pid)
        rep.add(f"  {pid}", purchase.status,
                " ".join(f"{s}:{st}" for (s, st), n in sorted(steps[pid].items()))
                + " | " + " ".join(f"{o.kind}:{o.outcome}:{o.grade or '-'}"
                                   for o in purchase.operations.order_by("created_at")))
    rep.add("paid purchases awaiting a person (e-mail unknown)", len(review), "reported")

    def dupes(model, *fields):
        return model.objects.values(*fields).annotate(n=Count("id")).filter(n__gt=1).count()

    effect_dupes = (dupes(Order, "purchase_id") + dupes(InventoryCommit, "purchase_id", "sku")
                    + dupes(LedgerEntry, "operation_id", "entry_type", "account")
                    + dupes(EmailMessage, "purchase_id", "kind") + dupes(CrmUpdate, "purchase_id"))
    rep.add("downstream effects executed twice", effect_dupes, "must be 0", ok=effect_dupes == 0)
    # A payment fulfilled on a person's "succeeded" that the provider then overturned: its
    # order is cancelled; a sent e-mail cannot be unsent, so the purchase waits in manual
    # review for a person (reported, not a violation).
    overturned = set(PaymentOperation.objects.filter(
        kind__in=PAYMENT_KINDS, outcome=Outcome.FAILED,
        transitions__cause=OVERTURN_CAUSE, purchase__status=PurchaseStatus.MANUAL_REVIEW)
        .values_list("purchase_id", flat=True)) - paid_ids
    orders_unpaid = (Order.objects.exclude(purchase_id__in=paid_ids)
                     .filter(cancelled_at__isnull=True).count())
    mails_unpaid = (EmailMessage.objects.exclude(purchase_id__in=paid_ids)
                    .exclude(purchase_id__in=overturned).count())
    rep.add("orders/e-mails without a verified payment", orders_unpaid + mails_unpaid,
            "must be 0", ok=orders_unpaid + mails_unpaid == 0)
    rep.add("fulfilled on a person's word, overturned (manual review)", len(overturned),
            "reported")

    open_statuses = [PurchaseStatus.PAYMENT_PENDING, PurchaseStatus.PAYMENT_UNKNOWN,
                     PurchaseStatus.ACTION_REQUIRED, PurchaseStatus.MANUAL_REVIEW,
                     PurchaseStatus.REFUND_PENDING]
    ownerless = [p.id for p in Purchase.objects.filter(status__in=open_statuses)
                 if purchase_next_action(p).get("owner") in (None, "", Owner.NONE)]
    rep.add("open purchases without a next owner", len(ownerless), "must be 0",
            ok=not ownerless)
    for pid in ownerless[:5]:
        rep.add(f"  {pid}", "no owner")

    quarantined = ProviderEvent.objects.filter(result="quarantined").count()
    rep.add("quarantined webhook events", quarantined, "reported")

    provider_net = (sum(pi.get("amount_received") or pi["amount"] for pi in intents
                        if pi["status"] == "succeeded")
                    - sum(r["amount"] for r in refunds if r["status"] == "succeeded")
                    # disputes: the withdrawal and fee, and a won dispute's reinstatement
                    + sum(bt["net"] for d in disputes
                          for bt in d.get("balance_transactions") or []))
    # Double entry: the provider-balance account is what the provider should hold.
    x402_ops = PaymentOperation.objects.filter(rail=Rail.X402).values("id")
    ledger_net = (LedgerEntry.objects.filter(account="provider_balance")
                  .exclude(operation_id__in=x402_ops)
                  .aggregate(s=Sum("amount"))["s"] or 0)
    rep.add("ledger minus provider balance", ledger_net - provider_net, "must be 0",
            ok=ledger_net == provider_net)

    _issue30(rep, refunds)

    # Unknown operations keep being read back (reconcile messages come due every few
    # seconds), so "lost" means due for longer than the relay needs to pick it up.
    lagging = OutboxMessage.objects.filter(
        processed_at__isnull=True, available_at__lte=timezone.now() - timedelta(seconds=60))
    rep.add("outbox messages due for over 60 s", lagging.count(), "must be 0",
            ok=not lagging.exists())
    for m in lagging[:5]:
        rep.add(f"  outbox {m.id}", f"cat={m.category}",
                f"attempts={m.attempts} {m.payload} {m.last_error[:80]!r}")
    return rep


def _live_effects(rep: Report) -> None:
    """The downstream rules that hold at every instant, not only after the drain."""
    from payments.enums import OVERTURN_CAUSE, PAYMENT_KINDS, Outcome
    from payments.models import PaymentOperation
    from recovery.models import CrmUpdate, EmailMessage, InventoryCommit, LedgerEntry, Order

    def dupes(model, *fields):
        return model.objects.values(*fields).annotate(n=Count("id")).filter(n__gt=1).count()

    effect_dupes = (dupes(Order, "purchase_id") + dupes(InventoryCommit, "purchase_id", "sku")
                    + dupes(LedgerEntry, "operation_id", "entry_type", "account")
                    + dupes(EmailMessage, "purchase_id", "kind") + dupes(CrmUpdate, "purchase_id"))
    rep.add("downstream effects executed twice", effect_dupes, "must be 0", ok=effect_dupes == 0)
    paid = PaymentOperation.objects.filter(kind__in=PAYMENT_KINDS,
                                           outcome=Outcome.SUCCEEDED).values("purchase_id")
    # just overturned by the provider: the order's cancellation is in the outbox
    overturned = PaymentOperation.objects.filter(kind__in=PAYMENT_KINDS,
                                                 transitions__cause=OVERTURN_CAUSE)
    orders_unpaid = (Order.objects.exclude(purchase_id__in=paid).filter(
        cancelled_at__isnull=True).exclude(purchase_id__in=overturned.values("purchase_id"))
        .count())
    rep.add("orders without a verified payment", orders_unpaid, "must be 0",
            ok=orders_unpaid == 0)


# -- the x402 rail: the chain against Verity's rows ------------------------------------------
@dataclass
class ChainSnapshot:
    chain: object
    used: dict[tuple[str, str], str]  # (payer, nonce) -> transaction, AuthorizationUsed logs
    transfers: list[tuple[str, int, str]]  # Transfer logs to pay_to: (from, value, transaction)
    balance: int  # pay_to's token balance minus what the refund account sent (atomic)


def _chain_snapshot() -> ChainSnapshot | None:
    import os

    if not (settings.X402_ENABLED and settings.X402_ASSET and os.environ.get("X402_RPC_URL")):
        return None
    from web3 import Web3

    from tests.x402.chain import Chain

    chain = Chain()

    def logs(event: str, *topics: str) -> list:
        sig = Web3.to_hex(Web3.keccak(text=event))
        return chain.w3.eth.get_logs({"address": chain.token.address, "fromBlock": 0,
                                      "toBlock": "latest", "topics": [sig, *topics]})

    def address(topic) -> str:
        return "0x" + Web3.to_hex(topic)[-40:]

    pay_to = "0x" + "0" * 24 + chain.pay_to.lower()[2:]
    transfers = [(address(log["topics"][1]), int(Web3.to_hex(log["data"]), 16),
                  Web3.to_hex(log["transactionHash"]))
                 for log in logs("Transfer(address,address,uint256)", None, pay_to)]
    used = {(address(log["topics"][1]), Web3.to_hex(log["topics"][2]).lower()):
            Web3.to_hex(log["transactionHash"])
            for log in logs("AuthorizationUsed(address,bytes32)")}
    # Refunds leave from the separate refund account (issue 31 #4), not from pay_to: the
    # money Verity holds is what pay_to received minus what the refund account sent.
    return ChainSnapshot(chain, used, transfers,
                         chain.balance(chain.pay_to) - chain.refunds_sent())


def _x402(rep: Report, snap: ChainSnapshot, *, live: bool) -> None:
    """At most one transfer per purchase; every transfer known to Verity; no x402 success
    without its transfer; unknown/awaiting never failed while the authorization is usable."""
    from payments.enums import Outcome, Rail
    from payments.models import OperationTransition, PaymentOperation, X402Authorization
    from recovery.models import LedgerEntry

    auths = {(a.payer.lower(), a.nonce.lower()): a
             for a in X402Authorization.objects.select_related("operation")}
    x402_ops = PaymentOperation.objects.filter(rail=Rail.X402)
    rep.add("x402 purchases", x402_ops.values("purchase_id").distinct().count())
    by_outcome = Counter(x402_ops.values_list("outcome", flat=True))
    rep.add("x402 operations", sum(by_outcome.values()),
            " ".join(f"{k}:{v}" for k, v in sorted(by_outcome.items())))
    rep.add("x402 transfers on chain (to pay_to)", len(snap.transfers))
    rep.add("x402 payments made (succeeded)", by_outcome.get(Outcome.SUCCEEDED, 0))

    used_tx = {tx: key for key, tx in snap.used.items()}
    unknown_transfers = [tx for _frm, _v, tx in snap.transfers
                         if used_tx.get(tx) not in auths]
    rep.add("x402 transfers unknown to Verity", len(unknown_transfers), "must be 0",
            ok=not unknown_transfers)
    for tx in unknown_transfers[:5]:
        rep.add(f"  {tx}", "", "Transfer to pay_to without a Verity authorization")

    # A payment is the Transfer(payer -> pay_to, value) log in the transaction that used
    # the authorization's nonce (issue 31): a used nonce alone may be a transfer elsewhere.
    moved = {(frm.lower(), value, tx) for frm, value, tx in snap.transfers}

    def paid(key, a) -> bool:
        tx = snap.used.get(key)
        return bool(tx) and (a.payer.lower(), int(a.value), tx) in moved

    per_purchase = Counter(a.operation.purchase_id for key, a in auths.items() if paid(key, a))
    worst = max(per_purchase.values(), default=0)
    twice = [pid for pid, n in per_purchase.items() if n > 1]
    rep.add("max x402 transfers per purchase", worst, "must be at most 1", ok=worst <= 1)
    for pid in twice[:5]:
        rep.add(f"  {pid}", per_purchase[pid], "transfers on chain")

    def used_now(a) -> bool:  # the snapshot was read first: look again before it counts
        return snap.chain.authorization_used(a.payer, a.nonce)

    no_transfer = [a.operation_id for key, a in auths.items()
                   if a.operation.outcome == Outcome.SUCCEEDED and not paid(key, a)
                   and (key in snap.used or not used_now(a))]
    rep.add("x402 succeeded at Verity, no transfer on chain", len(no_transfer), "must be 0",
            ok=not no_transfer)
    moved_but_failed = [a.operation_id for key, a in auths.items()
                        if a.operation.outcome == Outcome.FAILED and paid(key, a)]
    rep.add("x402 failed at Verity, transfer on chain", len(moved_but_failed), "must be 0",
            ok=not moved_but_failed)
    for op_id in (no_transfer + moved_but_failed)[:5]:
        op = PaymentOperation.objects.get(id=op_id)
        rep.add(f"  {op_id}", op.outcome, f"reason={op.reason or '-'} purchase={op.purchase_id}")

    # Once sent (unknown or awaiting the chain), failed only when the chain proves nothing
    # can move: the authorization expired (chain time >= validBefore) or was cancelled.
    was_open = set(OperationTransition.objects.filter(
        operation__rail=Rail.X402, field="outcome",
        target__in=[Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER]).values_list("operation_id",
                                                                             flat=True))
    chain_time = int(snap.chain.w3.eth.get_block("latest")["timestamp"])
    failed_usable = [a.operation_id for a in auths.values()
                     if a.operation.outcome == Outcome.FAILED and a.operation_id in was_open
                     and chain_time < a.valid_before and not used_now(a)]
    rep.add("x402 unknown/awaiting failed while still usable on chain", len(failed_usable),
            "must be 0", ok=not failed_usable)
    for op_id in failed_usable[:5]:
        op = PaymentOperation.objects.get(id=op_id)
        rep.add(f"  {op_id}", op.outcome, f"reason={op.reason or '-'} purchase={op.purchase_id}")
    rep.add("x402 operations once unknown/awaiting (answer lost, pending)", len(was_open),
            "reported")
    open_now = x402_ops.filter(outcome__in=[Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER]).count()
    rep.add("x402 unknown/awaiting the chain", open_now, "reported")
    if live:
        return
    # Double entry: what the ledger says the x402 payments brought in (refunds taken off)
    # is pay_to's balance minus what the refund account sent back.
    shift = settings.X402_DECIMALS - 2
    ledger = (LedgerEntry.objects.filter(account="provider_balance",
                                         operation_id__in=x402_ops.values("id"))
              .aggregate(s=Sum("amount"))["s"] or 0)
    on_chain, rest = divmod(snap.balance, 10**shift)
    rep.add("x402 ledger minus (pay_to balance - refunds sent)", ledger - on_chain,
            "must be 0",
            ok=ledger == on_chain and not rest)


def _issue30(rep: Report, refunds: list[dict]) -> None:
    """Per operation, on the provider's and the chain's record (issue 30): a linked
    operation is on its payment's rail; a provider refund made by Verity returns money of
    the payment its operation names; a compensated step returns the purchase's own
    payment, never a duplicate's."""
    from payments.models import PaymentOperation
    from recovery.models import StepRun

    linked = PaymentOperation.objects.filter(parent__isnull=False).select_related("parent")
    off_rail = [o.id for o in linked if o.rail != o.parent.rail]
    rep.add("linked operations off their payment's rail", len(off_rail), "must be 0",
            ok=not off_rail)
    for op_id in off_rail[:5]:
        rep.add(f"  {op_id}", "off rail")
    by_op = {(r.get("metadata") or {}).get("operation_id"): r for r in refunds}
    parents = {o.id: o.parent.provider_reference for o in linked if o.id in by_op}
    wrong = [op_id for op_id, ref in parents.items()
             if by_op[op_id].get("payment_intent") and by_op[op_id]["payment_intent"] != ref]
    rep.add("refunds returning another payment's money", len(wrong), "must be 0", ok=not wrong)
    runs = StepRun.objects.exclude(compensation_operation_id="")
    comp = {o.id: o for o in PaymentOperation.objects.filter(
        id__in=runs.values("compensation_operation_id")).select_related("parent")}
    astray = [r.purchase_id for r in runs if (o := comp.get(r.compensation_operation_id))
              is not None and (o.parent is None or o.parent.is_duplicate)]
    rep.add("steps compensated with a duplicate's return", len(astray), "must be 0",
            ok=not astray)
