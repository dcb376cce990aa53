-- A plain GET (optionally with an Authorization header from $BENCH_AUTH).
wrk.method = "GET"
local auth = os.getenv("BENCH_AUTH")
if auth and auth ~= "" then wrk.headers["Authorization"] = auth end
