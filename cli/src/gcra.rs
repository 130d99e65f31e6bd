//! A per-request GCRA limiter in Redis: the common design quotalease is
//! measured against. Every request is one `EVALSHA` of a small Lua script
//! that keeps the key's theoretical arrival time (TAT) and reads `TIME` from
//! Redis; the emission interval is window / limit and the burst is the limit,
//! so it admits what a token bucket of `limit` tokens refilled at
//! limit / window admits, with no overshoot.

use redis::{ErrorKind, ServerErrorKind};

/// The script. `KEYS[1]`: the TAT, in microseconds since 2024-01-01 UTC (so
/// that the value keeps sub-microsecond precision in a double).
/// `ARGV[1]` emission interval in microseconds (may be fractional), `ARGV[2]`
/// burst, `ARGV[3]` cost, `ARGV[4]` now in microseconds since the Unix epoch, or
/// "" for Redis `TIME`. Returns `{allowed 0|1, remaining, retry_after_us}`.
pub const SCRIPT: &str = r#"
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local epoch = 1704067200
local now
local pad = 0
if ARGV[4] ~= nil and ARGV[4] ~= '' then
  now = tonumber(ARGV[4]) - epoch * 1000000
  -- a caller's clock is not Redis' clock: keep the key longer
  pad = 600000
else
  local t = redis.call('TIME')
  now = (tonumber(t[1]) - epoch) * 1000000 + tonumber(t[2])
end
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat < now then tat = now end
local new_tat = tat + interval * cost
local allow_at = new_tat - interval * burst
if allow_at > now then
  return {0, 0, math.ceil(allow_at - now)}
end
local ttl = math.ceil((new_tat - now) / 1000)
if ttl < 1 then ttl = 1 end
redis.call('SET', KEYS[1], string.format('%.17g', new_tat), 'PX', ttl + pad)
return {1, math.floor((now - allow_at) / interval), 0}
"#;

/// What one call decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcraDecision {
    /// Admitted.
    pub allowed: bool,
    /// Requests of cost 1 that would be admitted right after this one.
    pub remaining: u64,
    /// When denied: microseconds until this request would be admitted.
    pub retry_after_us: u64,
}

/// The limiter: a policy and the script's SHA1. Connections are the caller's
/// (one per thread in `bench`).
#[derive(Clone, Debug)]
pub struct Gcra {
    sha: String,
    interval: String,
    burst: u64,
}

impl Gcra {
    /// `limit` requests per `window_ms`: emission interval window / limit, burst = limit.
    pub fn new(limit: u64, window_ms: u64) -> Result<Gcra, String> {
        quotalease::validate_policy(limit, window_ms).map_err(crate::explain)?;
        Ok(Gcra {
            sha: redis::Script::new(SCRIPT).get_hash().to_string(),
            interval: format!("{}", window_ms as f64 * 1000.0 / limit as f64),
            burst: limit,
        })
    }

    /// Requests admitted at once from an idle key.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Load the script into Redis (done by `acquire` when Redis lacks it).
    pub fn load(&self, conn: &mut redis::Connection) -> Result<(), String> {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(SCRIPT)
            .query(conn)
            .map_err(|e| format!("SCRIPT LOAD of the GCRA script failed: {e}"))?;
        debug_assert_eq!(sha, self.sha);
        Ok(())
    }

    /// One request of `cost` on the Redis key `key`, timed by Redis `TIME`.
    pub fn acquire(&self, conn: &mut redis::Connection, key: &str, cost: u64) -> Result<GcraDecision, String> {
        self.call(conn, key, cost, None)
    }

    /// Like `acquire`, at a caller-supplied time (microseconds since the Unix
    /// epoch) instead of Redis `TIME`: for deterministic tests.
    pub fn acquire_at(
        &self,
        conn: &mut redis::Connection,
        key: &str,
        cost: u64,
        now_us: u64,
    ) -> Result<GcraDecision, String> {
        self.call(conn, key, cost, Some(now_us))
    }

    fn call(
        &self,
        conn: &mut redis::Connection,
        key: &str,
        cost: u64,
        now_us: Option<u64>,
    ) -> Result<GcraDecision, String> {
        if cost == 0 {
            return Err("cost must be at least 1".into());
        }
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha)
            .arg(1)
            .arg(key)
            .arg(&self.interval)
            .arg(self.burst)
            .arg(cost);
        match now_us {
            Some(t) => cmd.arg(t),
            None => cmd.arg(""),
        };
        let reply: Result<(u8, u64, u64), _> = cmd.query(conn);
        let (allowed, remaining, retry_after_us) = match reply {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.load(conn)?;
                cmd.query(conn)
                    .map_err(|e| format!("the GCRA script failed after loading it: {e}"))?
            }
            other => other.map_err(|e| format!("the GCRA script failed: {e}"))?,
        };
        Ok(GcraDecision {
            allowed: allowed == 1,
            remaining,
            retry_after_us,
        })
    }
}
