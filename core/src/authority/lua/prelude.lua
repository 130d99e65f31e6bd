-- Common head of every bucket script: read the bucket, bring it to `now`.
-- KEYS[1] the bucket; ARGV[1] limit, ARGV[2] window_ms, ARGV[5] now_ms or ""
-- for Redis TIME. The stored value is "c t w": credit units (1/w token
-- each), the ms up to which refill is accounted, the window the units use.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local now
local pad = 0
if ARGV[5] ~= nil and ARGV[5] ~= '' then
  now = tonumber(ARGV[5])
  -- a caller-supplied clock is not Redis' clock: keep idle keys longer
  pad = 600000
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local cap = limit * window
local credit, ts, w
local v = redis.call('GET', KEYS[1])
if v then
  local c0, t0, w0 = string.match(v, '^(%d+) (%d+) (%d+)$')
  credit, ts, w = tonumber(c0), tonumber(t0), tonumber(w0)
end
if credit == nil or ts == nil or w == nil or w <= 0 then
  credit = cap
  ts = now
  w = window
end
if w ~= window then
  local whole = math.floor(credit / w)
  credit = whole * window + math.floor((credit - whole * w) * window / w)
end
-- refill accounted from here, on this credit (adaptive leasing redoes the
-- refill less what active rates were paid of it)
local ts0, credit0 = ts, credit
if credit0 > cap then credit0 = cap end
if now > ts then
  local e = now - ts
  if e > window then e = window end
  credit = credit + e * limit
  ts = now
end
if credit > cap then credit = cap end

-- Store the bucket with an expiry at the time it is full again (a missing
-- key reads as a full bucket, so idle keys vanish without changing answers),
-- or later: `min_ms` keeps it while rate grants it pays for run.
local function store(min_ms)
  local px = math.ceil((cap - credit) / limit)
  if min_ms ~= nil and min_ms > px then px = min_ms end
  redis.call('SET', KEYS[1], string.format('%.0f %.0f %.0f', credit, ts, window),
    'PX', string.format('%.0f', px + 1000 + pad))
end
