"""Recovery: transactional outbox, downstream steps, halts, settlement discrepancies."""

from django.db import models
from django.db.models import Q
from django.utils import timezone


class OutboxCategory(models.IntegerChoices):
    # Stable small integers: stored in rows, NEVER renumber or reuse a value.
    PROCESS_EVENT = 1  # payload {"event": id}: apply a webhook event
    OPERATION_SETTLED = 2  # payload {"operation": id}: resume downstream work
    RECONCILE = 3  # payload {"operation": id}: read the provider back
    DISPATCH = 4  # payload {"operation": id}: send an approved/queued operation
    RUN_STEPS = 5  # payload {"purchase": id}: orchestrate downstream steps
    DISPUTE_CHANGED = 20  # payload {"dispute": id}: book its ledger entries, read it back
    PROVIDER_REFUNDS_READ = 21  # payload {"operation": id}: read a payment's refunds at the
    #                             provider and record those no Verity operation requested
    PAYMENT_CANCEL = 22  # payload {"operation": id}: cancel at the provider a payment
    #                      Verity settled failed that the provider still holds open
    CUSTOMER_EMAIL = 23  # payload {"email": id}: send a recorded customer e-mail (the
    #                      cancellation after the goods were unwound), retried while the
    #                      mail server provably took nothing
    ACP_ORDER_EVENT = 30  # payload {"purchase": id, "event": type, "status": s}: tell the
    #                       ACP agent platform about its order (acp.handlers)
    EVENT_FANOUT = 40  # payload {"event": id}: a storefront event's deliveries, one per
    #                    endpoint that wants it (events.delivery)
    NOOP = 99  # benchmarks and tests


class OutboxMessage(models.Model):
    category = models.PositiveSmallIntegerField(choices=OutboxCategory.choices)
    payload = models.JSONField(help_text="ids only")
    dedupe_key = models.CharField(max_length=200)
    available_at = models.DateTimeField(default=timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set when a write with this key arrives while the row is claimed (its handler may
    # have run already): the relay then releases the row for another run instead of
    # marking it processed, so the absorbed write is not lost (recovery.outbox). A DB
    # default too: raw inserts (webhooks' event+outbox statement, benches) omit it.
    rerun = models.BooleanField(default=False, db_default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["dedupe_key"],
                condition=Q(processed_at__isnull=True),
                name="outbox_dedupe_unprocessed",
            ),
        ]
        indexes = [
            # The claim's order (available_at, id), whole: with available_at alone, rows
            # sharing an available_at (a batch written by one statement) were all read and
            # sorted by id on every claim, so a claim cost grew with the backlog. (The
            # table's autovacuum goes by dead rows, not by its size: migration 0011.)
            models.Index(
                fields=["available_at", "id"],
                condition=Q(processed_at__isnull=True),
                name="outbox_due_idx",
            ),
        ]


class StepName(models.TextChoices):
    ORDER = "order"
    INVENTORY = "inventory"
    LEDGER = "ledger"
    CONFIRMATION = "confirmation"
    CRM = "crm"
    DELIVERABLE = "deliverable"


STEP_ORDER = [
    StepName.ORDER,
    StepName.INVENTORY,
    StepName.LEDGER,
    StepName.CONFIRMATION,
    StepName.CRM,
]


class StepState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    UNKNOWN = "unknown"  # e.g. an e-mail whose send may have happened: never resent blindly
    COMPENSATED = "compensated"
    MANUAL = "manual"


class StepRun(models.Model):
    purchase_id = models.CharField(max_length=40, db_index=True)
    step = models.CharField(max_length=16, choices=StepName.choices)
    state = models.CharField(max_length=16, choices=StepState.choices, default=StepState.PENDING)
    key = models.CharField(max_length=100)
    attempts = models.PositiveIntegerField(default=0)
    external_reference = models.CharField(max_length=100, blank=True)
    result = models.JSONField(default=dict, blank=True)
    last_error = models.TextField(blank=True)
    # The linked refund/void started when this step's policy compensated.
    compensation_operation_id = models.CharField(max_length=40, blank=True, db_index=True)
    result_expires_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["purchase_id", "step"], name="steprun_once"),
            models.UniqueConstraint(fields=["key"], name="steprun_key_unique"),
        ]
        indexes = [
            # The compensation queue (recovery.selectors) and the support fallback select
            # subsets of these states; the few runs in trouble, not five per purchase.
            models.Index(
                fields=["created_at"],
                name="steprun_attention_idx",
                condition=Q(
                    state__in=[
                        StepState.FAILED.value,
                        StepState.UNKNOWN.value,
                        StepState.MANUAL.value,
                        StepState.COMPENSATED.value,
                    ]
                ),
            ),
        ]


class Order(models.Model):
    """The order writer's effect (one per purchase)."""

    purchase_id = models.CharField(max_length=40, unique=True)
    reference = models.CharField(max_length=40, unique=True)
    # Set once by the compensating step of a void after fulfilment (the order is cancelled).
    cancelled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)


class InventoryCommit(models.Model):
    purchase_id = models.CharField(max_length=40)
    sku = models.CharField(max_length=64)
    quantity = models.IntegerField()
    # Set once when the money went back and the stock went back to the shelf (the unwind
    # of recovery.orchestrator.purchase_goods_unwind): a released commit never releases again.
    released_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["purchase_id", "sku"], name="inventory_once")
        ]


class LedgerAccount(models.TextChoices):
    # Double entry: every movement writes one row per side; per operation they sum to 0.
    PROVIDER_BALANCE = "provider_balance"  # what the provider holds for us (settlement)
    AUTHORIZED = "authorized"  # authorized at the provider, not captured yet
    REVENUE = "revenue"
    DISPUTED = "disputed"  # withdrawn by the provider for an open dispute
    FEES = "fees"  # provider fees (dispute fees)


class LedgerEntry(models.Model):
    purchase_id = models.CharField(max_length=40, db_index=True)
    operation_id = models.CharField(max_length=40)
    provider_reference = models.CharField(max_length=100, blank=True, db_index=True)
    # "sale" | "refund" | "void" | "dispute_withdrawal" | "dispute_fee" |
    # "dispute_reinstatement" | "dispute_loss"
    entry_type = models.CharField(max_length=24)
    account = models.CharField(
        max_length=24, choices=LedgerAccount.choices, default=LedgerAccount.PROVIDER_BALANCE
    )
    amount = models.BigIntegerField(help_text="signed minor units")
    currency = models.CharField(max_length=3)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["operation_id", "entry_type", "account"],
                name="ledger_once_per_operation_account",
            )
        ]


class EmailMessage(models.Model):
    """Outgoing mail log: the attempt is recorded before sending (an e-mail can't be unsent)."""

    purchase_id = models.CharField(max_length=40)
    kind = models.CharField(max_length=32)
    to = models.EmailField()
    subject = models.CharField(max_length=200)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["purchase_id", "kind"], name="email_once")]


class CrmUpdate(models.Model):
    purchase_id = models.CharField(max_length=40, unique=True)
    customer_reference = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)


class RecoveryDecision(models.Model):
    class Decision(models.TextChoices):
        COMPLETED_FORWARD = "completed_forward"
        COMPENSATED = "compensated"
        MANUAL = "manual"

    purchase_id = models.CharField(max_length=40, db_index=True)
    decision = models.CharField(max_length=24, choices=Decision.choices)
    detail = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Each decision is recorded once per purchase even under redelivery.
        constraints = [
            models.UniqueConstraint(fields=["purchase_id", "decision"], name="decision_once")
        ]


class WorkflowHalt(models.Model):
    """A halted workflow (`checkout`, `refunds`) or step (`step:order`)."""

    name = models.CharField(max_length=40, unique=True)
    reason = models.TextField()
    halted_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)


class SettlementDiscrepancy(models.Model):
    provider_reference = models.CharField(max_length=100)
    kind = models.CharField(max_length=40)
    provider_amount = models.BigIntegerField(null=True)
    ledger_amount = models.BigIntegerField(null=True)
    currency = models.CharField(max_length=3, blank=True)
    detail = models.TextField(blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["provider_reference", "kind"],
                condition=Q(resolved_at__isnull=True),
                name="discrepancy_open_once",
            )
        ]


class RetentionArchive(models.Model):
    """Rows the retention job moved out of a hot table (docs/retention.md): provider events
    and provider read-back calls are archived here, in the same statement that deletes
    them, never silently dropped. Cold: written only by recovery.retention, read by people."""

    source = models.CharField(max_length=64, help_text="the table the row came from")
    row_id = models.BigIntegerField()
    row = models.JSONField(help_text="the whole row as it was, column by column")
    archived_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["source", "row_id"], name="retention_archive_src_idx")]


class RetentionState(models.Model):
    """One row per pruned table: what the retention job did (rows pruned, all time; rows
    still due after its last run) and where its next run starts. The metrics read this
    small table, so a scrape never counts a large one (recovery.retention)."""

    table = models.CharField(max_length=64, unique=True)
    pruned_total = models.BigIntegerField(default=0)
    due = models.BigIntegerField(default=0)
    kept = models.BigIntegerField(
        default=0, help_text="old rows kept: something still open needs them"
    )
    # Every row at or below this id is pruned or kept for good (never prunable): a sweep
    # starts here, so rows kept for good are not walked again.
    floor_id = models.BigIntegerField(default=0)
    # A sweep walks (floor_id, the last id past the cutoff] over as many runs as it takes;
    # each run resumes at cursor_id (where the previous one stopped), so rows held for now
    # are walked once per sweep, never once per run, and rows due behind them are reached.
    cursor_id = models.BigIntegerField(default=0)
    # The current sweep's figures so far: the first row it left in place (the next floor
    # stops below it), rows it left because they are held, rows it left because a worker
    # held their lock (due again on the next sweep).
    sweep_first_left_id = models.BigIntegerField(null=True, blank=True)
    sweep_kept = models.BigIntegerField(default=0)
    sweep_skipped = models.BigIntegerField(default=0)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_run_seconds = models.FloatField(default=0.0)
