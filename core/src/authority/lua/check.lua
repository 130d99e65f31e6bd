-- check(): a limiter's startup probe. It reads (never writes) one key under
-- the limiter's prefix through the path every lease takes (EVALSHA, then
-- EVAL when the server lacks the script), and asks the server's clock as
-- the lease scripts do, so a user missing a permission of docs/redis.md's
-- ACL rule (a command or the key pattern) is refused here.
redis.call('TIME')
return redis.call('PTTL', KEYS[1])
