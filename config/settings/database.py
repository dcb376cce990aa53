from config.env import VAR_DIR, env

# PostgreSQL in production and tests; SQLite only for `make run`'s embedded default.
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'verity.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes the write lock at BEGIN, so two writers serialize instead of
    # failing with "database is locked" half-way through (select_for_update is a no-op).
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL",
    }
    # Covering indexes (INCLUDE) are a PostgreSQL feature; SQLite builds the index without
    # them, which is all the demo needs. Not a warning a newcomer should read at every start.
    SILENCED_SYSTEM_CHECKS = ["models.W040"]
else:
    # A connection per request costs ~80 % of throughput
    # (docs/configuration.md#throughput-settings).
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# The hot API reads (payments.view_queries.CompiledRead) run as named server-side prepared
# statements on PostgreSQL: planned once per connection, not per request. They need a
# direct connection or PgBouncer >= 1.21 with max_prepared_statements set; behind an older
# PgBouncer in transaction mode set DATABASE_PREPARED_STATEMENTS=false (the same compiled
# SQL then runs on Django's own, unprepared cursor). Django's own cursors are unchanged.
DATABASE_PREPARED_STATEMENTS = env.bool("DATABASE_PREPARED_STATEMENTS", default=True)
# Provider calls must never happen inside a transaction: no request-wide atomic.
DATABASES["default"]["ATOMIC_REQUESTS"] = False
IS_SQLITE = DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
# A streaming replica for the read paths that opt in (config/db_router.py, docs/scaling.md):
# the console's GET pages and the /metrics scrape. Unset (the default, `make run`, the
# suite): no second alias, no router, every query on the primary as before.
DATABASE_REPLICA_URL = env("DATABASE_REPLICA_URL", default="")
DATABASE_ROUTERS: list[str] = []
if DATABASE_REPLICA_URL:
    from django.core.exceptions import ImproperlyConfigured

    if IS_SQLITE:
        raise ImproperlyConfigured(
            "DATABASE_REPLICA_URL needs PostgreSQL: the embedded SQLite default has no "
            "replica (unset DATABASE_REPLICA_URL or set DATABASE_URL to PostgreSQL)"
        )
    DATABASES["replica"] = env.db("DATABASE_REPLICA_URL")
    if DATABASES["replica"]["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DATABASE_REPLICA_URL must be a postgres:// URL")
    DATABASES["replica"].update(
        {
            "CONN_MAX_AGE": DATABASES["default"]["CONN_MAX_AGE"],
            "CONN_HEALTH_CHECKS": True,
            "ATOMIC_REQUESTS": False,
            # A replica that does not answer within this is treated as down (the router
            # falls back to the primary), instead of holding a console request.
            "OPTIONS": {"connect_timeout": env.int("DATABASE_REPLICA_CONNECT_TIMEOUT", default=2)},
            # Under Django's test runner the replica alias mirrors the primary (a standby
            # cannot create a test database); tests/replica uses the real standby instead.
            "TEST": {"MIRROR": "default"},
        }
    )
    DATABASE_ROUTERS = ["config.db_router.ReplicaRouter"]
# Reads use the replica only while its replay lag is at most this (else the primary), checked
# at most every REPLICA_LAG_CHECK_SECONDS per process.
REPLICA_MAX_LAG_SECONDS = env.float("REPLICA_MAX_LAG_SECONDS", default=5.0)
REPLICA_LAG_CHECK_SECONDS = env.float("REPLICA_LAG_CHECK_SECONDS", default=1.0)
