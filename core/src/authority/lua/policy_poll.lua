-- The policy store: what changed since the caller's version.
-- KEYS: tiers (hash), keys (hash), version (integer), log (list, newest first,
-- "VERSION t NAME" / "VERSION k KEY").
-- ARGV[1]: the caller's version (0: it knows nothing yet).
-- Returns {version, key entries} when nothing changed; else also every tier
-- (flat name, rules list) and, when the log holds the caller's version (so
-- it covers every change since, in the history the caller saw), those
-- changes ("t NAME" / "k KEY", newest first). A version the log lacks (too
-- old, or lost with the writes a promoted replica missed) reads everything.
local v = tonumber(redis.call('GET', KEYS[3]) or '0')
local since = tonumber(ARGV[1])
local n = redis.call('HLEN', KEYS[2])
if v == since then
  return {v, n}
end
local tiers = redis.call('HGETALL', KEYS[1])
if since == 0 or v < since then
  return {v, n, tiers}
end
local changed = {}
local page = 64
local at = 0
while true do
  local log = redis.call('LRANGE', KEYS[4], at, at + page - 1)
  for _, e in ipairs(log) do
    local ev, change = string.match(e, '^(%d+) (.+)$')
    if not ev then
      return {v, n, tiers}
    end
    ev = tonumber(ev)
    if ev == since then
      return {v, n, tiers, changed}
    end
    if ev < since then
      return {v, n, tiers}
    end
    changed[#changed + 1] = change
  end
  if #log < page then
    return {v, n, tiers}
  end
  at = at + page
end
