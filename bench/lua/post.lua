-- POST bodies read from a file (one JSON body a line), in turn, to wrk's URL.
--   BENCH_BODIES=FILE BENCH_RATE=R BENCH_THREADS=T [BENCH_KEY=secret] [BENCH_UA=agent] \
--   [BENCH_CONTENT_TYPE=text/plain] \
--   wrk -t T -c C -d D -s bench/lua/post.lua URL
-- BENCH_RATE is requests per second over all threads. Unset or 0: closed loop (as fast as
-- replies come back, and no delay() at all, so wrk adds no timer per request).
-- Above 0: wrk2 is not packaged in Debian, so this is a rate-limited open loop in plain
-- wrk. Each thread sends on a fixed schedule of slots (RATE/THREADS a second, on absolute
-- times, so it never drifts) as long as a connection is free; a slot that cannot be sent
-- on time is sent as soon as one is, and counted in `late` (over 5 ms) and `behind_ms`,
-- which show the offered rate was not kept. Latency is measured by wrk from the actual
-- send, so a server that falls behind shows as lateness rather than as latency.
-- At the end one line `WRK_JSON {...}` carries the figures bench/run.py reads.

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clock_id, bench_timespec *tp);
]]
local CLOCK_MONOTONIC = 1
local ts = ffi.new("bench_timespec")

local function now_ms()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

local bodies = {}
local next_body = 1
local interval = 0
local next_slot = nil
statuses = {}
late = 0
behind_ms = 0

local rate = tonumber(os.getenv("BENCH_RATE")) or 0

function init(args)
  for line in io.lines(os.getenv("BENCH_BODIES")) do
    if #line > 0 then table.insert(bodies, line) end
  end
  local nthreads = tonumber(os.getenv("BENCH_THREADS")) or 1
  if rate > 0 then interval = 1000 * nthreads / rate end
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  local content_type = os.getenv("BENCH_CONTENT_TYPE")
  if content_type and #content_type > 0 then wrk.headers["Content-Type"] = content_type end
  local ua = os.getenv("BENCH_UA")
  if ua and #ua > 0 then wrk.headers["User-Agent"] = ua end
  local key = os.getenv("BENCH_KEY")
  if key and #key > 0 then wrk.headers["Authorization"] = "Bearer " .. key end
  -- Threads start at different bodies so they do not send the same one at once.
  next_body = ((tid - 1) * 7919) % #bodies + 1
end

function request()
  local body = bodies[next_body]
  next_body = next_body % #bodies + 1
  return wrk.format(nil, nil, nil, body)
end

if rate > 0 then
  -- delay() exists only for rate-limited runs: wrk calls it before every request.
  function delay()
    local now = now_ms()
    if next_slot == nil then next_slot = now end
    local wait = next_slot - now
    next_slot = next_slot + interval
    if wait < 0 then
      if -wait > 5 then late = late + 1 end
      if -wait > behind_ms then behind_ms = -wait end
      return 0
    end
    return math.floor(wait)
  end
end

function response(status, headers, body)
  local key = tostring(status)
  statuses[key] = (statuses[key] or 0) + 1
end

function done(summary, latency, requests)
  local counts, total_late, max_behind = {}, 0, 0
  for _, thread in ipairs(threads) do
    local s = thread:get("statuses") or {}
    for code, n in pairs(s) do counts[code] = (counts[code] or 0) + n end
    total_late = total_late + (thread:get("late") or 0)
    local b = thread:get("behind_ms") or 0
    if b > max_behind then max_behind = b end
  end
  local parts = {}
  for code, n in pairs(counts) do table.insert(parts, string.format('"%s": %d', code, n)) end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "bytes": %d, "statuses": {%s}, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "max": %d, "mean": %.1f}, ' ..
    '"late": %d, "behind_ms": %.1f}\n',
    summary.requests, summary.duration, summary.bytes, table.concat(parts, ", "),
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean, total_late, max_behind))
end
