-- Common head of every bucket script: read the bucket, bring it to `now`.
-- KEYS[1] the bucket; ARGV[1] limit, ARGV[2] window_ms, ARGV[5] now_ms or ""
-- for Redis TIME. The stored value is "c t w e v": credit units (1/w token
-- each), the ms up to which refill is accounted (in the future while a debt
-- is owed), the window the units use, and the failover guard's epoch (set
-- when the bucket is created from nothing) and version (writes since).
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
local credit, ts, w, epoch, ver
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  -- the key's state is the ledger's hash: limiters on one key disagree
  return redis.error_reply('QL_MIXED fixed leases (lease_size) on a key that limiters without lease_size ' ..
    'hold with adaptive leasing: every limiter of a key must agree on lease_size')
end
if v then
  local c0, t0, w0, rest = string.match(v, '^(%d+) (%d+) (%d+)(.*)$')
  credit, ts, w = tonumber(c0), tonumber(t0), tonumber(w0)
  local e0, v0 = string.match(rest or '', '^ (%d+) (%d+)$')
  -- a value stored before the guard existed: epoch 1
  epoch, ver = tonumber(e0) or 1, tonumber(v0) or 0
end
if credit == nil or ts == nil or w == nil or w <= 0 then
  credit = cap
  ts = now
  w = window
  epoch, ver = now + 2, 0
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
-- Sets `alive`: how long the bucket is kept at least (the failover guard).
local alive = 0
local function store(min_ms)
  local px = math.ceil((cap - credit) / limit) + math.max(0, ts - now)
  if min_ms ~= nil and min_ms > px then px = min_ms end
  ver = ver + 1
  alive = px
  redis.call('SET', KEYS[1], string.format('%.0f %.0f %.0f %.0f %.0f', credit, ts, window, epoch, ver),
    'PX', string.format('%.0f', px + 1000 + pad))
end

-- Take `units` credit units whatever the bucket holds: what the credit
-- cannot pay becomes a debt, kept by moving `ts` forward (no refill until
-- then). `load`: what rate grants running until
-- `load_until` take of the refill; the debt is paid by the rest until
-- then, by all of it after.
local function owe(units, load, load_until)
  if units <= credit then
    credit = credit - units
    return
  end
  local deficit = units - credit
  credit = 0
  local base = math.max(ts, now)
  load, load_until = load or 0, load_until or 0
  local free = math.max(limit - load, 0)
  local busy = math.max(load_until - base, 0)
  local owed
  if busy == 0 or load == 0 then
    owed = math.ceil(deficit / limit)
  elseif deficit <= free * busy then
    owed = math.ceil(deficit / math.max(free, 1))
  else
    owed = busy + math.ceil((deficit - free * busy) / limit)
  end
  ts = base + owed
end

-- The failover guard (core/src/guard.rs), for lease scripts: ARGV's last
-- four are the epoch and version the caller last saw, how long that answer
-- said the bucket would exist, and the tokens granted to the caller on this
-- key in the last window. A bucket created again while it should exist, or
-- older than what the caller saw, lost state: debit those tokens again
-- (what the credit cannot pay is owed: ts moves forward).
local lost = 0
local function guard(load, load_until, rolled_back)
  local n = #ARGV
  local ge, gv = tonumber(ARGV[n - 3]), tonumber(ARGV[n - 2])
  local galive, grecent = tonumber(ARGV[n - 1]), tonumber(ARGV[n])
  if ge == 0 then return end
  local gone
  if ge ~= epoch then gone = galive > 0 else gone = gv > ver or rolled_back end
  if not gone then return end
  lost = 1
  if grecent > limit then grecent = limit end
  owe(grecent * window, load, load_until)
end
