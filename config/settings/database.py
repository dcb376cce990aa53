from config.env import VAR_DIR, env

# PostgreSQL in production and tests; SQLite only for `make run`'s embedded default.
DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'verity.sqlite3'}")
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes the write lock at BEGIN, so two writers serialize instead of
    # failing with "database is locked" half-way through (select_for_update is a no-op).
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL",
    }
else:
    # A connection per request costs ~80 % of throughput (DESIGN §2).
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
