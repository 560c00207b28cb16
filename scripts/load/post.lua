-- wrk script: POST the file named by $LOAD_BODY as a chat-completions body,
-- and print one machine-readable RESULT line at the end (latency in µs).
-- With $LOAD_VARY=1 every marker __NONCE__ in the body is replaced by a number
-- that differs on every request (and on every run, through $LOAD_SALT), so no
-- request hits the proxy's cache: each one is compacted cold.

local file = assert(io.open(assert(os.getenv("LOAD_BODY"), "LOAD_BODY not set"), "rb"))
local body = file:read("*a")
file:close()

wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-load-harness-not-a-secret"
if os.getenv("LOAD_HEADER_NAME") then
  wrk.headers[os.getenv("LOAD_HEADER_NAME")] = os.getenv("LOAD_HEADER_VALUE") or "1"
end

local vary = os.getenv("LOAD_VARY") == "1"
local salt = os.getenv("LOAD_SALT") or tostring(os.time())
-- The body cut at every marker: each one gets the same number.
local parts = {}
if vary then
  local at = 1
  while true do
    local from, to = body:find("__NONCE__", at, true)
    if not from then break end
    parts[#parts + 1] = body:sub(at, from - 1)
    at = to + 1
  end
  parts[#parts + 1] = body:sub(at)
  assert(#parts > 1, "LOAD_VARY=1 but the body has no __NONCE__ marker")
end

-- One id per wrk thread, so threads never send the same body.
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end

-- Defined only when varying: without a request() function wrk sends one
-- prebuilt request, the cheapest client side for the throughput cases.
if vary then
  local counter = 0
  function request()
    counter = counter + 1
    local nonce = salt .. "-" .. (thread_id or 0) .. "-" .. counter
    return wrk.format(nil, nil, nil, table.concat(parts, nonce))
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d socket_errors=%d non2xx=%d rps=%.1f p50_us=%d p90_us=%d p99_us=%d max_us=%d mean_us=%.1f\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
