from config.env import VAR_DIR, env

REDIS_URL = env("REDIS_URL", default="")
# Embedded default: kombu's filesystem transport under var/ (a real worker, no Redis).
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL or "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _queue_dir = VAR_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(_queue_dir / "processed"),
        "store_processed": False,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes the DB connection around every task unless this is set
# (~650 -> ~200 tasks/s for a one-query task, DESIGN §2).
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=1000)
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BEAT_SCHEDULE = {}  # filled by recovery.schedule (imported in recovery.apps)

# Outbox / recovery timing (seconds).
OUTBOX_SWEEP_SECONDS = env.float("OUTBOX_SWEEP_SECONDS", default=5.0)
OUTBOX_LEASE_SECONDS = env.int("OUTBOX_LEASE_SECONDS", default=60)
DISPATCH_LEASE_SECONDS = env.int("DISPATCH_LEASE_SECONDS", default=90)
RECONCILE_SCHEDULE_SECONDS = env.list(
    "RECONCILE_SCHEDULE_SECONDS", cast=int, default=[30, 120, 600, 3600, 21600, 86400]
)
RECONCILE_DEADLINE_SECONDS = env.int("RECONCILE_DEADLINE_SECONDS", default=3 * 86400)
RECOVERY_OWNER_DEFAULT = env("RECOVERY_OWNER_DEFAULT", default="payments-oncall")
