-- Give back: ARGV[3] tokens, capped at capacity. Returns whole tokens remaining.
credit = math.min(cap, credit + tonumber(ARGV[3]) * window)
store()
return math.floor(credit / window)
