-- The ledger: adaptive leasing for one key (docs/design.md, "The ledger").
-- Runs in Redis and, unchanged, in the memory authority's embedded Lua 5.1.
--
-- KEYS[1] the key's state (a hash), KEYS[2] its expiries (a sorted set of
-- "c<holder>" commitment, "r<holder>" rate, "f<holder>" fallback-share and
-- "w<holder>" place-in-line expiries), KEYS[3] a concurrency limit's line
-- of holders waiting for a permit (a sorted set by when they first asked).
-- ARGV: op ("l" lease, "g" give back, "x" give back and leave, "d" debit),
-- limit, window_ms, now ("" for Redis TIME), holder, demand (milli-tokens/s),
-- held (tokens; for "g" and "x": tokens returned; for "d": tokens taken), want, need, single, rate_now, carry_now, fallback_used, the
-- guard's epoch, version and alive_ms, then the tuning (core/src/ledger.rs):
-- commit_ms, fallback_ms, learn_ms, min_period_ms, max_period_ms,
-- grant_tokens, carry_ms, rate_cap_pct, saturation_pct; then `spent`, the
-- tokens of a grant the request that asked spends as it lands; then
-- debt_pay_pct, rate_start_pct; then the call's sequence number (per
-- holder, rising; 0: none) and that of the last answer the holder applied
-- (see `unseen`; a give-back sends the latter only, see `give_back`); then
-- the most tokens the holder held since its call `low_seq` left and that
-- number (0: none; see `spent_credit`); then
-- chunk_ms (a saturated key's chunk is at most a share over it); then
-- join_pct (see `join`); then the holder's valid fallback share now (units
-- of 1/window token per ms; 0: none; see `fallback`); last the kind of
-- bucket: none or '' a token bucket, 'c'
-- a calendar quota followed by the start of the period that holds the
-- caller's time of day, its end and the next end (on this script's
-- clock), 'n' a concurrency limit (tokens are permits in flight).
--
-- Units: credit `c` in 1/w token (w the stored window), rates in those
-- units per ms (the key's refill rate is `l`), commitments in tokens.
-- Invariants kept by every step (the bound's proof in docs/design.md):
--   I1  R + A <= l (R: sum of active rates; A: rooms of rates that ran
--       out, kept from new rates while their holders may report them)
--   I2  max(c, 0) + L * w <= l * w (L: sum of live commitments)
--   I3  a holder spends a commitment only before its expiry (engine)
--   I4  F (sum of valid fallback shares) <= l
local K, Z, W = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]
local limit, window = tonumber(ARGV[2]), tonumber(ARGV[3])
local holder = ARGV[5]
local demand, held = tonumber(ARGV[6]), tonumber(ARGV[7])
local want, need, single = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10] == '1'
local rate_now, carry_now, used = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local g_epoch, g_version, g_alive = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
local commit_ms, fallback_ms, learn_ms = tonumber(ARGV[17]), tonumber(ARGV[18]), tonumber(ARGV[19])
local min_period, max_period = tonumber(ARGV[20]), tonumber(ARGV[21])
local grant_tokens, carry_ms = tonumber(ARGV[22]), tonumber(ARGV[23])
local rate_cap_pct, saturation_pct = tonumber(ARGV[24]), tonumber(ARGV[25])
local spent = tonumber(ARGV[26]) or 0
local debt_pay_pct = tonumber(ARGV[27]) or 0
local rate_start_pct = tonumber(ARGV[28]) or 0
local seq, applied = tonumber(ARGV[29]) or 0, tonumber(ARGV[30]) or 0
local low, low_seq = tonumber(ARGV[31]) or 0, tonumber(ARGV[32]) or 0
local chunk_ms = tonumber(ARGV[33]) or min_period
local join_pct = tonumber(ARGV[34]) or 100
local share_now = tonumber(ARGV[35]) or 0

local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
-- numbers go to Redis as integer text (Lua's own text is %.14g); a whole
-- number within 2^52 through %d, the same text as %.0f and a fraction of
-- the cost (glibc formats %.0f in multiple precision: its share of a
-- ledger call's CPU was about 5 %, docs/benchmarks.md)
local fmt = string.format
local function S(x)
  if x == floor(x) and x > -4503599627370496 and x < 4503599627370496 then return fmt('%d', x) end
  return fmt('%.0f', x)
end
local NEVER = 4503599627370496 -- 2^52: a commitment that expires only when given back

local now, pad
if ARGV[4] ~= '' then
  -- a caller's clock is not Redis' clock: keep the state longer
  now, pad = tonumber(ARGV[4]), 600000
else
  local t = redis.call('TIME')
  now, pad = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000), 0
end

-- a calendar quota: the period this script's clock is in (a clock behind
-- the caller's, before the caller's period began, knows only its end)
local cal_start, cal_end = nil, nil
-- a concurrency limit: a permit is free unless committed, c = cap - L * w
-- (set at every refill, grant and store), so permits come back when given
-- back, when a holder no longer reports them held and when a commitment
-- expires (a holder that died); nothing else refills
local conc = ARGV[36] == 'n'
if ARGV[36] == 'c' then
  local b0, b1, b2 = tonumber(ARGV[37]), tonumber(ARGV[38]), tonumber(ARGV[39])
  if now >= b1 then
    cal_start, cal_end = b1, b2
  elseif now >= b0 then
    cal_start, cal_end = b0, b1
  else
    cal_start, cal_end = -1, b0
  end
end

-- load: the key's state, created empty of commitments with a full bucket
local FIELDS = { 'l', 'w', 'c', 't', 'L', 'R', 'F', 'D', 'n', 'e', 'v', 'u', 'z', 'y', 'j', 'O', 'P', 'b', 'o', 'k', 's', 'A', 'E' }
local s = {}
-- the fields as read: `store` writes the ones that changed (each field an
-- HSET writes costs the server a search of the hash's listpack, and each
-- number formatted about 2800 instructions: docs/benchmarks.md)
local was = {}
local fresh = false
local ty = redis.call('TYPE', K)
if type(ty) == 'table' then ty = ty.ok end
if ty == 'string' then
  -- a bucket stored before the ledger ("c t w ..."): take its credit over
  local old = redis.call('GET', K)
  local c0, t0, w0 = string.match(old or '', '^(%d+) (%d+) (%d+)')
  redis.call('DEL', K)
  if c0 then
    s = { l = limit, w = tonumber(w0), c = tonumber(c0), t = tonumber(t0), L = 0, R = 0, F = 0, D = 0, n = 0,
      e = now + 2, v = 0, u = 0, z = 0 }
  end
elseif ty == 'hash' then
  local vals = redis.call('HMGET', K, unpack(FIELDS))
  for i, f in ipairs(FIELDS) do
    s[f] = tonumber(vals[i])
    was[f] = s[f]
  end
end
if s.c == nil or s.t == nil or s.w == nil or s.w <= 0 or s.l == nil then
  fresh = true
  was = {}
  s = { l = limit, w = window, c = limit * window, t = now, L = 0, R = 0, F = 0, D = 0, n = 0,
    e = now + 2, v = 0, u = 0, z = 0 }
end
-- `y` (when a saturated call last found the bucket dry), `j` (when a
-- holder last joined), `k` (when a holder's first demand estimate last
-- brought `join_pct` of D), the overflow's sums `O`, `P` and their epoch `b`,
-- `s` (until when shares learn after a loss), `A` (see `tail_end`) and `E`
-- (see `guard`) came after the other fields: a state stored before them
-- reads as never and none. (An older
-- overflow `o` since `q` is dropped: no holder record holds a snapshot of
-- the new sums, so none pays from them yet.)
if s.o ~= nil then redis.call('HDEL', K, 'o', 'q') end
s.y, s.j, s.k, s.O, s.P, s.b, s.s = s.y or 0, s.j or 0, s.k or 0, s.O or 0, s.P or 0, s.b or 1, s.s or 0
s.A, s.E = s.A or 0, s.E or 0
-- the overflow's sums start again (their epoch `b` moves on): every
-- holder's snapshot of them is void, so no holder pays from them until its
-- next lease call
local function overflow_restart()
  s.O, s.P, s.b = 0, 0, s.b + 1
end

-- policy: a call under another limit or window converts the state exactly
-- enough never to mix units (rounding only ever lowers what can be granted),
-- and the credit is held to the new capacity less what is committed (I2) at
-- once: a refill clamps it too, but none runs in the millisecond of the
-- last write (a limit lowered from 57 to 1 per 100 ms granted 10 of the old
-- credit in that millisecond)
local cap = limit * window
-- the most the credit may hold: the capacity less what is committed (I2)
local function uncommitted() return cap - s.L * window end
if s.w ~= window or s.l ~= limit then
  local r = window / s.w
  s.c = min(floor(s.c * r), uncommitted())
  overflow_restart()
  s.R = ceil(s.R * r)
  s.A = ceil(s.A * r)
  s.F = ceil(s.F * r)
  s.l, s.w = limit, window
end

-- refill to `to`: the key's rate less what active rates take, clamped at
-- capacity less what is committed (I2); none while learning after a loss.
-- What the clamp cuts is refill nobody took through the ledger: it is
-- summed in `O` (the overflow since the epoch `b`), to pay fallback
-- admissions made after it (`P` sums what paid; see `grant`)
local function refill(to)
  if to <= s.t then return end
  local from = max(s.t, s.z)
  local room = uncommitted()
  if conc then
    s.c = room
    s.t = to
    return
  end
  if cal_start then
    -- a calendar quota refills nothing in a period: a whole capacity comes
    -- back at the period's start (once however many starts passed; none
    -- at a start while learning), clamped as any refill is (I2)
    if from < cal_start and cal_start <= to then s.c = s.c + cap end
    s.c = min(s.c, room)
    s.t = to
    return
  end
  if to > from then
    local rate = max(limit - s.R, 0)
    -- (the whole span: a silent outage of any length cuts its whole refill)
    local full = s.c + rate * (to - from)
    if full > room and rate > 0 then
      s.O = s.O + full - max(room, s.c)
      -- (sums stay exact integers in a double)
      if s.O > 2 ^ 50 then overflow_restart() end
    end
    -- (a debt, c < 0, is paid first: the refill runs that much longer)
    local debt_ms = 0
    if s.c < 0 and rate > 0 then debt_ms = ceil(-s.c / rate) end
    s.c = s.c + rate * min(to - from, window + debt_ms)
  end
  s.c = min(s.c, room)
  s.t = to
end

-- records: "L r d f w v k O P b" (commitment tokens, rate and fallback
-- share in units of 1/w token per ms, demand, the window w of those units,
-- version, 1 while its commitment is live and counted in `n`, and the
-- overflow's sums `O`, `P` with their epoch `b` at its last lease call:
-- `so`, `sp`, `sb`; -1, none, in a record stored before them)
local recs = {}
local function record(id)
  if recs[id] == nil then
    local raw = redis.call('HGET', K, 'h' .. id)
    local r = { L = 0, r = 0, d = 0, f = 0, w = window, v = 0, live = false, so = 0, sp = 0, sb = -1 }
    if raw then
      local a, b, c, d, e, f, k, o, p, q =
        string.match(raw, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d) ?(%d*) ?(%d*) ?(%d*)$')
      if a then
        r = { L = tonumber(a), r = tonumber(b), d = tonumber(c), f = tonumber(d), w = tonumber(e), v = tonumber(f),
          live = k == '1', known = true, so = tonumber(o) or 0, sp = tonumber(p) or 0, sb = tonumber(q) or -1 }
      end
    end
    recs[id] = r
  end
  return recs[id]
end
local function conv(x, w)
  return floor(x * window / w)
end
local function save(id, r)
  if r.L == 0 and r.f == 0 and not r.live then
    redis.call('HDEL', K, 'h' .. id, 'g' .. id)
  else
    local k = 0
    if r.live then k = 1 end
    redis.call('HSET', K, 'h' .. id, S(r.L) .. ' ' .. S(r.r) .. ' ' .. S(r.d) .. ' ' .. S(r.f) .. ' ' .. S(r.w) ..
      ' ' .. S(r.v) .. ' ' .. k .. ' ' .. S(r.so) .. ' ' .. S(r.sp) .. ' ' .. S(max(r.sb, 0)))
  end
end

-- tails: a rate that runs out at its end (not renewed before it) leaves R,
-- so the refill runs at the whole rate again, but its room stays out of new
-- rates (`A`, I1) for a shortest period, the renewal grace `e`: until then
-- its holder may still report it (`Ask::rate`), and an authority that lost
-- the state re-grants what holders report (`relearn`). Kept so, the rates
-- reported to it were all counted at once in the lost state, whenever it
-- was lost (a rate that ran out during an outage, before its holder's
-- first probe after a restart, was reported as none, and the holder got
-- nothing while the new state learned). A tail ends at its grace's end, at
-- its holder's next lease call (which reports it, if it still may) or
-- give-back, or with its commitment. A rate of the shortest period keeps
-- none, and its holder does not report it after its end (`Entry::tails`):
-- it was split while the holders' sum of demand moved (or cut short by
-- tails), and kept, such a stale rate's room squeezed the holders renewing
-- meanwhile. `a<id>` = "rate window": the tail's rate in units of that
-- window.
local function tail_end(id)
  local raw = redis.call('HGET', K, 'a' .. id)
  if not raw then return end
  redis.call('HDEL', K, 'a' .. id)
  local a, w = string.match(raw, '^(%d+) (%d+)$')
  if a then s.A = max(s.A - conv(tonumber(a), tonumber(w)), 0) end
end

-- reap: expired commitments and fallback shares leave the sums, in expiry
-- order, each after the refill up to its expiry (its rate ran until then)
local last_grant
local function reap()
  local due = redis.call('ZRANGEBYSCORE', Z, '-inf', S(now), 'WITHSCORES')
  if #due == 0 then return end
  for i = 1, #due, 2 do
    local m, at = due[i], tonumber(due[i + 1])
    refill(at)
    local id = string.sub(m, 2)
    local r = record(id)
    local kind = string.sub(m, 1, 1)
    if kind == 'c' then
      s.L = s.L - r.L
      s.R = s.R - conv(r.r, r.w)
      s.D = s.D - r.d
      s.n = s.n - 1
      r.L, r.r, r.d, r.live = 0, 0, 0, false
      tail_end(id)
    elseif kind == 'r' then
      -- a rate ends before its commitment (the carry stays committed);
      -- the refill runs at the whole rate from its end (the holder accrues
      -- nothing after it, I3). For a shortest period the holder is known
      -- to be renewing (`e`): it renews at its first request after the end,
      -- and the rate's room is its tail (`tail_end`; none when the grace
      -- is over already: the reap is lazy)
      local x = conv(r.r, r.w)
      s.R = s.R - x
      r.r = 0
      local gr = nil
      if x > 0 and at + min_period > now then gr = last_grant(id) end
      if gr and gr.to == at and gr.to - gr.from > min_period then
        tail_end(id)
        s.A = s.A + x
        redis.call('HSET', K, 'a' .. id, S(x) .. ' ' .. S(window))
      end
      redis.call('ZADD', Z, S(at + min_period), 'e' .. id)
    elseif kind == 'e' then
      -- the renewal's grace ended, and the tail with it
      tail_end(id)
    elseif kind == 'w' then
      -- a waiter that stopped asking leaves the line
      redis.call('ZREM', W, id)
    else
      s.F = s.F - conv(r.f, r.w)
      r.f = 0
    end
    r.dirty = true
  end
  redis.call('ZREMRANGEBYSCORE', Z, '-inf', S(now))
  if s.n <= 0 then s.n, s.L, s.R, s.D, s.A = 0, 0, 0, 0, 0 end
  s.L, s.R, s.F, s.D = max(s.L, 0), max(s.R, 0), max(s.F, 0), max(s.D, 0)
  for id, r in pairs(recs) do
    if r.dirty and id ~= holder then save(id, r) end
  end
end

-- store: the state and this holder's record; both keys live at least as
-- long as any answer said (`u`), so a quiet key never reads as lost
local alive = 0
local function store(me, c_until, f_until, r_until)
  s.v = s.v + 1
  if me then
    me.v = s.v
    save(holder, me)
    if c_until then redis.call('ZADD', Z, S(c_until), 'c' .. holder) end
    if f_until then redis.call('ZADD', Z, S(f_until), 'f' .. holder) end
    if r_until then redis.call('ZADD', Z, S(r_until), 'r' .. holder) end
  end
  if conc then s.c = uncommitted() end
  local learning = max(s.z - now, s.s - now, 0)
  local full = ceil((cap - min(s.c, cap)) / limit) + learning
  if cal_start and s.c < cap then
    -- kept until the period's start that fills it (a debt: later ones)
    full = cal_end - now + ceil(max(-s.c, 0) / cap) * 2 * window + learning
  end
  alive = max(full, max(s.u - now, 0))
  if s.n > 0 or s.F > 0 then
    local last = redis.call('ZRANGE', Z, '-1', '-1', 'WITHSCORES')
    if last[2] then alive = max(alive, min(tonumber(last[2]), NEVER) - now) end
  end
  s.u = now + alive
  local set = {}
  -- (all but the older overflow `o`, which `load` deleted)
  for _, f in ipairs(FIELDS) do
    local x = s[f]
    -- (`A` and `E` 0 are not stored where they never were: fields less a key)
    local unset = (f == 'A' or f == 'E') and x == 0 and was[f] == nil
    if f ~= 'o' and x ~= was[f] and not unset then
      set[#set + 1] = f
      set[#set + 1] = S(x)
      was[f] = x
    end
  end
  -- (never empty: the version `v` moved)
  redis.call('HSET', K, unpack(set))
  local px = S(alive + 1000 + pad)
  redis.call('PEXPIRE', K, px)
  redis.call('PEXPIRE', Z, px)
  if conc then redis.call('PEXPIRE', W, px) end
end

-- store with no new commitment: the state, and this holder's record
-- whenever it exists (`reap` may have just expired its commitment, and
-- leaves the caller's record to `store`)
local function store_known(me)
  if me.known then
    store(me, nil, nil)
  else
    store(nil, nil, nil)
  end
end

local function whole()
  return floor(max(s.c, 0) / window)
end

-- split: a holder's part of the key's rate, proportional to its demand
-- (needs only the sum D, so a call's cost does not grow with holders)
local function share()
  if s.D <= 0 then return floor(limit / max(s.n, 1)) end
  return floor(limit * max(demand, 0) / s.D)
end

-- leave (op "x", a holder closing, after its give-back): the rest of it
-- leaves the sums: its demand, its fallback share (free for the holders
-- that stay, I4) and the rest of its commitment (spent: it spends no more)
local function leave(me)
  if me.live then
    s.L = max(s.L - me.L, 0)
    s.D = max(s.D - me.d, 0)
    s.n = max(s.n - 1, 0)
  end
  s.F = max(s.F - conv(me.f, me.w), 0)
  me.L, me.r, me.d, me.f, me.live = 0, 0, 0, 0, false
  tail_end(holder)
  redis.call('HDEL', K, 'g' .. holder)
  redis.call('ZREM', Z, 'c' .. holder, 'r' .. holder, 'f' .. holder, 'e' .. holder, 'w' .. holder)
  if conc then redis.call('ZREM', W, holder) end
end

-- the last grant to this holder (`g<id>` = "seq chunk rate from until
-- window debited": the call's number, the chunk less what the asking
-- request spent, the rate and its span, and the fallback admissions it
-- debited), if its record is still kept
function last_grant(id)
  local raw = redis.call('HGET', K, 'g' .. (id or holder))
  if not raw then return nil end
  local a, b, c, d, e, f, u = string.match(raw, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) ?(%d*)$')
  if not a then return nil end
  return { seq = tonumber(a), chunk = tonumber(b), rate = tonumber(c), from = tonumber(d), to = tonumber(e),
    w = tonumber(f), debited = tonumber(u) or 0 }
end

-- give back (op "g"): unspent tokens of this holder's commitment return to
-- the bucket, and its rate (if any) ends; tokens of an expired commitment
-- were already forgotten and are not credited. `applied` is the last lease
-- call whose answer the holder had applied when it gave back: a rate set by
-- a later call (its answer in flight, or lost) runs on at the holder when
-- that answer lands, so it stays counted (I1) until its end, and its grant
-- is still credited back at the next call if its reply never lands
-- (`unseen`). A holder leaving (op "x") ends it whatever it saw: it admits
-- nothing more
local function give_back()
  if fresh then return whole() end
  local me = record(holder)
  local ahead = false
  if op == 'g' then
    local g = last_grant()
    ahead = g ~= nil and g.seq > applied
  end
  if me.live then
    local back = min(held, me.L)
    me.L = me.L - back
    s.L = s.L - back
    s.c = s.c + back * window
    if not ahead then
      s.R = max(s.R - conv(me.r, me.w), 0)
      me.r = 0
    end
  end
  -- (a grant this holder has seen is no longer credited later: its rate
  -- ended here, and what it gives back is what it has; nor does it report
  -- a rate that ran out any more)
  if not ahead then
    redis.call('HDEL', K, 'g' .. holder)
    tail_end(holder)
  end
  if op == 'x' and me.known then leave(me) end
  store_known(me)
  return whole()
end

-- guard: state lost (Redis restarted empty, a stale replica promoted) is
-- told from what this holder saw: an epoch that changed while the state
-- had to exist, or a version older than one it was answered with. A loss
-- restarts the bucket empty and learns for the longest commitment: no
-- refill, no new tokens; holders keep (and are re-granted) what they report.
-- The lost state's fallback shares stay valid at their holders for
-- `fallback_ms` after their answers: until then the shares learn too
-- (`s`, see `fallback`). A loss is found once: the lost epoch is kept
-- (`E`), and the version moves past the one the holder saw, so that its
-- next call with the same stamp (its answer lost, as under a CPU hog,
-- where a call times out) finds none; each found it again, emptied the
-- bucket and moved the learning's end, as long as the holder's replies
-- were lost, even after the learning (a loss on a healthy Redis)
local function guard(me)
  local lost = 0
  if g_epoch > 0 then
    if g_epoch ~= s.e then
      if g_alive > 0 and g_epoch ~= s.E then lost = 1 end
    elseif g_version > s.v or (me.known and g_version > me.v) then
      lost = 1
    end
  end
  if lost == 1 then
    s.c = 0
    overflow_restart()
    s.t = now
    s.z = max(s.z, now + learn_ms)
    s.s = max(s.s, now + fallback_ms)
    if g_epoch ~= s.e then s.E = g_epoch else s.v = max(s.v, g_version) end
  end
  return lost
end

-- join: the holder's part leaves the key's sums (the decision puts what it
-- grants back); its demand replaces the one it reported last
local function join(me)
  local old_L, old_r, old_f = me.L, conv(me.r, me.w), conv(me.f, me.w)
  -- (within a rate's grace its tail ends here: this call reports it, and
  -- the decision below counts what it grants)
  local renewing = old_r > 0
  if not renewing and redis.call('ZSCORE', Z, 'e' .. holder) ~= false then
    renewing = true
    tail_end(holder)
  end
  if not me.live then s.n, s.j = s.n + 1, now end
  -- `k`: when a holder last brought `join_pct` % of the sum D or more
  -- with its first demand estimate (as it joins, or at a later call: it
  -- adds nothing before): the rates split before are that far off. (Not
  -- every join: a large fleet's churn adds a little at a time, and 50
  -- holders, one replaced every second, made 60 % more calls when every
  -- join counted; not every rise of an estimate: a few requests a second
  -- leave it noisy.)
  local first = me.d <= 0 and demand > 0
  s.D = s.D - me.d + demand
  if first and demand * 100 >= join_pct * s.D then s.k = now end
  me.d = demand
  s.L = s.L - old_L
  s.R = s.R - old_r
  s.F = s.F - old_f
  me.w = window
  me.live = true
  return old_L, renewing
end

-- learn: after a loss, trust what the holder reports (its commitment to the
-- lost state), re-grant its rate as it was, and no new tokens
local function relearn(me)
  local h = min(held, limit)
  local rate, period = 0, 0
  if rate_now > 0 then
    rate = min(rate_now, max(limit - s.R - s.A, 0))
    period = min(max_period, s.z - now)
  end
  me.L = h
  if rate > 0 then me.L = h + min(carry_now, limit) end
  return 0, rate, period, s.z - now
end

-- rate (saturated key): its share, near its demand, within what others'
-- rates leave (I1); what the bucket holds (what the rates did not take)
-- goes out at renewals in proportion to demand; and a carry: tokens it
-- may hold from the rate, within capacity (I2). Returns granted, rate,
-- period, wait (no rate when no carry fits)
local function rate_grant(me, h, avail, part)
  local cap_r = floor(demand * window / 1000000 * rate_cap_pct / 100)
  if demand <= 0 then cap_r = floor(limit / max(s.n, 1)) end
  local sh = share()
  -- in debt (fallback admissions debited, c < 0), rates leave a part of
  -- the key's rate to the refill, which pays the debt back
  local room = limit
  if s.c < 0 then room = floor(limit * (100 - debt_pay_pct) / 100) end
  local want_r = min(sh, cap_r)
  local rate = max(min(want_r, room - s.R - s.A), 0)
  -- a rate the tails cut short is the shortest (their room comes back when
  -- their holders call, or within a shortest period); any other longer, by
  -- a millisecond at least: a rate keeps a tail when it runs out only if
  -- it lasted longer than the shortest period (see `tail_end`)
  local period = min_period
  local cut = rate < want_r and room - s.R > rate
  if rate * 2 >= sh and rate > 0 and not cut then
    period = min(max(ceil(grant_tokens * window / rate), min_period + 1), max_period)
  end
  local granted = 0
  if avail >= need then
    local mine = floor(avail * max(demand, 0) / max(s.D, 1))
    granted = min(max(part, need + mine), avail)
  end
  -- (a token more: room for the fraction of a token the rate accrues
  -- beside whole ones, which the holder may keep only below its commitment)
  local carry = max(need, ceil(rate * carry_ms / window) + 1)
  -- at most its demand's part of the capacity, so that every holder's carry
  -- fits beside the others' (1000 holders of a 1000/s key, 2 tokens each,
  -- left half of them without a rate and the refill cut: 0.46 of the allowance)
  if demand > 0 then carry = max(need, min(carry, floor(limit * demand / max(s.D, demand)))) end
  local room = floor((cap - max(s.c - granted * window, 0)) / window) - s.L - h - granted
  carry = min(carry, room)
  if carry < need or rate <= 0 then
    if granted == 0 then return 0, 0, 0, min_period end
    return granted, 0, 0, 0
  end
  me.L = h + carry
  return granted, rate, period, 0
end

-- grant: fallback admissions since the last answer are debited (I4); then
-- a chunk of what the bucket holds, or on a saturated key a rate. On a
-- saturated key a chunk is at most a share of the refill over `chunk_ms`
-- (counted whole in L until its holder's next call, though spent as it
-- goes: a shorter chunk leaves less of the capacity counted for tokens
-- already spent), and a holder renewing a rate gets a rate again. The `spent` part
-- of a chunk is spent by the request that asked as it lands.
-- the line (a concurrency limit): holders denied a permit wait in it by
-- when they first asked, each keeping its place for a shortest period
-- after its last ask; while one waits, a permit goes only to the first in
-- line (a holder that releases and asks again at once no longer takes
-- every permit from the others). Withholding permits cannot break the bound.
local function line_ahead()
  local first = redis.call('ZRANGE', W, '0', '0')[1]
  return first ~= nil and first ~= holder
end
local function queue(served)
  if served then
    redis.call('ZREM', W, holder)
    redis.call('ZREM', Z, 'w' .. holder)
  else
    if not redis.call('ZSCORE', W, holder) then
      -- after the last in line, even within one millisecond (ties would
      -- be ordered by holder id)
      local last = redis.call('ZRANGE', W, '-1', '-1', 'WITHSCORES')
      local at = now
      if last[2] then at = max(at, tonumber(last[2]) + 1) end
      redis.call('ZADD', W, S(at), holder)
    end
    redis.call('ZADD', Z, S(now + min_period), 'w' .. holder)
  end
end

local renew_only = false
-- fallback admissions debited for the `used` this holder reports (in 1/w
-- token): what an unseen last call took of them (`g<id>`'s last field,
-- `unseen_debit`), and what this call has taken of them in all (`taken`)
local prior_taken, taken = 0, 0
local function grant(me, old_L, renewing)
  local h = min(held, old_L)
  if used > 0 then
    -- (`used` counts again what an unseen call took: only the rest is due)
    local debit = max(used * window - prior_taken, 0)
    -- what the clamp cut since this holder's last lease call (`O` less
    -- its snapshot) went unused, less what paid since (`P` less its
    -- snapshot, whoever it paid for): it pays next
    if me.sb == s.b then
      local paid = min(max((s.O - me.so) - (s.P - me.sp), 0), debit)
      s.P = s.P + paid
      taken = taken + paid
      debit = debit - paid
    end
    local before = s.c
    s.c = max(s.c - debit, -cap)
    taken = taken + (before - s.c)
  end
  -- (permits: free are those nobody holds, this holder's `h` included)
  if conc then s.c = cap - (s.L + h) * window end
  local avail = whole()
  if conc and (renew_only or line_ahead()) then avail = 0 end
  -- (a calendar quota or a concurrency limit grants no rates: neither has
  -- a refill to share)
  local saturated = not single and not cal_start and not conc and (s.D * window / 1000000) * 100 >= limit * saturation_pct
  local part = min(max(want, need), need + floor(share() * chunk_ms / window))
  -- rates start where the bucket runs dry; once it has (`y`, within a
  -- longest period), every saturated holder moves on at its next call
  -- while the bucket stays below `rate_start_pct` of its capacity
  if saturated and avail < need then s.y = now end
  local dry = s.y > 0 and now - s.y <= max_period and avail * 100 < limit * rate_start_pct
  local renew = saturated and (avail < need or rate_now > 0 or renewing or dry)
  me.L = h
  local granted, rate, period, wait = 0, 0, 0, 0
  if avail >= need and not renew then
    local ask = want
    if saturated then ask = part end
    granted = min(max(ask, need), avail)
  elseif saturated then
    granted, rate, period, wait = rate_grant(me, h, avail, part)
    -- a first rate while holders are joining is the shortest, and so is
    -- any rate within a shortest period of `k`: it was split by a sum of
    -- demand that may not hold the next ones yet (a renewal on the first
    -- few holders' sum kept their larger shares for a longest period while
    -- a later one waited)
    local moving = (not renewing and now - s.j < min_period) or now - s.k < min_period
    if rate > 0 and moving then period = min_period end
  end
  if granted > 0 then
    s.c = s.c - granted * window
    me.L = me.L + granted - min(spent, granted)
  elseif cal_start then
    wait = max(cal_end - now, 1)
  elseif conc then
    -- (a permit may come back at any release: ask again soon)
    wait = min_period
  elseif rate == 0 and wait == 0 then
    wait = ceil(max(need * window - s.c, 0) / max(limit - s.R, 1))
  end
  return granted, rate, period, wait
end

-- fallback: a share proportional to demand, within what other valid
-- shares leave of the key's rate (I4). Within `fallback_ms` of a loss the
-- lost state's shares may still be valid at holders that have not called
-- since, and F does not count them: a holder is re-granted the share it
-- reports, never more (one that reports none gets none), so the shares
-- valid anywhere still sum to at most what the lost state granted (the
-- random outages found three holders admitting 520 on their shares where
-- 476 were allowed: one read the loss, got a share of the whole rate, and
-- the two others ran on theirs)
local function fallback(me)
  local most = share()
  if s.s > now then most = share_now end
  me.f = max(min(most, limit - s.F), 0)
  s.F = s.F + me.f
end

-- debit (op "d"): a settled reservation used `held` tokens beyond its
-- estimate; they are taken whatever the bucket holds, into a debt of any
-- depth, which the refill pays before anything is granted (the state is
-- kept until it is paid). (Tokens it
-- did not use never come back here: once the holder's commitment is
-- re-based or expired they count as spent, and the refill has filled
-- their room since; returning them would credit them twice.)
local function debit()
  s.c = s.c - held * window
  store_known(record(holder))
  return whole()
end

-- spent_credit: the holder reports that it held at most `low` tokens
-- since its call `low_seq` left. When that call is the last this ledger
-- had from it (`g<id>`), and it applied the answer, its commitment `L_h`
-- was counted in `L` from then on, `L_h - low` tokens more than it held,
-- and the clamp (I2) may have cut refill for them. That refill comes back
-- to the bucket, up to `L_h - low`: the overflow cut since that call less
-- what the overflow paid since (`P`: fallback debts and these credits, so
-- each unit of cut refill comes back once). The bound's argument is in
-- docs/design.md ("Refill cut for tokens spent"): over any interval from
-- t, what comes back of refill cut before t is at most what the holders
-- were counted in `L` at t beyond what they held.
local function spent_credit(me, old_L, g, h)
  if low_seq <= 0 or g == nil or g.seq ~= low_seq or g.seq > applied or me.sb ~= s.b then return end
  if s.z > now or conc or cal_start or low >= old_L then return end
  local x = min((old_L - low) * window, (s.O - me.so) - (s.P - me.sp))
  -- only what this call asks for, which it takes at once: the rest stays
  -- in the overflow for the next callers (credit left waiting in the
  -- bucket took the room rate carries need: 1000 holders of a 1000/s key
  -- lost their rates, 0.71 -> 0.48 of the allowance at 1.7 calls each)
  x = min(x, max(want, need, 1) * window)
  -- (within I2 beside the others' commitments and what this holder keeps)
  x = min(x, cap - (s.L + h) * window - s.c)
  if x <= 0 then return end
  s.c = s.c + x
  s.P = s.P + x
end

-- unseen: the answer to this holder's call that last wrote its grant
-- (`g<id>` = "seq chunk rate from until window") never reached it (a reply
-- lost to a timeout: the connection was dropped with it). That chunk (less
-- what the asking request was to spend) and what that rate accrued since
-- were moved into the holder's commitment but are not at the holder. Up to
-- what the commitment holds beyond what the holder reports, they go back
-- to the bucket as a give-back would: W (the bucket plus what holders
-- hold unspent) is unchanged by it, and I2 holds, since the commitment
-- leaves `L` as they land in `c`. A commitment already reaped counted them
-- as spent (the refill has filled their room since): nothing comes back.
local function unseen(me, g)
  if g == nil or g.seq <= applied or not me.live or s.z > now then return 0 end
  local units = g.chunk * window
  local to = min(now, g.to)
  if to > g.from then units = units + conv(g.rate, g.w) * (to - g.from) end
  return min(units, (me.L - min(held, me.L)) * window)
end
-- unseen_debit: the holder reports in `used` every fallback admission of
-- its since its last applied answer (it lowers the count only by what an
-- answer it applied says was debited). So what the unseen call took for
-- them is taken again now: only the rest is debited (`grant`), and each
-- admission is debited once. (Before: each call whose reply was lost
-- debited them again; six holders muted for 2.7 s then paid a debt of
-- about a second of the key's rate at half its rate:
-- `lost_replies_cost_no_debt_after_the_outage`.)
local function unseen_debit(g)
  if g == nil or g.seq <= applied or g.w ~= window then return 0 end
  return g.debited
end

-- the call: reap, refill, then give back, debit or decide
reap()
refill(now)
if op == 'g' or op == 'x' then return give_back() end
if op == 'd' then return debit() end

local me = record(holder)
local lost = guard(me)
-- the answer (15 integers, `ledger::parse`), after `store`
local function reply(granted, wait, rate, period)
  return { granted, whole(), wait, rate, period, me.L, commit_ms, me.f, fallback_ms, s.n, max(s.z - now, 0),
    s.e, s.v, alive, lost }
end
local g = nil
if seq > 0 then g = last_grant() end
if g and seq <= g.seq then
  -- a call sent before the one that wrote the last grant: its holder gave
  -- up on it before sending that one, and never applies this answer
  store_known(me)
  return reply(0, min_period, 0, 0)
end
local back = unseen(me, g)
prior_taken = unseen_debit(g)
local was_live = me.live
local old_L, renewing = join(me)
if was_live then spent_credit(me, old_L, g, min(held, old_L)) end
if back > 0 then
  s.c = max(s.c, min(s.c + back, cap - (s.L + min(held, old_L)) * window))
end
if need < 1 then need = 1 end
if need > limit then need = limit end
-- a permit bucket's renewal (want 0) re-commits what its holder reports
-- and asks for nothing: it takes no permit and no place in the line
renew_only = conc and want == 0
-- (a permit is granted to the request that asks, never ahead: one held
-- idle at an instance would be one the others wait for)
if single or conc then want = need end

local granted, rate, period, wait
if s.z > now then
  granted, rate, period, wait = relearn(me)
else
  granted, rate, period, wait = grant(me, old_L, renewing)
  if conc and not renew_only then queue(granted >= need) end
end
me.r = rate
s.L = s.L + me.L
s.R = s.R + rate
fallback(me)
-- (the overflow pays this holder's fallback admissions from here on)
me.so, me.sp, me.sb = s.O, s.P, s.b

if seq > 0 then
  local to = now
  if rate > 0 then to = now + period end
  redis.call('HSET', K, 'g' .. holder, S(seq) .. ' ' .. S(max(granted - min(spent, granted), 0)) .. ' ' ..
    S(rate) .. ' ' .. S(now) .. ' ' .. S(to) .. ' ' .. S(window) .. ' ' .. S(prior_taken + taken))
end

local c_until = NEVER
if commit_ms > 0 then c_until = now + commit_ms end
-- a rate leaves the sums at its end (reaped then, in expiry order)
local r_until = nil
if rate > 0 then r_until = now + period end
store(me, c_until, now + fallback_ms, r_until)
return reply(granted, wait, rate, period)
