//! The connection's reads and writes outside the lease scripts: the policy
//! store and `inspect` (which parses what it reads with `crate::stored`).

use redis::{RedisError, Value};

use super::{err_text, within, Conn, Connection, ScriptCall};
use crate::authority::{PolicyOp, PolicyReply, Stored};
use crate::stored;
use crate::wire::silence;

impl Connection {
    /// One request to the policy store (its keys: `base` + `:tiers`, `:keys`,
    /// `:version`, `:log`; one hash tag, one slot).
    pub(super) async fn policy(&mut self, base: &str, op: PolicyOp) -> Result<PolicyReply, String> {
        let keys: Vec<String> = ["tiers", "keys", "version", "log"]
            .iter()
            .map(|k| format!("{base}:{k}"))
            .collect();
        let bad = |e: redis::ParsingError| format!("unexpected reply from the policy store: {e}");
        let one = |r: Result<Vec<Result<Value, String>>, String>| -> Result<Value, String> {
            r?.into_iter().next().unwrap_or_else(|| Err("no reply".into()))
        };
        match op {
            PolicyOp::Poll { since } => {
                let call = ScriptCall {
                    script: self.scripts.policy_poll.clone(),
                    keys,
                    args: vec![since.to_string()],
                };
                let v = one(self.script_batch(std::slice::from_ref(&call)).await)?;
                let parts: Vec<Value> = redis::from_redis_value(v).map_err(bad)?;
                let mut it = parts.into_iter();
                let mut num = || -> Result<u64, String> {
                    redis::from_redis_value(it.next().ok_or("short reply from the policy store")?).map_err(bad)
                };
                let version = num()?;
                let keys = num()?;
                let tiers: Option<Vec<(String, String)>> = match it.next() {
                    Some(v) => Some(pairs(redis::from_redis_value(v).map_err(bad)?)),
                    None => None,
                };
                let changed = match it.next() {
                    Some(v) => Some(PolicyReply::changed_keys(
                        &redis::from_redis_value::<Vec<String>>(v).map_err(bad)?,
                    )),
                    None => None,
                };
                let changed = if tiers.is_some() { changed } else { Some(Vec::new()) };
                Ok(PolicyReply::Poll {
                    version,
                    keys,
                    tiers,
                    changed,
                })
            }
            PolicyOp::Set { tier, name, value } => {
                let call = ScriptCall {
                    script: self.scripts.policy_write.clone(),
                    keys,
                    args: vec![
                        if tier { "t" } else { "k" }.to_string(),
                        name,
                        value.unwrap_or_default(),
                        crate::authority::POLICY_LOG_LEN.to_string(),
                    ],
                };
                let v = one(self.script_batch(std::slice::from_ref(&call)).await)?;
                Ok(PolicyReply::Version(redis::from_redis_value(v).map_err(bad)?))
            }
            PolicyOp::Get { keys: names } => {
                let mut cmd = redis::cmd("HMGET");
                cmd.arg(&keys[1]);
                for n in &names {
                    cmd.arg(n);
                }
                let v = one(self.run(1, |_, _| vec![cmd.clone()]).await)?;
                Ok(PolicyReply::Values(redis::from_redis_value(v).map_err(bad)?))
            }
            PolicyOp::List => {
                let mut cmds = Vec::new();
                for (c, k) in [("HGETALL", &keys[0]), ("HGETALL", &keys[1]), ("GET", &keys[2])] {
                    let mut cmd = redis::cmd(c);
                    cmd.arg(k);
                    cmds.push(cmd);
                }
                let r = self
                    .run(3, |_, idx| idx.iter().map(|&i| cmds[i].clone()).collect())
                    .await?;
                let mut it = r.into_iter();
                let mut next = || it.next().unwrap_or_else(|| Err("no reply".into()));
                let tiers = pairs(redis::from_redis_value(next()?).map_err(bad)?);
                let keys = pairs(redis::from_redis_value(next()?).map_err(bad)?);
                let version: Option<u64> = redis::from_redis_value(next()?).map_err(bad)?;
                Ok(PolicyReply::List {
                    version: version.unwrap_or(0),
                    tiers,
                    keys,
                })
            }
        }
    }

    /// The stored bucket of a Redis key and its PTTL, for `inspect`.
    pub(super) async fn inspect(&mut self, key: &str) -> Result<Stored, String> {
        let timeout = self.timeout;
        let conn = match within(timeout, self.connect()).await {
            Ok(conn) => conn?,
            Err(()) => return Err(silence(format_args!("connecting, after {} ms", timeout.as_millis()))),
        };
        let query = async {
            match conn {
                Conn::Single(c) => read_stored(c, key).await,
                Conn::Cluster(c) => read_stored(c, key).await,
            }
        };
        let (stored, ttl) = match within(timeout, query).await {
            Ok(r) => r.map_err(|e| err_text(&e))?,
            Err(()) => {
                self.conn = None;
                return Err(silence(format_args!("after {} ms", timeout.as_millis())));
            }
        };
        let bucket = stored.map(|s| s.bucket).unwrap_or_default();
        Ok(Stored {
            tokens: bucket.tokens(),
            refilled_at_ms: bucket.refilled_at,
            ttl_ms: (ttl >= 0).then_some(ttl as u64),
        })
    }
}

/// `HGETALL`'s flat `[name, value, ...]` as pairs, sorted by name.
fn pairs(flat: Vec<String>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = flat.chunks_exact(2).map(|c| (c[0].clone(), c[1].clone())).collect();
    out.sort();
    out
}

/// What `inspect` reads of a key: its stored state (a fixed-lease bucket's
/// string, or the ledger's hash; None when nothing is stored) and its time
/// to live.
async fn read_stored<C: redis::aio::ConnectionLike>(
    c: &mut C,
    key: &str,
) -> Result<(Option<stored::Stored>, i64), RedisError> {
    let ty: String = redis::cmd("TYPE").arg(key).query_async(c).await?;
    let s = if ty == "hash" {
        let fields: Vec<(String, String)> = redis::cmd("HGETALL").arg(key).query_async(c).await?;
        stored::Stored::from_hash(fields)
    } else {
        let v: Option<String> = redis::cmd("GET").arg(key).query_async(c).await?;
        v.as_deref().map(stored::Stored::from_string)
    };
    let t: i64 = redis::cmd("PTTL").arg(key).query_async(c).await?;
    Ok((s, t))
}
