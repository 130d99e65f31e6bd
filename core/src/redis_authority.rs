//! The Redis authority: one string per key, `{prefix}:{<key>}` (hash-tagged
//! so Redis Cluster keeps the key in one slot), changed only by two Lua
//! scripts that implement [`crate::bucket`]'s math atomically.
//!
//! The stored value is three integers, `"c t w"`: `c` credit units (1/`w`
//! token each), `t` ms up to which refill is accounted, `w` the window the
//! units refer to. A string rather than a hash so that one `SET ... PX`
//! writes the bucket and its expiry: a lease call runs `TIME`, `GET` and `SET`
//! and nothing else. Time is Redis `TIME` (one clock for the fleet) unless the
//! caller passes `now` (manual clocks in deterministic tests). The key's
//! expiry is the time until the bucket is full again: a missing key reads as
//! a full bucket, so idle keys vanish without changing any answer.

use std::time::Duration;

use futures_util::future::join_all;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, RedisError, Script, Value};

use crate::bucket::{Grant, Policy};
use crate::config::BackendSpec;

/// Common head of both scripts: read the bucket, bring it to `now`.
/// ARGV[1] limit, ARGV[2] window_ms, ARGV[5] now_ms or "" for Redis TIME.
const PRELUDE: &str = r#"
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
local credit, ts, w
local v = redis.call('GET', KEYS[1])
if v then
  local c0, t0, w0 = string.match(v, '^(%d+) (%d+) (%d+)$')
  credit, ts, w = tonumber(c0), tonumber(t0), tonumber(w0)
end
if credit == nil or ts == nil or w == nil or w <= 0 then
  credit = cap
  ts = now
  w = window
end
if w ~= window then
  local whole = math.floor(credit / w)
  credit = whole * window + math.floor((credit - whole * w) * window / w)
end
if now > ts then
  local e = now - ts
  if e > window then e = window end
  credit = credit + e * limit
  ts = now
end
if credit > cap then credit = cap end
"#;

/// Common tail: store the bucket with an expiry at the time it is full again.
const STORE: &str = r#"
redis.call('SET', KEYS[1], string.format('%.0f %.0f %.0f', credit, ts, window),
  'PX', string.format('%.0f', math.ceil((cap - credit) / limit) + 1000 + pad))
"#;

/// Lease: ARGV[3] want, ARGV[4] need. Grants min(whole, want) when at least
/// `need` whole tokens are there, else 0. Returns {granted, remaining, wait_ms}.
const LEASE_BODY: &str = r#"
local want = tonumber(ARGV[3])
local need = tonumber(ARGV[4])
if need < 1 then need = 1 end
if need > limit then need = limit end
local avail = math.floor(credit / window)
local granted = 0
if avail >= need then granted = math.min(avail, want) end
credit = credit - granted * window
local wait = 0
if granted == 0 then wait = math.ceil((need * window - credit) / limit) end
"#;
const LEASE_RETURN: &str = "return {granted, math.floor(credit / window), wait}\n";

/// Give back: ARGV[3] tokens. Returns whole tokens remaining.
const GIVE_BACK_BODY: &str = r#"
credit = math.min(cap, credit + tonumber(ARGV[3]) * window)
"#;
const GIVE_BACK_RETURN: &str = "return math.floor(credit / window)\n";

/// A script's text and its SHA1 (for EVALSHA).
#[derive(Clone)]
struct Lua {
    code: String,
    sha: String,
}

impl Lua {
    fn new(parts: &[&str]) -> Self {
        let code = parts.concat();
        let sha = Script::new(&code).get_hash().to_string();
        Lua { code, sha }
    }
}

struct Scripts {
    lease: Lua,
    give_back: Lua,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            lease: Lua::new(&[PRELUDE, LEASE_BODY, STORE, LEASE_RETURN]),
            give_back: Lua::new(&[PRELUDE, GIVE_BACK_BODY, STORE, GIVE_BACK_RETURN]),
        }
    }
}

enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// The stored fields `c`, `t`, `w` (None: no bucket stored) and PTTL.
pub(crate) type RawBucket = (Option<u64>, Option<u64>, Option<u64>, i64);

/// One lease call of a batch.
pub(crate) struct LeaseCall {
    pub key: String,
    pub policy: Policy,
    pub want: u64,
    pub need: u64,
}

/// One give-back call of a batch.
pub(crate) struct GiveBackCall {
    pub key: String,
    pub policy: Policy,
    pub tokens: u64,
}

pub(crate) struct RedisAuthority {
    spec: BackendSpec,
    prefix: String,
    timeout: Duration,
    scripts: Scripts,
    conn: Option<Conn>,
}

fn err_text(e: &RedisError) -> String {
    e.to_string()
}

impl RedisAuthority {
    pub fn new(spec: BackendSpec, prefix: &str, timeout: Duration) -> Self {
        RedisAuthority {
            spec,
            prefix: prefix.to_string(),
            timeout,
            scripts: Scripts::new(),
            conn: None,
        }
    }

    /// Forget the connection (the next call reconnects).
    pub fn reset(&mut self) {
        self.conn = None;
    }

    /// The Redis key of a limiter key.
    pub fn redis_key(prefix: &str, key: &str) -> String {
        format!("{prefix}:{{{key}}}")
    }

    async fn connect(&mut self) -> Result<&mut Conn, String> {
        if self.conn.is_none() {
            // rustls needs a process-wide crypto provider for rediss://.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let conn = match &self.spec {
                BackendSpec::Redis(url) => {
                    let client = redis::Client::open(url.as_str()).map_err(|e| err_text(&e))?;
                    let cfg = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(self.timeout))
                        .set_response_timeout(Some(self.timeout));
                    Conn::Single(
                        client
                            .get_multiplexed_async_connection_with_config(&cfg)
                            .await
                            .map_err(|e| format!("connect: {e}"))?,
                    )
                }
                BackendSpec::Cluster(nodes) => {
                    let client = redis::cluster::ClusterClient::builder(nodes.clone())
                        .connection_timeout(self.timeout)
                        .response_timeout(self.timeout)
                        .retries(1)
                        .build()
                        .map_err(|e| err_text(&e))?;
                    Conn::Cluster(
                        client
                            .get_async_connection()
                            .await
                            .map_err(|e| format!("connect: {e}"))?,
                    )
                }
                BackendSpec::Memory(_) => return Err("not a Redis backend".into()),
            };
            self.conn = Some(conn);
        }
        Ok(self.conn.as_mut().expect("connection was just set"))
    }

    /// Run one script call per index (`build(eval, indices)` makes the
    /// commands): standalone as one pipelined round trip, cluster as
    /// concurrent calls (each routed to its key's slot owner). Results are per
    /// call: only the calls that got NOSCRIPT are sent again, with EVAL (which
    /// also caches the script on that node), so no call ever runs twice.
    /// `Err` means the round trip itself failed (no call's outcome is known).
    async fn run(
        &mut self,
        n: usize,
        build: impl Fn(bool, &[usize]) -> Vec<Cmd>,
    ) -> Result<Vec<Result<Value, String>>, String> {
        let timeout = self.timeout;
        let mut out: Vec<Option<Result<Value, String>>> = (0..n).map(|_| None).collect();
        let mut todo: Vec<usize> = (0..n).collect();
        let mut use_eval = false;
        while !todo.is_empty() {
            let cmds = build(use_eval, &todo);
            // The whole connection set-up is bounded too: a black-holed or
            // paused server must not stall the broker (and every key behind it).
            let conn = match tokio::time::timeout(timeout, self.connect()).await {
                Ok(conn) => conn?,
                Err(_) => {
                    self.conn = None;
                    return Err(format!("connect timed out after {} ms", timeout.as_millis()));
                }
            };
            let fut = async {
                match conn {
                    Conn::Single(c) => {
                        let mut pipe = redis::pipe();
                        pipe.ignore_errors();
                        for cmd in &cmds {
                            pipe.add_command(cmd.clone());
                        }
                        pipe.query_async::<Vec<redis::RedisResult<Value>>>(c).await
                    }
                    Conn::Cluster(c) => {
                        let futs = cmds.iter().map(|cmd| {
                            let mut c = c.clone();
                            async move { c.req_packed_command(cmd).await }
                        });
                        Ok(join_all(futs).await)
                    }
                }
            };
            let replies = match tokio::time::timeout(timeout, fut).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    // Whatever failed (a dropped or half-closed connection
                    // reports itself in several ways, e.g. "broken pipe"),
                    // the next attempt starts from a fresh connection.
                    self.conn = None;
                    return Err(err_text(&e));
                }
                Err(_) => {
                    self.conn = None;
                    return Err(format!("timed out after {} ms", timeout.as_millis()));
                }
            };
            let mut retry = Vec::new();
            for (&idx, reply) in todo.iter().zip(replies) {
                let reply = match reply {
                    Ok(Value::ServerError(e)) => Err(RedisError::from(e)),
                    other => other,
                };
                match reply {
                    Ok(v) => out[idx] = Some(Ok(v)),
                    Err(e) if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript) && !use_eval => {
                        retry.push(idx)
                    }
                    Err(e) => {
                        if !matches!(e.kind(), ErrorKind::Server(_)) {
                            self.conn = None;
                        }
                        out[idx] = Some(Err(err_text(&e)));
                    }
                }
            }
            todo = retry;
            use_eval = true;
        }
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Err("no reply".into())))
            .collect())
    }

    fn script_cmd(script: &Lua, eval: bool, key: &str, args: [u64; 4], now: Option<u64>) -> Cmd {
        let mut cmd = if eval {
            let mut c = redis::cmd("EVAL");
            c.arg(&script.code);
            c
        } else {
            let mut c = redis::cmd("EVALSHA");
            c.arg(&script.sha);
            c
        };
        cmd.arg(1).arg(key).arg(&args[..]);
        match now {
            Some(n) => cmd.arg(n),
            None => cmd.arg(""),
        };
        cmd
    }

    /// One call of `script` per (key, args); per-call results (see [`Self::run`]).
    async fn script_batch(
        &mut self,
        script: &Lua,
        calls: Vec<(String, [u64; 4])>,
        now: Option<u64>,
    ) -> Result<Vec<Result<Value, String>>, String> {
        let prefix = self.prefix.clone();
        self.run(calls.len(), |eval, idx| {
            idx.iter()
                .map(|&i| Self::script_cmd(script, eval, &Self::redis_key(&prefix, &calls[i].0), calls[i].1, now))
                .collect()
        })
        .await
    }

    /// One lease script call per entry; per-call results.
    pub async fn lease_batch(
        &mut self,
        calls: &[LeaseCall],
        now: Option<u64>,
    ) -> Result<Vec<Result<Grant, String>>, String> {
        let script = self.scripts.lease.clone();
        let args = calls
            .iter()
            .map(|c| (c.key.clone(), [c.policy.limit, c.policy.window_ms, c.want, c.need]))
            .collect();
        let replies = self.script_batch(&script, args, now).await?;
        Ok(replies
            .into_iter()
            .map(|r| {
                let (granted, remaining, wait_ms): (u64, u64, u64) =
                    redis::from_redis_value(r?).map_err(|e| format!("unexpected reply from the lease script: {e}"))?;
                Ok(Grant {
                    granted,
                    remaining,
                    wait_ms,
                })
            })
            .collect())
    }

    /// One give-back script call per entry; per-call results.
    pub async fn give_back_batch(
        &mut self,
        calls: &[GiveBackCall],
        now: Option<u64>,
    ) -> Result<Vec<Result<u64, String>>, String> {
        let script = self.scripts.give_back.clone();
        let args = calls
            .iter()
            .map(|c| (c.key.clone(), [c.policy.limit, c.policy.window_ms, c.tokens, 0]))
            .collect();
        let replies = self.script_batch(&script, args, now).await?;
        Ok(replies
            .into_iter()
            .map(|r| {
                redis::from_redis_value(r?).map_err(|e| format!("unexpected reply from the give-back script: {e}"))
            })
            .collect())
    }

    /// The raw stored fields of a key and its PTTL, for `inspect`.
    pub async fn inspect(&mut self, key: &str) -> Result<RawBucket, String> {
        let k = Self::redis_key(&self.prefix, key);
        let mut get = redis::cmd("GET");
        get.arg(&k);
        let mut pttl = redis::cmd("PTTL");
        pttl.arg(&k);
        let conn = match tokio::time::timeout(self.timeout, self.connect()).await {
            Ok(conn) => conn?,
            Err(_) => return Err("connect timed out".into()),
        };
        let (value, ttl): (Option<String>, i64) = match conn {
            Conn::Single(c) => {
                let v = get.query_async(c).await.map_err(|e| err_text(&e))?;
                let t = pttl.query_async(c).await.map_err(|e| err_text(&e))?;
                (v, t)
            }
            Conn::Cluster(c) => {
                let v = get.query_async(c).await.map_err(|e| err_text(&e))?;
                let t = pttl.query_async(c).await.map_err(|e| err_text(&e))?;
                (v, t)
            }
        };
        let (c, t, w) = value.as_deref().map_or((None, None, None), parse_stored);
        Ok((c, t, w, ttl))
    }
}

/// The fields of a stored bucket value `"c t w"` (None for any that does not parse).
pub(crate) fn parse_stored(value: &str) -> (Option<u64>, Option<u64>, Option<u64>) {
    let mut it = value.split(' ').map(|f| f.parse::<u64>().ok());
    let mut next = || it.next().flatten();
    (next(), next(), next())
}

#[cfg(test)]
mod tests {
    use super::parse_stored;

    #[test]
    fn stored_values_parse_field_by_field() {
        assert_eq!(
            parse_stored("120000 1796018722007 60000"),
            (Some(120000), Some(1796018722007), Some(60000))
        );
        assert_eq!(parse_stored("0 5 1000"), (Some(0), Some(5), Some(1000)));
        assert_eq!(parse_stored("garbage"), (None, None, None));
        assert_eq!(parse_stored("1 x 3"), (Some(1), None, Some(3)));
    }
}
