-- The same POST, same headers and body, every time (idempotent replay).
-- $BENCH_AUTH: Authorization value; $BENCH_IDEM_KEY: Idempotency-Key; $BENCH_BODY: JSON.
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = os.getenv("BENCH_AUTH")
wrk.headers["Idempotency-Key"] = os.getenv("BENCH_IDEM_KEY")
