-- POSTs pre-signed bodies from the file named by $BENCH_REQUESTS, one per line:
--   <Stripe-Signature value> TAB <JSON body>
-- in file order (wrk runs with one thread, so a line is sent once per pass). The
-- signatures are HMAC-SHA256 made by bench/webhook_ingest.py (Lua has no HMAC).
-- $BENCH_COOKIE, when set, is sent as a Cookie header (a delivery with a cookie goes down
-- the whole middleware chain: config.early_webhook).
local path = os.getenv("BENCH_REQUESTS")
local cookie = os.getenv("BENCH_COOKIE")
local reqs = {}
local i = 0

function init(args)
  for line in io.lines(path) do
    local sig, body = line:match("^([^\t]*)\t(.*)$")
    local headers = {["Content-Type"] = "application/json", ["Stripe-Signature"] = sig}
    if cookie and cookie ~= "" then headers["Cookie"] = cookie end
    reqs[#reqs + 1] = wrk.format("POST", nil, headers, body)
  end
end

function request()
  i = i + 1
  if i > #reqs then i = 1 end
  return reqs[i]
end
