//! The memory authority's Lua: the ledger script (`lua/ledger.lua`) runs here
//! unchanged, in an embedded Lua 5.1 (the version Redis runs), over a small
//! in-process store that answers the Redis commands the script uses: `TYPE`,
//! `GET`, `DEL`, `HGET`, `HMGET`, `HSET`, `HDEL`, `ZADD`, `ZREM`, `ZSCORE`, `ZRANGE`,
//! `ZRANGEBYSCORE`, `ZREMRANGEBYSCORE` and `PEXPIRE`, with Redis' reply
//! shapes (a missing value is `false`, `TYPE` a status table).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use mlua::{Function, Lua, Value, Variadic};

/// One stored value.
#[derive(Clone, Debug)]
enum Val {
    Hash(HashMap<String, String>),
    ZSet {
        by_member: HashMap<String, i64>,
        order: BTreeSet<(i64, String)>,
    },
}

/// What the embedded scripts see as Redis: values with their expiry.
#[derive(Clone, Debug, Default)]
pub struct Store {
    map: HashMap<String, (Val, u64)>,
    /// The clock reading of the running call (expiries count from it).
    now: u64,
}

const NO_EXPIRY: u64 = u64::MAX;

impl Store {
    fn live(&mut self, key: &str) -> Option<&mut Val> {
        let now = self.now;
        if self.map.get(key).is_some_and(|(_, until)| *until <= now) {
            self.map.remove(key);
        }
        self.map.get_mut(key).map(|(v, _)| v)
    }

    /// Drop every expired value (now and then, as Redis' active expiry does).
    pub fn sweep(&mut self, now: u64) {
        self.map.retain(|_, (_, until)| *until > now);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    #[cfg(feature = "test-util")]
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// A hash's fields (for `inspect`), if `key` holds a live hash.
    pub fn hash(&mut self, key: &str, now: u64) -> Option<HashMap<String, String>> {
        self.now = now;
        match self.live(key) {
            Some(Val::Hash(h)) => Some(h.clone()),
            _ => None,
        }
    }

    fn command(&mut self, args: &[String]) -> Result<Reply, String> {
        let name = args.first().map(|s| s.to_ascii_uppercase()).unwrap_or_default();
        let key = args.get(1).cloned().unwrap_or_default();
        let arg = |i: usize| args.get(i).cloned().ok_or_else(|| format!("{name}: missing argument"));
        match name.as_str() {
            "TYPE" => Ok(Reply::Status(
                match self.live(&key) {
                    None => "none",
                    Some(Val::Hash(_)) => "hash",
                    Some(Val::ZSet { .. }) => "zset",
                }
                .into(),
            )),
            "GET" => match self.live(&key) {
                None => Ok(Reply::Nil),
                Some(_) => Err(wrong_type()),
            },
            "DEL" => Ok(Reply::Int(self.map.remove(&key).is_some() as i64)),
            "PEXPIRE" => {
                let ms: u64 = arg(2)?.parse().map_err(|_| "PEXPIRE: not an integer".to_string())?;
                let until = self.now.saturating_add(ms);
                Ok(Reply::Int(match self.map.get_mut(&key) {
                    Some((_, u)) => {
                        *u = until;
                        1
                    }
                    None => 0,
                }))
            }
            "HGET" | "HMGET" => {
                let fields = &args[2..];
                let h = match self.live(&key) {
                    None => None,
                    Some(Val::Hash(h)) => Some(h),
                    Some(_) => return Err(wrong_type()),
                };
                let get = |f: &String| match h.as_ref().and_then(|h| h.get(f)) {
                    Some(v) => Reply::Bulk(v.clone()),
                    None => Reply::Nil,
                };
                if name == "HGET" {
                    Ok(get(&arg(2)?))
                } else {
                    Ok(Reply::Array(fields.iter().map(get).collect()))
                }
            }
            "HSET" => {
                if args.len() < 4 || args.len() % 2 != 0 {
                    return Err("HSET: wrong number of arguments".into());
                }
                let h = self.hash_mut(&key)?;
                let mut added = 0;
                for pair in args[2..].chunks(2) {
                    added += h.insert(pair[0].clone(), pair[1].clone()).is_none() as i64;
                }
                Ok(Reply::Int(added))
            }
            "HDEL" => {
                let n = match self.live(&key) {
                    None => 0,
                    Some(Val::Hash(h)) => args[2..].iter().filter(|f| h.remove(*f).is_some()).count(),
                    Some(_) => return Err(wrong_type()),
                };
                if matches!(self.live(&key), Some(Val::Hash(h)) if h.is_empty()) {
                    self.map.remove(&key);
                }
                Ok(Reply::Int(n as i64))
            }
            "ZADD" => {
                let score = score(&arg(2)?)?;
                let member = arg(3)?;
                let (by_member, order) = self.zset_mut(&key)?;
                let new = match by_member.insert(member.clone(), score) {
                    Some(old) => {
                        order.remove(&(old, member.clone()));
                        0
                    }
                    None => 1,
                };
                order.insert((score, member));
                Ok(Reply::Int(new))
            }
            "ZREM" => {
                let mut n = 0;
                if let Some(Val::ZSet { by_member, order }) = self.live(&key) {
                    for m in &args[2..] {
                        if let Some(score) = by_member.remove(m) {
                            order.remove(&(score, m.clone()));
                            n += 1;
                        }
                    }
                    if order.is_empty() {
                        self.map.remove(&key);
                    }
                } else if self.live(&key).is_some() {
                    return Err(wrong_type());
                }
                Ok(Reply::Int(n))
            }
            "ZSCORE" => match self.live(&key) {
                None => Ok(Reply::Nil),
                Some(Val::ZSet { by_member, .. }) => Ok(match by_member.get(&arg(2)?) {
                    Some(score) => Reply::Bulk(score.to_string()),
                    None => Reply::Nil,
                }),
                Some(_) => Err(wrong_type()),
            },
            "ZRANGEBYSCORE" | "ZREMRANGEBYSCORE" | "ZRANGE" => {
                let scores = args.iter().any(|a| a.eq_ignore_ascii_case("WITHSCORES"));
                let picked: Vec<(i64, String)> = match self.live(&key) {
                    None => Vec::new(),
                    Some(Val::ZSet { order, .. }) => {
                        if name == "ZRANGE" {
                            let n = order.len() as i64;
                            let at = |s: String| -> Result<i64, String> {
                                let i: i64 = s.parse().map_err(|_| "ZRANGE: not an integer".to_string())?;
                                Ok(if i < 0 { n + i } else { i })
                            };
                            let (a, b) = (at(arg(2)?)?.max(0), at(arg(3)?)?.min(n - 1));
                            order
                                .iter()
                                .skip(a as usize)
                                .take((b - a + 1).max(0) as usize)
                                .cloned()
                                .collect()
                        } else {
                            let (lo, hi) = (score(&arg(2)?)?, score(&arg(3)?)?);
                            order.iter().filter(|(s, _)| *s >= lo && *s <= hi).cloned().collect()
                        }
                    }
                    Some(_) => return Err(wrong_type()),
                };
                if name == "ZREMRANGEBYSCORE" {
                    if let Some(Val::ZSet { by_member, order }) = self.live(&key) {
                        for (s, m) in &picked {
                            order.remove(&(*s, m.clone()));
                            by_member.remove(m);
                        }
                        if order.is_empty() {
                            self.map.remove(&key);
                        }
                    }
                    return Ok(Reply::Int(picked.len() as i64));
                }
                let mut out = Vec::new();
                for (s, m) in picked {
                    out.push(Reply::Bulk(m));
                    if scores {
                        out.push(Reply::Bulk(s.to_string()));
                    }
                }
                Ok(Reply::Array(out))
            }
            other => Err(format!("ERR unknown command '{other}' in the embedded authority")),
        }
    }

    fn hash_mut(&mut self, key: &str) -> Result<&mut HashMap<String, String>, String> {
        if self.live(key).is_none() {
            self.map.insert(key.to_string(), (Val::Hash(HashMap::new()), NO_EXPIRY));
        }
        match self.live(key) {
            Some(Val::Hash(h)) => Ok(h),
            _ => Err(wrong_type()),
        }
    }

    #[allow(clippy::type_complexity)]
    fn zset_mut(&mut self, key: &str) -> Result<(&mut HashMap<String, i64>, &mut BTreeSet<(i64, String)>), String> {
        if self.live(key).is_none() {
            let z = Val::ZSet {
                by_member: HashMap::new(),
                order: BTreeSet::new(),
            };
            self.map.insert(key.to_string(), (z, NO_EXPIRY));
        }
        match self.live(key) {
            Some(Val::ZSet { by_member, order }) => Ok((by_member, order)),
            _ => Err(wrong_type()),
        }
    }
}

fn wrong_type() -> String {
    "WRONGTYPE Operation against a key holding the wrong kind of value".into()
}

fn score(s: &str) -> Result<i64, String> {
    match s {
        "-inf" => Ok(i64::MIN),
        "+inf" | "inf" => Ok(i64::MAX),
        _ => s
            .parse::<f64>()
            .map(|f| f as i64)
            .map_err(|_| format!("ERR min or max is not a float: {s}")),
    }
}

enum Reply {
    Nil,
    Int(i64),
    Bulk(String),
    Status(String),
    Array(Vec<Reply>),
}

impl Reply {
    fn into_lua(self, lua: &Lua) -> mlua::Result<Value> {
        Ok(match self {
            Reply::Nil => Value::Boolean(false),
            Reply::Int(i) => Value::Number(i as f64),
            Reply::Bulk(s) => Value::String(lua.create_string(&s)?),
            Reply::Status(s) => {
                let t = lua.create_table()?;
                t.set("ok", s)?;
                Value::Table(t)
            }
            Reply::Array(items) => {
                let t = lua.create_table()?;
                for (i, r) in items.into_iter().enumerate() {
                    t.set(i + 1, r.into_lua(lua)?)?;
                }
                Value::Table(t)
            }
        })
    }
}

/// Text of a Lua argument as Redis takes it (numbers as Lua prints them).
fn text(v: &Value) -> mlua::Result<String> {
    match v {
        Value::String(s) => Ok(s.to_str()?.to_string()),
        Value::Integer(i) => Ok(i.to_string()),
        Value::Number(n) if n.fract() == 0.0 && n.abs() < 1e14 => Ok(format!("{}", *n as i64)),
        Value::Number(n) => Ok(format!("{n}")),
        other => Err(mlua::Error::runtime(format!(
            "Lua redis lib command arguments must be strings or integers (got {})",
            other.type_name()
        ))),
    }
}

/// An embedded Lua with the ledger script loaded, over one [`Store`].
pub struct Host {
    lua: Lua,
    script: Function,
    pub store: Arc<Mutex<Store>>,
}

fn lock(m: &Mutex<Store>) -> std::sync::MutexGuard<'_, Store> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Host {
    pub fn new(code: &str) -> Self {
        Self::build(code).expect("the embedded ledger script loads")
    }

    fn build(code: &str) -> mlua::Result<Self> {
        let lua = Lua::new();
        let store = Arc::new(Mutex::new(Store::default()));
        let st = store.clone();
        let call = lua.create_function(move |lua, args: Variadic<Value>| {
            let args: Vec<String> = args.iter().map(text).collect::<mlua::Result<_>>()?;
            let reply = lock(&st).command(&args).map_err(mlua::Error::runtime)?;
            reply.into_lua(lua)
        })?;
        let redis = lua.create_table()?;
        redis.set("call", call)?;
        lua.globals().set("redis", redis)?;
        let script = lua.load(code).set_name("ledger.lua").into_function()?;
        Ok(Host { lua, script, store })
    }

    /// Run the script as `EVAL` would, at clock reading `now`; the reply's
    /// numbers (a table's, or a single one), truncated as Redis does.
    pub fn eval(&self, keys: &[String], argv: &[String], now: u64) -> Result<Vec<i64>, String> {
        lock(&self.store).now = now;
        let run = || -> mlua::Result<Value> {
            let g = self.lua.globals();
            g.set("KEYS", self.lua.create_sequence_from(keys.iter().map(String::as_str))?)?;
            g.set("ARGV", self.lua.create_sequence_from(argv.iter().map(String::as_str))?)?;
            self.script.call::<Value>(())
        };
        let v = run().map_err(|e| e.to_string())?;
        let num = |v: &Value| match v {
            Value::Integer(i) => Some(*i),
            Value::Number(n) => Some(*n as i64),
            _ => None,
        };
        match &v {
            Value::Table(t) => t
                .clone()
                .sequence_values::<Value>()
                .map(|x| {
                    x.ok()
                        .and_then(|x| num(&x))
                        .ok_or_else(|| "a non-number in the reply".to_string())
                })
                .collect(),
            other => num(other)
                .map(|n| vec![n])
                .ok_or_else(|| format!("unexpected reply: {other:?}")),
        }
    }
}
