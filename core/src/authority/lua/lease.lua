-- Lease: ARGV[3] want, ARGV[4] need, ARGV[6..10] the failover guard (holders
-- seen, unused here, then the prelude's four). Grants
-- min(whole, want) when at least `need` whole tokens are there, else 0.
-- Returns {granted, remaining, wait_ms, epoch, version, alive_ms, lost}.
guard()
local want = tonumber(ARGV[3])
local need = tonumber(ARGV[4])
if need < 1 then need = 1 end
if need > limit then need = limit end
local avail = math.floor(credit / window)
local granted = 0
if avail >= need then granted = math.min(avail, want) end
credit = credit - granted * window
local wait = 0
if granted == 0 then wait = math.ceil((need * window - credit) / limit) + math.max(0, ts - now) end
store()
return {granted, math.floor(credit / window), wait, epoch, ver, alive, lost}
