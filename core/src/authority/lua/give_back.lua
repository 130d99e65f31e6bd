-- Give back: ARGV[3] tokens, capped at capacity. With ARGV[4] = 1, take
-- them instead (the overage of a settled reservation): what the credit
-- cannot pay is owed. Returns whole tokens remaining.
if ARGV[4] == '1' then
  owe(tonumber(ARGV[3]) * window)
else
  credit = math.min(cap, credit + tonumber(ARGV[3]) * window)
end
store()
return math.floor(credit / window)
