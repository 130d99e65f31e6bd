-- The policy store: set or delete one tier ('t') or key entry ('k'), give
-- the store a new version and log the change under it, atomically.
-- KEYS: tiers (hash), keys (hash), version (integer), log (list).
-- ARGV: kind ('t' | 'k'), name, value ('' deletes), log length.
-- A version is the server's clock in ms, or one more than the last version
-- when that is later: it grows with every change, and a store that lost
-- changes (a replica promoted without the last writes) and is written again
-- does not hand out a version it had already given another content, so a
-- limiter that saw the lost version reads the whole store again.
local h = KEYS[2]
if ARGV[1] == 't' then
  h = KEYS[1]
end
if ARGV[3] == '' then
  redis.call('HDEL', h, ARGV[2])
else
  redis.call('HSET', h, ARGV[2], ARGV[3])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = math.max(tonumber(redis.call('GET', KEYS[3]) or '0') + 1, now)
local vs = string.format('%d', v)
redis.call('SET', KEYS[3], vs)
redis.call('LPUSH', KEYS[4], vs .. ' ' .. ARGV[1] .. ' ' .. ARGV[2])
redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[4]) - 1)
return v
