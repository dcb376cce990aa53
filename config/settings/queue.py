from config.env import VAR_DIR, env

REDIS_URL = env("REDIS_URL", default="")
# Embedded default: kombu's filesystem transport under var/ (a real worker, no Redis). The
# host is named only so that kombu does not warn "No hostname was supplied" at every start.
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL or "filesystem://localhost/")
CELERY_BROKER_TRANSPORT_OPTIONS = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _queue_dir = VAR_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(_queue_dir / "processed"),
        "store_processed": False,
        # Broadcast (celery control) exchanges; kombu's default is ./control in the cwd.
        "control_folder": str(_queue_dir / "control"),
    }
    (_queue_dir / "processed").mkdir(parents=True, exist_ok=True)
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": 3600,
        # Publishing (the outbox's on-commit kick) gives up fast when Redis is down:
        # kombu's defaults retry the channel for ~6 s, holding a committed request that
        # long. The row is committed already; the beat sweep re-kicks when Redis is back.
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.5,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes the DB connection around every task unless this is set
# (~650 -> ~200 tasks/s for a one-query task, docs/configuration.md#throughput-settings).
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=1000)
CELERY_TASK_ALWAYS_EAGER = False
# CELERY_BEAT_SCHEDULE: at the end of this file (recovery jobs).

# Outbox / recovery timing (seconds).
OUTBOX_SWEEP_SECONDS = env.float("OUTBOX_SWEEP_SECONDS", default=5.0)
# Relay kicks after commit are coalesced to at most two publishes per window (recovery.kick).
RELAY_KICK_WINDOW_MS = env.int("RELAY_KICK_WINDOW_MS", default=500)
# recovery.sweep.reconcile_sweep: provider read-backs per second per process (token bucket).
RECONCILE_SWEEP_READS_PER_SECOND = env.float("RECONCILE_SWEEP_READS_PER_SECOND", default=20.0)
# ... and how many read-backs it applies in one transaction (set-based apply).
RECONCILE_SWEEP_BATCH_SIZE = env.int("RECONCILE_SWEEP_BATCH_SIZE", default=50)
OUTBOX_LEASE_SECONDS = env.int("OUTBOX_LEASE_SECONDS", default=60)
DISPATCH_LEASE_SECONDS = env.int("DISPATCH_LEASE_SECONDS", default=90)
RECONCILE_SCHEDULE_SECONDS = env.list(
    "RECONCILE_SCHEDULE_SECONDS", cast=int, default=[30, 120, 600, 3600, 21600, 86400]
)
RECONCILE_DEADLINE_SECONDS = env.int("RECONCILE_DEADLINE_SECONDS", default=3 * 86400)
# A person's (acknowledged) outcome is read back on the reconcile schedule for this long
# after it was given, until the provider confirms or overturns it.
ACKNOWLEDGED_READBACK_SECONDS = env.int("ACKNOWLEDGED_READBACK_SECONDS", default=86400)
RECOVERY_OWNER_DEFAULT = env("RECOVERY_OWNER_DEFAULT", default="payments-oncall")
OUTBOX_BACKOFF_BASE_SECONDS = env.float("OUTBOX_BACKOFF_BASE_SECONDS", default=1.0)
OUTBOX_BACKOFF_CAP_SECONDS = env.float("OUTBOX_BACKOFF_CAP_SECONDS", default=300.0)
# Console "stuck outbox" queue: retried this often, or unprocessed for this long.
OUTBOX_STUCK_ATTEMPTS = env.int("OUTBOX_STUCK_ATTEMPTS", default=3)
OUTBOX_STUCK_SECONDS = env.int("OUTBOX_STUCK_SECONDS", default=600)

# Orchestrator (recovery.orchestrator).
# A step found `running` longer than this was abandoned by a dead worker (for the
# confirmation e-mail that means "maybe sent": unknown, never resent without review).
STEP_LEASE_SECONDS = env.int("STEP_LEASE_SECONDS", default=120)
STEP_MAX_ATTEMPTS = env.int("STEP_MAX_ATTEMPTS", default=3)  # order/inventory/ledger/e-mail
STEP_RETRY_LIMIT = env.int("STEP_RETRY_LIMIT", default=10)  # crm/deliverable ("retry")
DELIVERABLE_RETENTION_DAYS = env.int("DELIVERABLE_RETENTION_DAYS", default=30)
# Paid/fulfilling purchases untouched this long get a RUN_STEPS message (paid-without-order).
PAID_WITHOUT_ORDER_SECONDS = env.int("PAID_WITHOUT_ORDER_SECONDS", default=300)

# Settlement comparison (recovery.settlement).
SETTLEMENT_WINDOW_HOURS = env.int("SETTLEMENT_WINDOW_HOURS", default=72)
SETTLEMENT_GRACE_SECONDS = env.int("SETTLEMENT_GRACE_SECONDS", default=900)
SETTLEMENT_MAX_TRANSACTIONS = env.int("SETTLEMENT_MAX_TRANSACTIONS", default=2000)

# Confirmation e-mails are sent by recovery workers through Django's mail API. Default:
# the console backend (no SMTP server in `make run`/tests); production sets SMTP.
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="orders@verity.example")
EMAIL_HOST = env("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_TIMEOUT = env.float("EMAIL_TIMEOUT", default=30.0)  # below STEP_LEASE_SECONDS

# Retention (recovery.retention, docs/retention.md): days each pruned table keeps its rows,
# and how one run works (pages of RETENTION_BATCH_SIZE ids, one short transaction each, at
# most RETENTION_MAX_BATCHES pages per table per run; a backlog takes several runs).
RETENTION_OUTBOX_DAYS = env.int("RETENTION_OUTBOX_DAYS", default=7)
RETENTION_WEBHOOK_EVENT_DAYS = env.int("RETENTION_WEBHOOK_EVENT_DAYS", default=90)
RETENTION_IDEMPOTENCY_DAYS = env.int("RETENTION_IDEMPOTENCY_DAYS", default=30)
RETENTION_BATCH_SIZE = env.int("RETENTION_BATCH_SIZE", default=1000)
RETENTION_MAX_BATCHES = env.int("RETENTION_MAX_BATCHES", default=200)

# Exactly one beat process runs this (Procfile.dev `beat`). Tasks only find work and
# write outbox rows; the relay does it.
CELERY_BEAT_SCHEDULE = {
    # Storefront webhooks due for a (re)try; commits kick it sooner (events.delivery).
    "webhook-deliveries": {
        "task": "events.deliver_due",
        "schedule": env.float("WEBHOOK_SWEEP_SECONDS", default=5.0),
    },
    "events-prune": {
        "task": "events.prune",
        "schedule": env.float("EVENTS_PRUNE_SWEEP_SECONDS", default=3600.0),
    },
    "outbox-sweep": {"task": "recovery.relay_drain", "schedule": OUTBOX_SWEEP_SECONDS},
    "reconcile-due": {
        "task": "recovery.reconcile_due",
        "schedule": env.float("RECONCILE_SWEEP_SECONDS", default=10.0),
    },
    "dead-dispatches": {
        "task": "recovery.sweep_dead_dispatches",
        "schedule": env.float("DEAD_DISPATCH_SWEEP_SECONDS", default=15.0),
    },
    "stalled-fulfilment": {
        "task": "recovery.resume_stalled_fulfilment",
        "schedule": env.float("STALLED_FULFILMENT_SWEEP_SECONDS", default=60.0),
    },
    "expire-stale-purchases": {
        "task": "recovery.expire_stale_purchases",
        "schedule": env.float("EXPIRE_SWEEP_SECONDS", default=60.0),
    },
    "settlement-compare": {
        "task": "recovery.settlement_compare",
        "schedule": env.float("SETTLEMENT_SWEEP_SECONDS", default=3600.0),
    },
    "disputes-refresh": {
        "task": "recovery.disputes_refresh_open",
        "schedule": env.float("DISPUTE_REFRESH_SWEEP_SECONDS", default=3600.0),
    },
    "x402-finality": {
        "task": "recovery.x402_finality",
        "schedule": env.float("X402_FINALITY_SWEEP_SECONDS", default=30.0),
    },
    "retention-prune": {
        "task": "recovery.retention_prune",
        "schedule": env.float("RETENTION_SWEEP_SECONDS", default=600.0),
    },
}
# On-demand read-backs (API/MCP reconcile): at most one per operation in this many seconds.
RECONCILE_ON_DEMAND_COOLDOWN_SECONDS = env.int("RECONCILE_ON_DEMAND_COOLDOWN_SECONDS", default=5)
