-- Adaptive lease: the algorithm of core/src/adaptive.rs (the memory
-- authority runs that code; this script is its Redis twin).
-- KEYS[2] the key's holders: a hash, holder id -> "demand held expires rate
-- rate_from rate_until version" (the bucket's version after its last call). ARGV[3] want (0: the key
-- is decided one request at a time, `Ask::single`: need only, never a rate), [4] need, [6] holder id, [7] demand
-- (milli-tokens/s), [8] held, [9] budget, [10] returned, [11] period ms,
-- [12] grant tokens, [13] longest period ms, [14] holder ttl ms, [15] grace ms,
-- [16..20] the failover guard (holders seen, then the prelude's four).
-- Returns {granted, remaining, wait_ms, rate, bonus, rate_ms, fallback, holders,
-- delay_ms, epoch, version, alive_ms, lost}
-- (rate_ms a duration: the caller's clock need not be Redis'.)
local want = tonumber(ARGV[3])
local need = tonumber(ARGV[4])
local single = want == 0
local me = ARGV[6]
local demand = tonumber(ARGV[7])
local held = tonumber(ARGV[8])
local budget = tonumber(ARGV[9])
local returned = tonumber(ARGV[10])
local PERIOD = tonumber(ARGV[11])
local GRANT = tonumber(ARGV[12])
local MAXP = tonumber(ARGV[13])
local HTTL = tonumber(ARGV[14])
local GRACE = tonumber(ARGV[15])
local QUAR = MAXP + PERIOD

local hs = {}
-- '~q': until when the bucket pays no bonus (found lost: the failover guard)
local quarantine = 0
-- '~r': new rate grants start no earlier (found lost: old grants may still run)
local rates_from = 0
-- '~b': what the bucket may still grant in the quarantine (the budget)
local quarantine_left = 0
local raw = redis.call('HGETALL', KEYS[2])
for i = 1, #raw, 2 do
  if raw[i] == '~q' then quarantine = tonumber(raw[i + 1]) or 0 end
  if raw[i] == '~r' then rates_from = tonumber(raw[i + 1]) or 0 end
  if raw[i] == '~b' then quarantine_left = tonumber(raw[i + 1]) or 0 end
  local d, h, e, r, f, u, rest = string.match(raw[i + 1], '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)(.*)$')
  if d then
    -- [7]: the bucket's version after this holder's last call (the failover guard)
    local bv = tonumber(string.match(rest, '^ (%d+)$') or '0')
    hs[raw[i]] = {tonumber(d), tonumber(h), tonumber(e), tonumber(r), tonumber(f), tonumber(u), bv}
  end
end
-- the refill since ts0 less what active rates were paid of it, then the cap
if now > ts0 then
  local paid = 0
  for _, x in pairs(hs) do
    local a = math.max(x[5], ts0)
    local b = math.min(x[6], now)
    if b > a then paid = paid + x[4] * (b - a) end
  end
  credit = math.min(cap, credit0 + math.max(0, limit * (now - ts0) - paid))
end
-- the failover guard, on the refilled bucket (ARGV[17..20]); rates running
-- meanwhile take their part of the refill
local load, load_until = 0, 0
for _, x in pairs(hs) do
  if x[6] > now then
    load = load + x[4]
    if x[6] > load_until then load_until = x[6] end
  end
end
-- this holder's own record older than its last answer: its writes were lost
local gv = tonumber(ARGV[#ARGV - 2])
guard(load, load_until, hs[me] ~= nil and hs[me][7] < gv)
if lost == 1 then
  if now >= quarantine then
    quarantine_left = budget
    redis.call('HSET', KEYS[2], '~b', string.format('%.0f', quarantine_left))
  end
  if quarantine < now + QUAR then
    quarantine = now + QUAR
    redis.call('HSET', KEYS[2], '~q', string.format('%.0f', quarantine))
  end
  -- a fair share's grant period among the fleet the holder last saw
  local nh = 0
  for _ in pairs(hs) do nh = nh + 1 end
  nh = math.max(nh, tonumber(ARGV[#ARGV - 4]), 1)
  local fair = math.max(math.floor(limit / nh), 1)
  local fp = math.min(math.max(math.ceil(GRANT * window / fair), PERIOD), MAXP)
  if rates_from < now + fp then
    rates_from = now + fp
    redis.call('HSET', KEYS[2], '~r', string.format('%.0f', rates_from))
  end
end
-- forget holders not heard from in time
for id, x in pairs(hs) do
  if x[3] <= now then
    hs[id] = nil
    redis.call('HDEL', KEYS[2], id)
  end
end
-- tokens handed back from grants of a lost state were paid by it, not by this one
if lost == 1 then returned = 0 end
if returned > 0 then credit = math.min(cap, credit + returned * window) end
local mine = hs[me] or {0, 0, 0, 0, 0, 0, 0}
mine[1] = demand
mine[2] = held
mine[3] = now + HTTL
hs[me] = mine

-- weighted max-min fair shares of the key's rate (water-filling)
local list = {}
local sum = 0
local total_demand = 0
for id, x in pairs(hs) do
  local du = math.floor(x[1] * window / 1000000)
  list[#list + 1] = {id, du}
  sum = sum + du
  total_demand = total_demand + x[1]
end
local n = #list
local share_of = {}
if sum <= limit then
  local spare = math.floor((limit - sum) / n)
  for _, it in ipairs(list) do share_of[it[1]] = it[2] + spare end
else
  table.sort(list, function(a, b) return a[2] < b[2] end)
  local left = limit
  for k, it in ipairs(list) do
    local fair = math.floor(left / (n - k + 1))
    local give = math.min(it[2], fair)
    share_of[it[1]] = give
    left = left - give
  end
end
local my_share = share_of[me]

if need < 1 then need = 1 end
if need > limit then need = limit end
-- in a quarantine at most the budget goes out of what the bucket holds
local quarantined = now < quarantine
local avail = math.floor(credit / window)
if quarantined then avail = math.min(avail, quarantine_left) end
local bshare = budget
if total_demand > 0 then bshare = math.floor(budget * demand / total_demand) end
if bshare < 1 then bshare = 1 end
local target = math.min(math.max(0, want - need), math.max(0, bshare - held))
local others = 0
local others_active = 0
for id, x in pairs(hs) do
  if id ~= me then
    others = others + x[2]
    if x[6] > now then others_active = others_active + x[4] end
  end
end
local room = math.max(0, budget - others - held)
local granted = 0
if avail >= need then granted = need + math.min(target, room, avail - need) end
credit = credit - granted * window
if quarantined and granted > 0 then
  quarantine_left = quarantine_left - granted
  redis.call('HSET', KEYS[2], '~b', string.format('%.0f', quarantine_left))
end
local wait = 0
if granted == 0 then wait = math.ceil(math.max(0, need * window - credit) / limit) + math.max(0, ts - now) end

local period_demand = math.floor(total_demand * PERIOD / 1000000)
local rates_run = others_active > 0 or mine[6] > now
-- rates need demand above the refill (and a draining bucket) to start, and
-- demand near the refill to go on
local outrun = sum > limit
local sustained = sum * 10 > limit * 9
local shared_and_draining = n > 1 and outrun and avail < limit - math.floor(limit / 4)
local saturated = avail <= period_demand and ((rates_run and sustained) or shared_and_draining)
mine[2] = held + math.max(0, granted - need)
local rate, bonus, period, delay = 0, 0, PERIOD, 0
-- a dry bucket starts rates too; one short of a large request answers
-- as a plain bucket: nothing now, and when to come back
if single or (not saturated and (avail >= need or avail > 0)) then
  mine[4] = 0
  if mine[6] > now then mine[6] = now end
else
  -- the fair share, never far above what the holder spends (rate_cap)
  local my_units = math.floor(demand * window / 1000000)
  local fair = my_share
  if my_units == 0 then
    fair = math.min(fair, math.floor(limit / n))
  else
    fair = math.min(fair, my_units + math.floor(my_units / 4))
  end
  rate = math.min(fair, math.max(0, limit - others_active))
  local my_unmet = math.max(0, my_units - rate)
  -- a rate below the fair share (cut short by others' grants, or by a
  -- demand estimate still rising) comes back after the shortest period
  if rate > 0 and rate >= my_share then period = math.min(math.max(math.ceil(GRANT * window / rate), PERIOD), MAXP) end
  local span = period + GRACE
  -- the bucket's contents, as far as this holder's unmet demand goes
  if now >= quarantine then bonus = math.min(math.floor(credit / span), my_unmet) end
  credit = credit - bonus * span
  if rate + bonus == 0 then
    mine[4] = 0
    -- others' rates take the whole refill: come back when the first ends
    if granted == 0 then
      local first = nil
      for id, x in pairs(hs) do
        if id ~= me and x[6] > now and x[4] > 0 and (first == nil or x[6] - now < first) then first = x[6] - now end
      end
      if first ~= nil and first > wait then wait = first end
    end
  else
    mine[4] = rate
    -- a bucket in debt (the failover guard) pays no rate before it is paid
    -- and so does a bucket found lost, until its quarantine ends
    local start = math.max(ts, now, rates_from)
    delay = start - now
    mine[5] = start
    mine[6] = start + period + GRACE
    if mine[3] < start + period + GRACE + PERIOD then mine[3] = start + period + GRACE + PERIOD end
  end
end
-- (store() below writes the bucket's next version)
mine[7] = ver + 1
redis.call('HSET', KEYS[2], me, string.format('%.0f %.0f %.0f %.0f %.0f %.0f %.0f',
  mine[1], mine[2], mine[3], mine[4], mine[5], mine[6], mine[7]))
-- keep the bucket and the holders while any rate it pays for runs
local last = math.max(now, quarantine)
for _, x in pairs(hs) do
  if x[6] > last then last = x[6] end
  if x[3] > last then last = x[3] end
end
redis.call('PEXPIRE', KEYS[2], string.format('%.0f', last - now + 1000 + pad))
store(last - now)
local rate_ms = 0
if rate + bonus > 0 then rate_ms = period + GRACE end
return {granted, math.floor(credit / window), wait, rate + bonus, bonus, rate_ms, my_share, n, delay, epoch, ver, alive, lost}
