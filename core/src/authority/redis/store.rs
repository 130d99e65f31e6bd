//! The connection's reads and writes outside the lease scripts: the policy
//! store and `inspect`, and the stored bucket format's reader.

use redis::{RedisError, Value};

use super::{err_text, within, Conn, Connection, ScriptCall};
use crate::authority::{PolicyOp, PolicyReply, Stored};
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
        let mut get = redis::cmd("GET");
        get.arg(key);
        let mut pttl = redis::cmd("PTTL");
        pttl.arg(key);
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(key).arg("c").arg("t").arg("w");
        let timeout = self.timeout;
        let conn = match within(timeout, self.connect()).await {
            Ok(conn) => conn?,
            Err(()) => return Err(silence(format_args!("connecting, after {} ms", timeout.as_millis()))),
        };
        let query = async {
            match conn {
                Conn::Single(c) => read_stored(c, key, &get, &hmget, &pttl).await,
                Conn::Cluster(c) => read_stored(c, key, &get, &hmget, &pttl).await,
            }
        };
        let (value, ttl) = match within(timeout, query).await {
            Ok(r) => r.map_err(|e| err_text(&e))?,
            Err(()) => {
                self.conn = None;
                return Err(silence(format_args!("after {} ms", timeout.as_millis())));
            }
        };
        let (c, t, w) = value.as_deref().map_or((None, None, None), parse_stored);
        Ok(Stored {
            tokens: match (c, w) {
                (Some(c), Some(w)) => Some(c / w.max(1)),
                _ => None,
            },
            refilled_at_ms: t,
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

/// What `inspect` reads of a key: its value (a fixed-lease bucket's string,
/// or the ledger's `c t w` read as one) and its time to live.
async fn read_stored<C: redis::aio::ConnectionLike>(
    c: &mut C,
    key: &str,
    get: &redis::Cmd,
    hmget: &redis::Cmd,
    pttl: &redis::Cmd,
) -> Result<(Option<String>, i64), RedisError> {
    let ty: String = redis::cmd("TYPE").arg(key).query_async(c).await?;
    let v: Option<String> = if ty == "hash" {
        let f: Vec<Option<String>> = hmget.query_async(c).await?;
        ledger_value(&f)
    } else {
        get.query_async(c).await?
    };
    let t: i64 = pttl.query_async(c).await?;
    Ok((v, t))
}

/// A ledger state's `c t w` fields as a stored bucket value (debt reads as 0).
fn ledger_value(f: &[Option<String>]) -> Option<String> {
    let n = |i: usize| f.get(i)?.as_deref()?.parse::<i64>().ok();
    Some(format!("{} {} {}", n(0)?.max(0), n(1)?.max(0), n(2)?.max(1)))
}

/// The first fields of a stored bucket value `"c t w e v"` (credit, refilled
/// at, window; None for any that does not parse; epoch and version follow).
/// Public for tools that read Redis themselves (`quotalease inspect`, `top`).
pub fn parse_stored(value: &str) -> (Option<u64>, Option<u64>, Option<u64>) {
    let mut it = value.split(' ').map(|f| f.parse::<u64>().ok());
    let mut next = || it.next().flatten();
    (next(), next(), next())
}
