"""Invariant checker: compares localstripe's objects with Verity's database.

Used by bench/soak.py every 30 s during the run (`live=True`: only what must hold at every
instant) and after the system drained (everything). Needs Django set up against the soak's
database and the provider base URL in settings (the provider itself, not the soak's fault
proxy). With the x402 rail on (X402_ENABLED and X402_RPC_URL), the chain is read too, by
bench/x402_judge.py (raw JSON-RPC logs and call traces, none of Verity's proof code): each
counted x402 payment has the Transfer log its own authorization emitted, no log counts
twice, and what Verity counts equals what its payers sent to pay_to. Prints one table;
returns violations.

Each invariant is one function registered with `@invariant(rule, when)`: `check()` runs
them in registration order, and every violation carries its rule's name (`[rule] figure =
value (must be …)`), so a soak failure says which rule broke, not only which figure. The
reads several rules share (the provider's listings, the chain, Verity's payment rows) are
made once per check by `Facts`, in the order the rules depend on: the chain and the
provider first, then Verity's rows, so anything Verity wrote in between is looked up again
rather than counted.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from functools import cached_property

import requests
from django.conf import settings
from django.db.models import Count, F, Max, Min, Sum
from django.utils import timezone

PAID_STEPS = ("order", "inventory", "ledger", "confirmation", "crm")


@dataclass
class Report:
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # figure, value, rule
    violations: list[str] = field(default_factory=list)
    invariant: str = ""  # the rule being checked: each violation names it

    def add(self, name: str, value, rule: str = "", ok: bool = True) -> None:
        mark = "" if ok else f"   [{self.invariant}] <-- VIOLATION"
        self.rows.append((name, str(value), rule + mark))
        if not ok:
            self.violations.append(f"[{self.invariant}] {name} = {value} ({rule})")

    def print(self) -> None:
        width = max(len(r[0]) for r in self.rows) + 2
        print(f"{'invariant / figure':{width}} {'value':>12}  rule")
        print("-" * (width + 40))
        for name, value, rule in self.rows:
            print(f"{name:{width}} {value:>12}  {rule}")


class When(Enum):
    ALWAYS = "always"  # during the run (live) and after the drain
    LIVE = "live"  # during the run only (after the drain a stricter rule replaces it)
    DRAINED = "drained"  # after the drain only: in flight, it may not hold yet


@dataclass(frozen=True)
class Invariant:
    rule: str
    when: When
    fn: Callable[[Facts, Report], None]


INVARIANTS: list[Invariant] = []


def invariant(rule: str, when: When = When.ALWAYS):
    """Register one rule (its figures, its check, the rows that explain a violation)."""

    def register(fn):
        if any(i.rule == rule for i in INVARIANTS):
            raise ValueError(f"invariant {rule!r} is registered twice")
        INVARIANTS.append(Invariant(rule, when, fn))
        return fn

    return register


def check(*, live: bool = False) -> Report:
    rep = Report()
    facts = Facts(live=live)
    for inv in INVARIANTS:
        if inv.when is (When.DRAINED if live else When.LIVE):
            continue
        rep.invariant = inv.rule
        inv.fn(facts, rep)
    rep.invariant = ""
    return rep


def _provider_list(resource: str) -> list[dict]:
    base, out, params = settings.STRIPE_API_BASE.rstrip("/"), [], {"limit": 100}
    while True:
        r = requests.get(
            f"{base}/v1/{resource}", params=params, auth=(settings.STRIPE_API_KEY, ""), timeout=30
        )
        r.raise_for_status()
        body = r.json()
        out.extend(body["data"])
        if not body.get("has_more") or not body["data"]:
            return out
        params["starting_after"] = body["data"][-1]["id"]


def _provider_has(resource: str, object_id: str) -> bool:
    r = requests.get(
        f"{settings.STRIPE_API_BASE.rstrip('/')}/v1/{resource}/{object_id}",
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=30,
    )
    return r.status_code == 200


def _provider_status(resource: str, object_id: str) -> str:
    if not object_id:
        return ""
    r = requests.get(
        f"{settings.STRIPE_API_BASE.rstrip('/')}/v1/{resource}/{object_id}",
        auth=(settings.STRIPE_API_KEY, ""),
        timeout=30,
    )
    return r.json().get("status", "") if r.status_code == 200 else ""


def _stray_refund_detail(rid: str, refunds: list[dict], by_ref: dict, events) -> str:
    """What Verity holds about a provider refund it did not record: the payment it refunds
    and every stored event about it (result, reason, attempts)."""
    refund = next((r for r in refunds if r["id"] == rid), {})
    payment = by_ref.get(refund.get("payment_intent") or "")
    held = [
        f"{e.type}:{e.result}:{e.result_reason or '-'}:x{e.attempts}"
        for e in events.objects.filter(payload__data__object__id=rid).order_by("id")
    ]
    return (
        f"amount={refund.get('amount')} status={refund.get('status')} "
        f"intent={refund.get('payment_intent')} payment="
        + (
            f"{payment.id} {payment.kind} {payment.outcome} purchase={payment.purchase_id}"
            if payment
            else "absent"
        )
        + f" events={held or 'none'}"
    )


class Facts:
    """What several rules read, read once per check. The chain and the provider's listings
    are read when the check starts, before any of Verity's rows."""

    def __init__(self, *, live: bool) -> None:
        self.live = live
        self.chain = _chain_snapshot()  # the chain first: every transfer in it has its row
        self.intents = _provider_list("payment_intents")
        self.refunds = _provider_list("refunds")

    @cached_property
    def disputes(self) -> list[dict]:
        return _provider_list("disputes")

    @cached_property
    def moved(self) -> list[dict]:
        return [pi for pi in self.intents if pi["status"] in ("succeeded", "requires_capture")]

    @cached_property
    def moved_ids(self) -> set[str]:
        return {pi["id"] for pi in self.moved}

    @cached_property
    def status_of(self) -> dict[str, str]:
        return {pi["id"]: pi["status"] for pi in self.intents}

    @cached_property
    def ops(self) -> dict:
        """Card payments (the card provider's checks; x402 ones are checked on the chain)."""
        from payments.enums import PAYMENT_KINDS, Rail
        from payments.models import PaymentOperation

        return {
            o.id: o
            for o in PaymentOperation.objects.filter(kind__in=PAYMENT_KINDS, rail=Rail.STRIPE)
        }

    @cached_property
    def by_ref(self) -> dict:
        return {o.provider_reference: o for o in self.ops.values() if o.provider_reference}

    @cached_property
    def refund_ops(self) -> dict:
        from payments.enums import OperationKind
        from payments.models import PaymentOperation

        return {o.id: o for o in PaymentOperation.objects.filter(kind=OperationKind.REFUND)}

    @cached_property
    def succeeded_not_charged(self) -> list[str]:
        from payments.enums import OperationKind, Outcome
        from payments.models import PaymentOperation

        # An authorization that was voided is canceled at the provider, as it should be.
        voided = set(
            PaymentOperation.objects.filter(
                kind=OperationKind.VOID, outcome=Outcome.SUCCEEDED
            ).values_list("provider_reference", flat=True)
        )
        return [
            o.id
            for o in self.ops.values()
            if o.outcome == Outcome.SUCCEEDED
            and o.provider_reference not in self.moved_ids
            and not (
                o.kind == OperationKind.AUTHORIZE
                and o.provider_reference in voided
                and self.status_of.get(o.provider_reference) == "canceled"
            )
        ]

    def detail(self, op_id: str) -> str:
        from payments.models import PaymentOperation

        o = self.ops.get(op_id) or PaymentOperation.objects.get(id=op_id)
        return (
            f"{o.kind} {o.outcome} grade={o.grade or '-'} verification="
            f"{o.verification or '-'} reason={o.reason or '-'} purchase={o.purchase_id} "
            f"provider={self.status_of.get(o.provider_reference, 'absent')}"
        )

    # -- fulfilment (after the drain) --

    @cached_property
    def paid_ids(self) -> set[str]:
        from payments.enums import PAYMENT_KINDS, Outcome
        from payments.models import PaymentOperation

        return set(
            PaymentOperation.objects.filter(
                kind__in=PAYMENT_KINDS, outcome=Outcome.SUCCEEDED
            ).values_list("purchase_id", flat=True)
        )

    @cached_property
    def steps(self) -> dict:
        from recovery.models import StepRun

        steps = defaultdict(Counter)
        for pid, step, state in StepRun.objects.values_list("purchase_id", "step", "state"):
            steps[pid][(step, state)] += 1
        return steps

    def unfinished(self, pid: str) -> bool:
        return any(self.steps[pid][(s, "done")] != 1 for s in PAID_STEPS)

    @cached_property
    def awaiting_review(self) -> set[str]:
        # An interrupted e-mail send is `unknown` (maybe sent): never resent without review.
        return {
            pid
            for pid in self.paid_ids
            if self.steps[pid][("confirmation", "unknown")]
            or any(self.steps[pid][(s, "manual")] for s in PAID_STEPS)
        }

    def _paid_in(self, *statuses) -> list[str]:
        from payments.models import Purchase

        return list(
            Purchase.objects.filter(id__in=self.paid_ids, status__in=statuses).values_list(
                "id", flat=True
            )
        )

    @cached_property
    def reversed_early(self) -> set[str]:
        # Refunded or voided before any step was done: nothing to fulfil, rightly (the
        # orchestrator re-checks the purchase before each step, so step rows may exist).
        from payments.enums import PurchaseStatus

        return {
            pid
            for pid in self._paid_in(PurchaseStatus.REFUNDED, PurchaseStatus.VOIDED)
            if not any(state == "done" for (_step, state) in self.steps[pid])
        }

    @cached_property
    def live_orders(self) -> set[str]:
        from recovery.models import Order

        return set(
            Order.objects.filter(cancelled_at__isnull=True).values_list("purchase_id", flat=True)
        )

    @cached_property
    def paused_by_dispute(self) -> dict:
        from payments.enums import PurchaseStatus

        return {
            status: {pid for pid in self._paid_in(status) if self.unfinished(pid)}
            for status in (
                PurchaseStatus.DISPUTED,
                PurchaseStatus.DISPUTE_WON,
                PurchaseStatus.DISPUTE_LOST,
            )
        }

    @cached_property
    def reversed_mid(self) -> set[str]:
        # Voided or refunded while fulfilment was under way: the rest of the steps rightly
        # never run, as long as the order was cancelled (the void's compensation).
        from payments.enums import PurchaseStatus

        return (
            {
                pid
                for pid in self._paid_in(PurchaseStatus.REFUNDED, PurchaseStatus.VOIDED)
                if self.unfinished(pid)
            }
            - self.reversed_early
            - self.live_orders
        )


def _after_drain(live: bool) -> str:
    return " after drain" if live else ""


def _dupes(model, *fields) -> int:
    return model.objects.values(*fields).annotate(n=Count("id")).filter(n__gt=1).count()


def _effects_executed_twice() -> int:
    from recovery.models import CrmUpdate, EmailMessage, InventoryCommit, LedgerEntry, Order

    return (
        _dupes(Order, "purchase_id")
        + _dupes(InventoryCommit, "purchase_id", "sku")
        + _dupes(LedgerEntry, "operation_id", "entry_type", "account")
        + _dupes(EmailMessage, "purchase_id", "kind")
        + _dupes(CrmUpdate, "purchase_id")
    )


# -- the card provider against Verity's rows ----------------------------------------------


@invariant("charged-twice-compensated")
def _charged_twice_compensated(f: Facts, rep: Report) -> None:
    """A purchase charged twice at the provider has a compensation queued (after the
    drain; live, reported)."""
    from payments.models import PaymentOperation, Purchase

    per_purchase = Counter((pi.get("metadata") or {}).get("purchase_id") for pi in f.moved)
    rep.add("purchases", Purchase.objects.count())
    rep.add("provider payment intents", len(f.intents))
    rep.add("provider charges (moved money)", len(f.moved))
    worst = max(per_purchase.values(), default=0)
    rep.add("max charges per purchase", worst, "reported (a second one must be compensated)")
    doubled = [pid for pid, n in per_purchase.items() if pid and n > 1]
    compensated = set(
        PaymentOperation.objects.filter(purchase_id__in=doubled, is_compensation=True).values_list(
            "purchase_id", flat=True
        )
    )
    uncompensated = [pid for pid in doubled if pid not in compensated]
    rep.add("purchases charged twice, compensation queued", len(doubled) - len(uncompensated))
    rep.add(
        "purchases charged twice, no compensation queued",
        len(uncompensated),
        "must be 0" + ("" if not f.live else " (live: reported)"),
        ok=f.live or not uncompensated,
    )
    for pid in uncompensated[:5]:
        rep.add(f"  {pid}", per_purchase[pid], "charges at the provider")


@invariant("provider-objects-known")
def _provider_objects_known(f: Facts, rep: Report) -> None:
    """Every payment intent at the provider is one of Verity's operations."""
    lost_at_verity = [
        pi["id"] for pi in f.intents if (pi.get("metadata") or {}).get("operation_id") not in f.ops
    ]
    rep.add(
        "provider objects unknown to Verity",
        len(lost_at_verity),
        "must be 0",
        ok=not lost_at_verity,
    )


# A PaymentIntent in these statuses can still be completed by whoever holds the secret key.
PAYABLE_INTENT = ("requires_payment_method", "requires_confirmation", "requires_action")


@invariant("no-payable-intent-beside-the-record", When.DRAINED)
def _no_payable_intent_beside_the_record(f: Facts, rep: Report) -> None:
    """A PaymentIntent left payable at the provider is the one an open operation follows:
    never one whose operation is settled (a failed payment's, or a create whose answer was
    lost while Verity went on), never one its operation does not name, never two for one
    operation. A person's word is left out: it is read back before it stands."""
    from payments.enums import Grade, Outcome

    payable = [pi for pi in f.intents if pi["status"] in PAYABLE_INTENT]
    per_op: dict[str, int] = {}
    for pi in payable:
        op_id = (pi.get("metadata") or {}).get("operation_id", "")
        per_op[op_id] = per_op.get(op_id, 0) + 1
    beside = [
        pi["id"]
        for pi in payable
        if (o := f.ops.get((pi.get("metadata") or {}).get("operation_id", ""))) is not None
        and o.grade != Grade.ACKNOWLEDGED
        and (
            o.outcome in (Outcome.SUCCEEDED, Outcome.FAILED)
            or (o.provider_reference and o.provider_reference != pi["id"])
            or per_op[o.id] > 1
        )
    ]
    rep.add("payable payment intents at the provider", len(payable))
    rep.add(
        "payable payment intents beside Verity's record",
        len(beside),
        "must be 0",
        ok=not beside,
    )
    for pi_id in beside[:5]:
        op_id = next(
            (pi.get("metadata") or {}).get("operation_id", "")
            for pi in payable
            if pi["id"] == pi_id
        )
        rep.add(f"  {pi_id}", "", f.detail(op_id) if op_id in f.ops else "no operation")


@invariant("references-exist-at-provider")
def _references_exist_at_provider(f: Facts, rep: Report) -> None:
    """Every provider reference Verity stored exists at the provider."""
    ids_at_provider = {pi["id"] for pi in f.intents}
    # The listing was read before Verity's rows: an object created in between is not in it,
    # so each reference missing from the listing is looked up on its own before it counts.
    lost_at_provider = [
        r for r in f.by_ref if r not in ids_at_provider and not _provider_has("payment_intents", r)
    ]
    rep.add(
        "Verity references missing at provider",
        len(lost_at_provider),
        "must be 0",
        ok=not lost_at_provider,
    )


@invariant("provider-refunds-known")
def _provider_refunds_known(f: Facts, rep: Report) -> None:
    """Every refund at the provider is Verity's, or recorded as made outside Verity (after
    the drain)."""
    from webhooks.models import ProviderEvent

    # A refund made in the provider's dashboard carries no Verity metadata: it is accounted
    # for once Verity recorded it as an external linked operation (its reference).
    refund_refs = {o.provider_reference for o in f.refund_ops.values() if o.provider_reference}
    stray_refunds = [
        r["id"]
        for r in f.refunds
        if (r.get("metadata") or {}).get("operation_id") not in f.refund_ops
        and r["id"] not in refund_refs
    ]
    rep.add("provider refunds", len(f.refunds))
    rep.add(
        "provider refunds unknown to Verity",
        len(stray_refunds),
        "must be 0" + _after_drain(f.live),
        ok=f.live or not stray_refunds,
    )
    if not f.live:
        for rid in stray_refunds[:5]:
            rep.add(f"  {rid}", "", _stray_refund_detail(rid, f.refunds, f.by_ref, ProviderEvent))
    rep.add("provider disputes", len(f.disputes))


@invariant("refund-success-confirmed-by-provider")
def _refund_success_confirmed(f: Facts, rep: Report) -> None:
    from payments.enums import Outcome

    refunded_ok = {r["id"] for r in f.refunds if r["status"] == "succeeded"}
    # The listing was read before Verity's rows: a refund made and recorded in between is
    # not in it, so each one missing from the listing is read on its own before it counts.
    refund_contradicted = [
        o.id
        for o in f.refund_ops.values()
        if o.outcome == Outcome.SUCCEEDED
        and o.provider_reference not in refunded_ok
        and _provider_status("refunds", o.provider_reference) != "succeeded"
    ]
    rep.add(
        "refund succeeded at Verity, not at provider",
        len(refund_contradicted),
        "must be 0",
        ok=not refund_contradicted,
    )
    for op_id in refund_contradicted[:5]:
        o = f.refund_ops[op_id]
        rep.add(
            f"  {op_id}",
            "",
            f"grade={o.grade} verification={o.verification} reason={o.reason or '-'} "
            f"refund={o.provider_reference or '-'} "
            f"provider={_provider_status('refunds', o.provider_reference) or 'absent'}",
        )


@invariant("charged-never-failed")
def _charged_never_failed(f: Facts, rep: Report) -> None:
    """Money the provider moved is never a failed payment at Verity (after the drain: live,
    a person's wrong "failed" may stand until verified evidence overturns it)."""
    from payments.enums import Outcome

    charged_but_failed = [
        pi["id"]
        for pi in f.moved
        if pi["id"] in f.by_ref and f.by_ref[pi["id"]].outcome == Outcome.FAILED
    ]
    rep.add(
        "charged at provider but failed at Verity",
        len(charged_but_failed),
        "must be 0" + _after_drain(f.live),
        ok=f.live or not charged_but_failed,
    )
    for pi_id in charged_but_failed[:5]:
        rep.add(f"  {f.by_ref[pi_id].id}", "", f.detail(f.by_ref[pi_id].id))


@invariant("success-means-charged")
def _success_means_charged(f: Facts, rep: Report) -> None:
    """A payment Verity shows succeeded moved money at the provider (after the drain)."""
    rep.add(
        "succeeded at Verity, not at provider",
        len(f.succeeded_not_charged),
        "must be 0" + _after_drain(f.live),
        ok=f.live or not f.succeeded_not_charged,
    )


@invariant("provider-confirmed-success-stands")
def _provider_confirmed_success_stands(f: Facts, rep: Report) -> None:
    """A success the provider confirmed is never contradicted by the provider (at every
    instant)."""
    from payments.enums import OperationKind

    # The listing was read before Verity's rows: a payment confirmed in between shows its
    # older status there, so each one is read again on its own before it counts.
    confirmed_wrong = [
        i
        for i in f.succeeded_not_charged
        if f.ops[i].grade == "confirmed"
        and _provider_status("payment_intents", f.ops[i].provider_reference)
        not in (
            "succeeded",
            "requires_capture",
            *(("canceled",) if f.ops[i].kind == OperationKind.AUTHORIZE else ()),
        )
    ]
    rep.add(
        "provider-confirmed success the provider contradicts",
        len(confirmed_wrong),
        "must be 0",
        ok=not confirmed_wrong,
    )
    for op_id in f.succeeded_not_charged[:5]:
        rep.add(f"  {op_id}", "", f.detail(op_id))


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
        return chain.w3.eth.get_logs(
            {
                "address": chain.token.address,
                "fromBlock": 0,
                "toBlock": "latest",
                "topics": [sig, *topics],
            }
        )

    def address(topic) -> str:
        return "0x" + Web3.to_hex(topic)[-40:]

    pay_to = "0x" + "0" * 24 + chain.pay_to.lower()[2:]
    transfers = [
        (
            address(log["topics"][1]),
            int(Web3.to_hex(log["data"]), 16),
            Web3.to_hex(log["transactionHash"]),
        )
        for log in logs("Transfer(address,address,uint256)", None, pay_to)
    ]
    used = {
        (address(log["topics"][1]), Web3.to_hex(log["topics"][2]).lower()): Web3.to_hex(
            log["transactionHash"]
        )
        for log in logs("AuthorizationUsed(address,bytes32)")
    }
    # Refunds leave from the separate refund account, not from pay_to: the
    # money Verity holds is what pay_to received minus what the refund account sent.
    return ChainSnapshot(chain, used, transfers, chain.balance(chain.pay_to) - chain.refunds_sent())


# -- the x402 rail: the chain against Verity's rows ------------------------------------------


class X402Facts:
    """Verity's x402 authorizations against the chain, judged by bench.x402_judge: which
    Transfer log to pay_to each authorization's own call emitted (the call trace), read
    with raw JSON-RPC. Never Verity's proof code, never its proof columns."""

    def __init__(self, snap: ChainSnapshot) -> None:
        from bench.x402_judge import claims_from_rows, judge_from_env
        from payments.enums import Rail
        from payments.models import PaymentOperation, X402Authorization

        self.snap = snap
        self.auths = {
            (a.payer.lower(), a.nonce.lower()): a
            for a in X402Authorization.objects.select_related("operation")
        }
        self.ops = PaymentOperation.objects.filter(rail=Rail.X402)
        self.claims = claims_from_rows(self.auths.values())
        self.judge = judge_from_env()
        self.audit = self.judge.audit(self.claims)

    def paid(self, key, a) -> bool:
        return self.audit.paid.get(a.operation_id) is not None

    def used_now(self, a) -> bool:  # the snapshot was read first: look again before it counts
        return self.snap.chain.authorization_used(a.payer, a.nonce)


def _x402_facts(f: Facts) -> X402Facts | None:
    if f.chain is None:
        return None
    if "_x402" not in f.__dict__:
        f.__dict__["_x402"] = X402Facts(f.chain)
    return f.__dict__["_x402"]


def x402_invariant(rule: str, when: When = When.ALWAYS):
    """A rule of the x402 rail: skipped when the chain is not part of the run."""

    def register(fn):
        def run(f: Facts, rep: Report) -> None:
            x = _x402_facts(f)
            if x is not None:
                fn(f, x, rep)

        run.__doc__, run.__name__ = fn.__doc__, fn.__name__
        invariant(rule, when)(run)
        return fn

    return register


@x402_invariant("x402-transfers-known")
def _x402_transfers_known(f: Facts, x: X402Facts, rep: Report) -> None:
    from payments.enums import Outcome

    rep.add("x402 purchases", x.ops.values("purchase_id").distinct().count())
    by_outcome = Counter(x.ops.values_list("outcome", flat=True))
    rep.add(
        "x402 operations",
        sum(by_outcome.values()),
        " ".join(f"{k}:{v}" for k, v in sorted(by_outcome.items())),
    )
    rep.add("x402 transfers on chain (to pay_to)", len(x.snap.transfers))
    rep.add("x402 payments made (succeeded)", by_outcome.get(Outcome.SUCCEEDED, 0))
    # Arrivals from Verity's payers that no authorization of Verity's explains (a payer's
    # own transfer, another of its nonces): money Verity did not ask for, reported.
    rep.add("x402 arrivals no Verity authorization explains", len(x.audit.unexplained), "reported")
    for a in x.audit.unexplained[:5]:
        rep.add(f"  {a.transaction}#{a.log_index}", a.value, f"from {a.sender}")


@x402_invariant("x402-each-log-claimed-once")
def _x402_each_log_claimed_once(f: Facts, x: X402Facts, rep: Report) -> None:
    """Each operation Verity counts as paid has the Transfer log its own authorization
    emitted; each log (transaction, log index) is claimed once; Verity never counts more
    than arrived from its payers (bench.x402_judge, from the raw chain)."""
    rep.add("x402 counted as received (atomic)", x.audit.counted, "reported")
    rep.add(
        "x402 Transfer logs to pay_to from Verity's payers (atomic)",
        x.audit.received,
        "at least the counted",
    )
    rep.add(
        "x402 claims the raw chain contradicts",
        len(x.audit.violations),
        "must be 0",
        ok=not x.audit.violations,
    )
    for v in x.audit.violations[:5]:
        rep.add(f"  {v[:100]}", "", "")


@x402_invariant("x402-received-equals-counted", When.DRAINED)
def _x402_received_equals_counted(f: Facts, x: X402Facts, rep: Report) -> None:
    """Drained: what arrived from Verity's payers is what Verity counts, but for arrivals
    no authorization of Verity's explains; an authorization's arrival is counted."""
    settled = x.judge.audit(x.claims, settled=True)
    extra = sum(a.value for a in settled.unexplained)
    rep.add(
        "x402 received - counted - unexplained (atomic)",
        settled.received - settled.counted - extra,
        "must be 0",
        ok=settled.received - settled.counted - extra == 0,
    )
    late = [v for v in settled.violations if "does not count it" in v]
    rep.add("x402 transfers arrived, payment not counted", len(late), "must be 0", ok=not late)
    for v in late[:5]:
        rep.add(f"  {v[:100]}", "", "")


@x402_invariant("x402-one-transfer-per-purchase")
def _x402_one_transfer_per_purchase(f: Facts, x: X402Facts, rep: Report) -> None:
    per_purchase = Counter(a.operation.purchase_id for key, a in x.auths.items() if x.paid(key, a))
    worst = max(per_purchase.values(), default=0)
    twice = [pid for pid, n in per_purchase.items() if n > 1]
    rep.add("max x402 transfers per purchase", worst, "must be at most 1", ok=worst <= 1)
    for pid in twice[:5]:
        rep.add(f"  {pid}", per_purchase[pid], "transfers on chain")


@x402_invariant("x402-outcome-matches-chain")
def _x402_outcome_matches_chain(f: Facts, x: X402Facts, rep: Report) -> None:
    """No x402 success without its transfer; no x402 failure with one."""
    from payments.enums import Outcome
    from payments.models import PaymentOperation

    no_transfer = [
        a.operation_id
        for key, a in x.auths.items()
        if a.operation.outcome == Outcome.SUCCEEDED
        and not x.paid(key, a)
        and (key in x.snap.used or not x.used_now(a))
    ]
    rep.add(
        "x402 succeeded at Verity, no transfer on chain",
        len(no_transfer),
        "must be 0",
        ok=not no_transfer,
    )
    moved_but_failed = [
        a.operation_id
        for key, a in x.auths.items()
        if a.operation.outcome == Outcome.FAILED and x.paid(key, a)
    ]
    rep.add(
        "x402 failed at Verity, transfer on chain",
        len(moved_but_failed),
        "must be 0",
        ok=not moved_but_failed,
    )
    for op_id in (no_transfer + moved_but_failed)[:5]:
        op = PaymentOperation.objects.get(id=op_id)
        rep.add(f"  {op_id}", op.outcome, f"reason={op.reason or '-'} purchase={op.purchase_id}")


@x402_invariant("x402-failed-only-when-unusable")
def _x402_failed_only_when_unusable(f: Facts, x: X402Facts, rep: Report) -> None:
    """Once sent (unknown or awaiting the chain), failed only when the chain proves nothing
    can move: the authorization expired (chain time >= validBefore) or was cancelled."""
    from payments.enums import Outcome, Rail
    from payments.models import OperationTransition, PaymentOperation

    was_open = set(
        OperationTransition.objects.filter(
            operation__rail=Rail.X402,
            field="outcome",
            target__in=[Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER],
        ).values_list("operation_id", flat=True)
    )
    chain_time = int(x.snap.chain.w3.eth.get_block("latest")["timestamp"])
    failed_usable = [
        a.operation_id
        for a in x.auths.values()
        if a.operation.outcome == Outcome.FAILED
        and a.operation_id in was_open
        and chain_time < a.valid_before
        and not x.used_now(a)
    ]
    rep.add(
        "x402 unknown/awaiting failed while still usable on chain",
        len(failed_usable),
        "must be 0",
        ok=not failed_usable,
    )
    for op_id in failed_usable[:5]:
        op = PaymentOperation.objects.get(id=op_id)
        rep.add(f"  {op_id}", op.outcome, f"reason={op.reason or '-'} purchase={op.purchase_id}")
    rep.add(
        "x402 operations once unknown/awaiting (answer lost, pending)", len(was_open), "reported"
    )
    open_now = x.ops.filter(outcome__in=[Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER]).count()
    rep.add("x402 unknown/awaiting the chain", open_now, "reported")


@x402_invariant("x402-ledger-matches-chain", When.DRAINED)
def _x402_ledger_matches_chain(f: Facts, x: X402Facts, rep: Report) -> None:
    """Double entry: what the ledger says the x402 payments brought in (refunds taken off)
    is pay_to's balance minus what the refund account sent back."""
    from recovery.models import LedgerEntry

    shift = settings.X402_DECIMALS - 2
    ledger = (
        LedgerEntry.objects.filter(
            account="provider_balance", operation_id__in=x.ops.values("id")
        ).aggregate(s=Sum("amount"))["s"]
        or 0
    )
    on_chain, rest = divmod(x.snap.balance, 10**shift)
    rep.add(
        "x402 ledger minus (pay_to balance - refunds sent)",
        ledger - on_chain,
        "must be 0",
        ok=ledger == on_chain and not rest,
    )


# -- downstream effects at every instant -------------------------------------------------


@invariant("effects-once-live", When.LIVE)
def _effects_once_live(f: Facts, rep: Report) -> None:
    """The downstream rules that hold at every instant, not only after the drain."""
    from payments.enums import OVERTURN_CAUSE, PAYMENT_KINDS, Outcome
    from payments.models import PaymentOperation
    from recovery.models import Order

    effect_dupes = _effects_executed_twice()
    rep.add("downstream effects executed twice", effect_dupes, "must be 0", ok=effect_dupes == 0)
    paid = PaymentOperation.objects.filter(
        kind__in=PAYMENT_KINDS, outcome=Outcome.SUCCEEDED
    ).values("purchase_id")
    # just overturned by the provider: the order's cancellation is in the outbox
    overturned = PaymentOperation.objects.filter(
        kind__in=PAYMENT_KINDS, transitions__cause=OVERTURN_CAUSE
    )
    orders_unpaid = (
        Order.objects.exclude(purchase_id__in=paid)
        .filter(cancelled_at__isnull=True)
        .exclude(purchase_id__in=overturned.values("purchase_id"))
        .count()
    )
    rep.add("orders without a verified payment", orders_unpaid, "must be 0", ok=orders_unpaid == 0)


# -- after the drain ----------------------------------------------------------------------


@invariant("unknown-converges", When.DRAINED)
def _unknown_converges(f: Facts, rep: Report) -> None:
    """No operation is left unknown although the provider applied it (the reconciler
    converges); what is left unknown holds its reserved hold; nothing is left dispatching."""
    from payments.enums import PAYMENT_KINDS, OperationKind, Outcome
    from payments.models import Hold, PaymentOperation

    unknown = PaymentOperation.objects.filter(
        outcome__in=[Outcome.UNKNOWN, Outcome.AWAITING_PROVIDER, Outcome.AWAITING_BUYER]
    )
    oldest = unknown.aggregate(m=Min("created_at"))["m"]
    rep.add("unknown left (no evidence yet)", unknown.count(), "reported; held allowance")
    rep.add(
        "oldest unknown age (s)", int((timezone.now() - oldest).total_seconds()) if oldest else 0
    )
    # What the provider shows once each kind has been applied there.
    applied = {OperationKind.CAPTURE: ("succeeded",), OperationKind.VOID: ("canceled",)}
    unknown_moved = [
        o.id
        for o in unknown
        if o.kind in (*PAYMENT_KINDS, *applied)
        and f.status_of.get(o.provider_reference)
        in applied.get(o.kind, ("succeeded", "requires_capture"))
    ]
    rep.add(
        "unknown left although the provider charged",
        len(unknown_moved),
        "must be 0 after drain (reconciler converges)",
        ok=not unknown_moved,
    )
    for op_id in unknown_moved[:5]:
        rep.add(f"  {op_id}", "", f.detail(op_id))
    # The hold is reserved when the money step is claimed: a two-step payment left unknown
    # after its create (its answer lost) claimed none, and Verity sent nothing that moves money.
    unheld = (
        unknown.filter(
            kind__in=PAYMENT_KINDS,
            requested_by_client__isnull=False,
            confirm_claimed_at__isnull=False,
        )
        .exclude(id__in=Hold.objects.filter(state="reserved").values("operation_id"))
        .count()
    )
    rep.add("unknown without its reserved hold", unheld, "must be 0", ok=unheld == 0)
    dispatching = PaymentOperation.objects.filter(outcome=Outcome.DISPATCHING).count()
    rep.add("dispatching left after drain", dispatching, "must be 0", ok=dispatching == 0)


@invariant("won-dispute-resumes", When.DRAINED)
def _won_dispute_resumes(f: Facts, rep: Report) -> None:
    """A dispute pauses fulfilment (nothing more ships while the money is contested): open
    ones are reported; a won one resumes the remaining steps."""
    from payments.enums import PurchaseStatus

    rep.add("paid purchases", len(f.paid_ids))
    rep.add("paid purchases reversed before fulfilment", len(f.reversed_early), "reported")
    paused = f.paused_by_dispute
    rep.add(
        "paid purchases whose fulfilment an open dispute paused",
        len(paused[PurchaseStatus.DISPUTED]),
        "reported",
    )
    rep.add(
        "won disputes whose fulfilment did not resume",
        len(paused[PurchaseStatus.DISPUTE_WON]),
        "must be 0",
        ok=not paused[PurchaseStatus.DISPUTE_WON],
    )


@invariant("lost-dispute-cancels-order", When.DRAINED)
def _lost_dispute_cancels_order(f: Facts, rep: Report) -> None:
    """A dispute lost mid-fulfilment ships nothing more and its order is cancelled."""
    from payments.enums import PurchaseStatus

    lost = f.paused_by_dispute[PurchaseStatus.DISPUTE_LOST]
    lost_live = lost & f.live_orders
    rep.add("lost disputes mid-fulfilment, no live order", len(lost - f.live_orders), "reported")
    rep.add(
        "lost disputes mid-fulfilment, order not cancelled",
        len(lost_live),
        "must be 0",
        ok=not lost_live,
    )
    rep.add(
        "paid purchases reversed during fulfilment, order cancelled",
        len(f.reversed_mid),
        "reported",
    )


@invariant("paid-purchase-fulfilled-once", When.DRAINED)
def _paid_purchase_fulfilled_once(f: Facts, rep: Report) -> None:
    """Every paid purchase ran each step exactly once, unless it waits for a person, was
    reversed, or a dispute paused it."""
    from payments.models import Purchase

    disputed = set().union(*f.paused_by_dispute.values())
    incomplete = [
        pid
        for pid in f.paid_ids - f.awaiting_review - f.reversed_early - disputed - f.reversed_mid
        if f.unfinished(pid)
    ]
    rep.add(
        "paid purchases with a step not done once", len(incomplete), "must be 0", ok=not incomplete
    )
    for pid in incomplete[:5]:
        purchase = Purchase.objects.get(id=pid)
        rep.add(
            f"  {pid}",
            purchase.status,
            " ".join(f"{s}:{st}" for (s, st), n in sorted(f.steps[pid].items()))
            + " | "
            + " ".join(
                f"{o.kind}:{o.outcome}:{o.grade or '-'}"
                for o in purchase.operations.order_by("created_at")
            ),
        )
    rep.add("paid purchases awaiting a person (e-mail unknown)", len(f.awaiting_review), "reported")


@invariant("goods-follow-the-money", When.DRAINED)
def _goods_follow_the_money(f: Facts, rep: Report) -> None:
    """A purchase whose money went back (refunded in full, voided, a dispute lost) has no
    live order, serves no deliverable and does not say it is paid or fulfilled; a purchase
    with a live order or deliverable keeps its money (docs/reliability.md, "Goods follow the
    money"). Judged on the
    provider's record: what its PaymentIntents captured minus their refunds and lost
    disputes there; a void is an authorization the provider cancelled after Verity held it."""
    from payments.enums import OperationKind, Outcome, PurchaseStatus
    from payments.models import PaymentOperation, Purchase
    from recovery.models import StepName, StepRun, StepState

    intents: dict[str, list[dict]] = defaultdict(list)
    for pi in f.intents:
        pid = (pi.get("metadata") or {}).get("purchase_id")
        if pid:
            intents[pid].append(pi)
    refunded: Counter = Counter()
    for r in f.refunds:
        if r["status"] == "succeeded" and r.get("payment_intent"):
            refunded[r["payment_intent"]] += r["amount"]
    lost: Counter = Counter()
    for d in f.disputes:
        if d["status"] == "lost" and d.get("payment_intent"):
            lost[d["payment_intent"]] += d["amount"]
    # Authorizations Verity held (its record of the hold); the provider says whether they
    # were cancelled since.
    authorized = set(
        PaymentOperation.objects.filter(
            kind=OperationKind.AUTHORIZE, outcome=Outcome.SUCCEEDED
        ).values_list("provider_reference", flat=True)
    )
    back = set()
    for pid, pis in intents.items():
        if any(pi["status"] in ("requires_capture", "processing") for pi in pis):
            continue  # money held
        captured = sum(
            pi.get("amount_received") or pi["amount"] for pi in pis if pi["status"] == "succeeded"
        )
        voided = any(pi["status"] == "canceled" and pi["id"] in authorized for pi in pis)
        returned = sum(refunded[pi["id"]] + lost[pi["id"]] for pi in pis)
        if (captured and returned >= captured) or (voided and not captured):
            back.add(pid)
    now = timezone.now()
    serving = set(
        StepRun.objects.filter(
            step=StepName.DELIVERABLE, state=StepState.DONE, result_expires_at__gt=now
        ).values_list("purchase_id", flat=True)
    )
    live = (back & f.live_orders) | (back & serving)
    says_paid = set(
        Purchase.objects.filter(
            id__in=back,
            status__in=[
                PurchaseStatus.PAID,
                PurchaseStatus.FULFILLING,
                PurchaseStatus.COMPLETED,
                PurchaseStatus.DISPUTE_WON,
            ],
        ).values_list("id", flat=True)
    )
    rep.add("purchases whose money went back at the provider", len(back), "reported")
    rep.add("  ...with a live order or a served deliverable", len(live), "must be 0", ok=not live)
    rep.add(
        "  ...saying paid, fulfilling, completed or dispute won",
        len(says_paid),
        "must be 0",
        ok=not says_paid,
    )
    for pid in sorted(live | says_paid)[:5]:
        rep.add(
            f"  {pid}",
            Purchase.objects.get(id=pid).status,
            f"order live={pid in f.live_orders} deliverable served={pid in serving}",
        )


@invariant("effects-once", When.DRAINED)
def _effects_once(f: Facts, rep: Report) -> None:
    effect_dupes = _effects_executed_twice()
    rep.add("downstream effects executed twice", effect_dupes, "must be 0", ok=effect_dupes == 0)


@invariant("effects-need-a-verified-payment", When.DRAINED)
def _effects_need_a_verified_payment(f: Facts, rep: Report) -> None:
    """No live order and no e-mail without a verified payment. A payment fulfilled on a
    person's "succeeded" that the provider then overturned: its order is cancelled; a sent
    e-mail cannot be unsent, so the purchase waits in manual review (reported)."""
    from payments.enums import OVERTURN_CAUSE, PAYMENT_KINDS, Outcome, PurchaseStatus
    from payments.models import PaymentOperation
    from recovery.models import EmailMessage, Order

    overturned = (
        set(
            PaymentOperation.objects.filter(
                kind__in=PAYMENT_KINDS,
                outcome=Outcome.FAILED,
                transitions__cause=OVERTURN_CAUSE,
                purchase__status=PurchaseStatus.MANUAL_REVIEW,
            ).values_list("purchase_id", flat=True)
        )
        - f.paid_ids
    )
    orders_unpaid = (
        Order.objects.exclude(purchase_id__in=f.paid_ids).filter(cancelled_at__isnull=True).count()
    )
    mails_unpaid = (
        EmailMessage.objects.exclude(purchase_id__in=f.paid_ids)
        .exclude(purchase_id__in=overturned)
        .count()
    )
    rep.add(
        "orders/e-mails without a verified payment",
        orders_unpaid + mails_unpaid,
        "must be 0",
        ok=orders_unpaid + mails_unpaid == 0,
    )
    rep.add("fulfilled on a person's word, overturned (manual review)", len(overturned), "reported")


@invariant("open-purchase-has-an-owner", When.DRAINED)
def _open_purchase_has_an_owner(f: Facts, rep: Report) -> None:
    """Every open purchase names who acts next (the presenter every surface reads)."""
    from payments.api.presenters import purchase_next_action
    from payments.enums import Owner, PurchaseStatus
    from payments.models import Purchase
    from webhooks.models import ProviderEvent

    open_statuses = [
        PurchaseStatus.PAYMENT_PENDING,
        PurchaseStatus.PAYMENT_UNKNOWN,
        PurchaseStatus.ACTION_REQUIRED,
        PurchaseStatus.MANUAL_REVIEW,
        PurchaseStatus.REFUND_PENDING,
    ]
    ownerless = [
        p.id
        for p in Purchase.objects.filter(status__in=open_statuses)
        if purchase_next_action(p).get("owner") in (None, "", Owner.NONE)
    ]
    rep.add("open purchases without a next owner", len(ownerless), "must be 0", ok=not ownerless)
    for pid in ownerless[:5]:
        rep.add(f"  {pid}", "no owner")
    quarantined = ProviderEvent.objects.filter(result="quarantined").count()
    rep.add("quarantined webhook events", quarantined, "reported")


@invariant("ledger-matches-provider-balance", When.DRAINED)
def _ledger_matches_provider_balance(f: Facts, rep: Report) -> None:
    """Double entry: the provider-balance account is what the provider should hold."""
    from payments.enums import Rail
    from payments.models import PaymentOperation
    from recovery.models import LedgerEntry

    provider_net = (
        sum(
            pi.get("amount_received") or pi["amount"]
            for pi in f.intents
            if pi["status"] == "succeeded"
        )
        - sum(r["amount"] for r in f.refunds if r["status"] == "succeeded")
        # disputes: the withdrawal and fee, and a won dispute's reinstatement
        + sum(bt["net"] for d in f.disputes for bt in d.get("balance_transactions") or [])
    )
    x402_ops = PaymentOperation.objects.filter(rail=Rail.X402).values("id")
    ledger_net = (
        LedgerEntry.objects.filter(account="provider_balance")
        .exclude(operation_id__in=x402_ops)
        .aggregate(s=Sum("amount"))["s"]
        or 0
    )
    rep.add(
        "ledger minus provider balance",
        ledger_net - provider_net,
        "must be 0",
        ok=ledger_net == provider_net,
    )


# Per operation, on the provider's and the chain's record.


@invariant("linked-operation-on-its-rail", When.DRAINED)
def _linked_operation_on_its_rail(f: Facts, rep: Report) -> None:
    from payments.models import PaymentOperation

    linked = PaymentOperation.objects.filter(parent__isnull=False).select_related("parent")
    off_rail = [o.id for o in linked if o.rail != o.parent.rail]
    rep.add(
        "linked operations off their payment's rail", len(off_rail), "must be 0", ok=not off_rail
    )
    for op_id in off_rail[:5]:
        rep.add(f"  {op_id}", "off rail")


@invariant("refund-returns-its-payment", When.DRAINED)
def _refund_returns_its_payment(f: Facts, rep: Report) -> None:
    """A provider refund made by Verity returns money of the payment its operation names."""
    from payments.models import PaymentOperation

    linked = PaymentOperation.objects.filter(parent__isnull=False).select_related("parent")
    by_op = {(r.get("metadata") or {}).get("operation_id"): r for r in f.refunds}
    parents = {o.id: o.parent.provider_reference for o in linked if o.id in by_op}
    wrong = [
        op_id
        for op_id, ref in parents.items()
        if by_op[op_id].get("payment_intent") and by_op[op_id]["payment_intent"] != ref
    ]
    rep.add("refunds returning another payment's money", len(wrong), "must be 0", ok=not wrong)


@invariant("compensation-returns-own-payment", When.DRAINED)
def _compensation_returns_own_payment(f: Facts, rep: Report) -> None:
    """A compensated step returns the purchase's own payment, never a duplicate's."""
    from payments.models import PaymentOperation
    from recovery.models import StepRun

    runs = StepRun.objects.exclude(compensation_operation_id="")
    comp = {
        o.id: o
        for o in PaymentOperation.objects.filter(
            id__in=runs.values("compensation_operation_id")
        ).select_related("parent")
    }
    astray = [
        r.purchase_id
        for r in runs
        if (o := comp.get(r.compensation_operation_id)) is not None
        and (o.parent is None or o.parent.is_duplicate)
    ]
    rep.add("steps compensated with a duplicate's return", len(astray), "must be 0", ok=not astray)


@invariant("outbox-drains", When.DRAINED)
def _outbox_drains(f: Facts, rep: Report) -> None:
    """Unknown operations keep being read back (reconcile messages come due every few
    seconds), so "lost" means due for longer than the relay needs to pick it up."""
    from recovery.models import OutboxMessage

    lagging = OutboxMessage.objects.filter(
        processed_at__isnull=True, available_at__lte=timezone.now() - timedelta(seconds=60)
    )
    rep.add(
        "outbox messages due for over 60 s", lagging.count(), "must be 0", ok=not lagging.exists()
    )
    for m in lagging[:5]:
        rep.add(
            f"  outbox {m.id}",
            f"cat={m.category}",
            f"attempts={m.attempts} {m.payload} {m.last_error[:80]!r}",
        )


# -- storefront events (events/): judged from the rows, by this file's own rule ----------
# The record of every committed change is the transition history (OperationTransition);
# the events are another table. Neither's writer is called here: the rule is read off
# the two tables.

_STATUS_EVENT_TYPES = ("purchase.status_changed", "purchase.completed")


@invariant("events-numbered-without-gaps")
def _events_numbered_without_gaps(f: Facts, rep: Report) -> None:
    """Each purchase's events are numbered 1..n: one statement, one snapshot."""
    from events.models import Event

    gaps = list(
        Event.objects.values("purchase_id")
        .annotate(n=Count("id"), top=Max("sequence"), low=Min("sequence"))
        .exclude(n=F("top"))
        .values_list("purchase_id", flat=True)[:5]
    )
    gaps += list(
        Event.objects.values("purchase_id")
        .annotate(low=Min("sequence"))
        .exclude(low=1)
        .values_list("purchase_id", flat=True)[:5]
    )
    rep.add("purchases whose events skip a number", len(gaps), "must be 0", ok=not gaps)
    for pid in gaps[:5]:
        rep.add(f"  {pid}", "gap", "")


@invariant("every-committed-change-has-its-event", When.DRAINED)
def _every_change_has_its_event(f: Facts, rep: Report) -> None:
    """Every status change in the history has one status event, every purchase one
    `purchase.created`, and no event reports a change the history does not have."""
    from events.models import Event
    from payments.models import OperationTransition

    changes = Counter(
        dict(
            OperationTransition.objects.filter(field="status", operation__isnull=True)
            .exclude(source="")
            .exclude(source=F("target"))
            .values("purchase_id")
            .annotate(n=Count("id"))
            .values_list("purchase_id", "n")
        )
    )
    created = set(
        OperationTransition.objects.filter(
            field="status", operation__isnull=True, source=""
        ).values_list("purchase_id", flat=True)
    )
    events = Counter(
        dict(
            Event.objects.filter(type__in=_STATUS_EVENT_TYPES)
            .values("purchase_id")
            .annotate(n=Count("id"))
            .values_list("purchase_id", "n")
        )
    )
    created_events = Counter(
        Event.objects.filter(type="purchase.created").values_list("purchase_id", flat=True)
    )
    off = sorted(p for p in set(changes) | set(events) if changes[p] != events[p])
    off_created = sorted(
        p for p in created | set(created_events) if created_events[p] != (1 if p in created else 0)
    )
    rep.add("status changes recorded", sum(changes.values()), "")
    rep.add("status events", sum(events.values()), "")
    rep.add(
        "purchases whose status events differ from the history", len(off), "must be 0", ok=not off
    )
    rep.add(
        "purchases without exactly one created event",
        len(off_created),
        "must be 0",
        ok=not off_created,
    )
    for pid in (off + off_created)[:5]:
        rep.add(f"  {pid}", f"{changes[pid]} changes", f"{events[pid]} events")


@invariant("every-event-reaches-its-endpoint-or-the-endpoint-is-disabled", When.DRAINED)
def _every_event_reaches_its_endpoint(f: Facts, rep: Report) -> None:
    """For each event and each endpoint of its client that wants its type and existed when
    it was written: delivered, or still in its retry schedule, or the endpoint is disabled
    with a reason. A delivery that is due and not sent, or that gave up while its endpoint
    stays enabled, breaks the rule."""
    from events.models import Event, WebhookDelivery, WebhookEndpoint

    now = timezone.now()
    endpoints = list(WebhookEndpoint.objects.filter(kind="standard"))
    delivered = set(
        WebhookDelivery.objects.filter(state="delivered").values_list("endpoint_id", "event_id")
    )
    retrying = set(
        WebhookDelivery.objects.filter(
            state="pending", next_attempt_at__gt=now - timedelta(seconds=60)
        ).values_list("endpoint_id", "event_id")
    )
    # An event written in the last minute whose fan-out has made no delivery row yet (its
    # outbox message not yet handled: the checks run while the workers still do) is owed,
    # as a pending delivery is; older, it is a fan-out that never came.
    recent = now - timedelta(seconds=60)
    rows = set(WebhookDelivery.objects.values_list("endpoint_id", "event_id"))
    missing, in_retry, total = [], 0, 0
    for ep in endpoints:
        wanted = Event.objects.filter(api_client_id=ep.api_client_id, created_at__gte=ep.created_at)
        if ep.event_types:
            wanted = wanted.filter(type__in=ep.event_types)
        for event_id, written in wanted.values_list("id", "created_at"):
            total += 1
            key = (ep.id, event_id)
            if key in delivered:
                continue
            if key in retrying or (key not in rows and written > recent):
                in_retry += 1
                continue
            if not ep.enabled and ep.disabled_reason:
                continue
            missing.append(key)
    rep.add("event deliveries owed", total, "")
    rep.add("deliveries still in their retry schedule", in_retry, "")
    rep.add(
        "events neither delivered nor owed to a disabled endpoint",
        len(missing),
        "must be 0",
        ok=not missing,
    )
    for ep_id, event_id in missing[:5]:
        rep.add(f"  endpoint {ep_id}", f"event {event_id}", "")


def explain_payments(report: Report) -> list[str]:
    """Everything Verity and the provider hold about each card payment a money rule names:
    its provider calls, its transitions, its reference, and the raw PaymentIntents whose
    metadata names it (a failing run must say what happened without its database)."""
    from payments.models import OperationTransition, PaymentOperation, ProviderCall

    facts = Facts(live=False)
    named = set(facts.succeeded_not_charged)
    for pi in facts.intents:
        op_id = (pi.get("metadata") or {}).get("operation_id", "")
        if pi["status"] in PAYABLE_INTENT and op_id in facts.ops:
            o = facts.ops[op_id]
            if o.outcome in ("succeeded", "failed") or (
                o.provider_reference and o.provider_reference != pi["id"]
            ):
                named.add(op_id)
    lines = []
    for op_id in sorted(named):
        o = PaymentOperation.objects.get(id=op_id)
        lines.append(
            f"operation {o.id}: {o.kind} {o.outcome} grade={o.grade or '-'} "
            f"reference={o.provider_reference or '-'} purchase={o.purchase_id} "
            f"created={o.created_at.isoformat()}"
        )
        for c in ProviderCall.objects.filter(operation=o).order_by("started_at", "id"):
            lines.append(
                f"  call {c.started_at.isoformat()} {c.purpose} {c.step}#{c.attempt} "
                f"key={c.key} http={c.http_status} {c.classification or '-'} "
                f"error={c.error_code or '-'} drill={c.fault_drill or '-'} "
                f"request={c.request_id or '-'} safe={c.safe_fields}"
            )
        for t in OperationTransition.objects.filter(operation=o).order_by("created_at", "id"):
            lines.append(
                f"  transition {t.created_at.isoformat()} {t.field} {t.source}->{t.target} "
                f"cause={t.cause} actor={t.actor or '-'} evidence={t.evidence}"
            )
        for pi in facts.intents:
            if (pi.get("metadata") or {}).get("operation_id") == op_id or pi["id"] == (
                o.provider_reference
            ):
                lines.append(
                    f"  provider {pi['id']} status={pi['status']} created={pi['created']} "
                    f"metadata={pi.get('metadata')}"
                )
        if o.provider_reference and o.provider_reference not in facts.status_of:
            lines.append(
                f"  provider GET {o.provider_reference}: "
                f"{_provider_status('payment_intents', o.provider_reference) or 'absent'}"
            )
    return lines
