//! The memory authority's Lua: the ledger script (`lua/ledger.lua`) runs here
//! unchanged, in an embedded Lua 5.1 (the version Redis runs), over a small
//! in-process store that answers the Redis commands the script uses: `TYPE`,
//! `GET`, `DEL`, `HGET`, `HMGET`, `HSET`, `HDEL`, `ZADD`, `ZREM`, `ZSCORE`, `ZRANGE`,
//! `ZRANGEBYSCORE`, `ZREMRANGEBYSCORE` and `PEXPIRE`, with Redis' reply
//! shapes (a missing value is `false`, `TYPE` a status table).
//!
//! A key's values are small (a hash of about twenty short fields, a sorted
//! set of a few expiries per holder), and a process may track a million
//! keys: values are sorted vectors of [`Small`] strings, kept inline up to
//! 22 bytes, found by binary search (docs/benchmarks.md, "Memory per
//! tracked key").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mlua::{Function, Lua, Value, Variadic};

/// A string of at most [`Small::INLINE`] bytes kept inline, else boxed:
/// the ledger's field names and numbers never allocate.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Small {
    Inline { len: u8, buf: [u8; Small::INLINE] },
    Heap(Box<str>),
}

impl Small {
    const INLINE: usize = 22;

    fn new(s: &str) -> Small {
        if s.len() <= Small::INLINE {
            let mut buf = [0u8; Small::INLINE];
            buf[..s.len()].copy_from_slice(s.as_bytes());
            Small::Inline {
                len: s.len() as u8,
                buf,
            }
        } else {
            Small::Heap(s.into())
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Built from a `&str` in `new`: always UTF-8.
            Small::Inline { len, buf } => std::str::from_utf8(&buf[..*len as usize]).unwrap_or_default(),
            Small::Heap(s) => s,
        }
    }
}

impl std::fmt::Debug for Small {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// Room for one more element, growing by an eighth: a key's values stay
/// within an eighth of their size (a doubling `Vec` leaves up to half
/// unused, and a million keys each hold a few).
fn grow<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        v.reserve_exact(v.len() / 8 + 1);
    }
}

/// A hash: (field, value) pairs sorted by field.
#[derive(Clone, Debug, Default)]
struct Fields(Vec<(Small, Small)>);

impl Fields {
    fn find(&self, field: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(f, _)| f.as_str().cmp(field))
    }

    fn get(&self, field: &str) -> Option<&str> {
        self.find(field).ok().map(|i| self.0[i].1.as_str())
    }

    /// Set `field`; true when it is new.
    fn insert(&mut self, field: &str, value: &str) -> bool {
        match self.find(field) {
            Ok(i) => {
                self.0[i].1 = Small::new(value);
                false
            }
            Err(i) => {
                grow(&mut self.0);
                self.0.insert(i, (Small::new(field), Small::new(value)));
                true
            }
        }
    }

    fn remove(&mut self, field: &str) -> bool {
        match self.find(field) {
            Ok(i) => {
                self.0.remove(i);
                true
            }
            Err(_) => false,
        }
    }
}

/// A sorted set: (score, member) pairs sorted as Redis orders them, and the
/// members sorted by name with their scores.
#[derive(Clone, Debug, Default)]
struct ZSet {
    order: Vec<(i64, Small)>,
    by_member: Vec<(Small, i64)>,
}

impl ZSet {
    fn score(&self, member: &str) -> Option<i64> {
        let i = self.by_member.binary_search_by(|(m, _)| m.as_str().cmp(member)).ok()?;
        Some(self.by_member[i].1)
    }

    /// Add or move `member`; true when it is new.
    fn add(&mut self, score: i64, member: &str) -> bool {
        let new = match self.by_member.binary_search_by(|(m, _)| m.as_str().cmp(member)) {
            Ok(i) => {
                let old = std::mem::replace(&mut self.by_member[i].1, score);
                self.remove_order(old, member);
                false
            }
            Err(i) => {
                grow(&mut self.by_member);
                self.by_member.insert(i, (Small::new(member), score));
                true
            }
        };
        let at = self
            .order
            .binary_search_by(|(s, m)| (*s, m.as_str()).cmp(&(score, member)))
            .unwrap_or_else(|at| at);
        grow(&mut self.order);
        self.order.insert(at, (score, Small::new(member)));
        new
    }

    fn remove(&mut self, member: &str) -> bool {
        match self.by_member.binary_search_by(|(m, _)| m.as_str().cmp(member)) {
            Ok(i) => {
                let (_, score) = self.by_member.remove(i);
                self.remove_order(score, member);
                true
            }
            Err(_) => false,
        }
    }

    fn remove_order(&mut self, score: i64, member: &str) {
        if let Ok(at) = self
            .order
            .binary_search_by(|(s, m)| (*s, m.as_str()).cmp(&(score, member)))
        {
            self.order.remove(at);
        }
    }

    fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// One stored value.
#[derive(Clone, Debug)]
enum Val {
    Hash(Fields),
    ZSet(ZSet),
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
            Some(Val::Hash(h)) => Some(
                h.0.iter()
                    .map(|(f, v)| (f.as_str().to_string(), v.as_str().to_string()))
                    .collect(),
            ),
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
                    Some(Val::ZSet(_)) => "zset",
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
                    Some(v) => Reply::Bulk(v.to_string()),
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
                    added += h.insert(&pair[0], &pair[1]) as i64;
                }
                Ok(Reply::Int(added))
            }
            "HDEL" => {
                let n = match self.live(&key) {
                    None => 0,
                    Some(Val::Hash(h)) => args[2..].iter().filter(|f| h.remove(f)).count(),
                    Some(_) => return Err(wrong_type()),
                };
                if matches!(self.live(&key), Some(Val::Hash(h)) if h.0.is_empty()) {
                    self.map.remove(&key);
                }
                Ok(Reply::Int(n as i64))
            }
            "ZADD" => {
                let score = score(&arg(2)?)?;
                let member = arg(3)?;
                Ok(Reply::Int(self.zset_mut(&key)?.add(score, &member) as i64))
            }
            "ZREM" => {
                let mut n = 0;
                if let Some(Val::ZSet(z)) = self.live(&key) {
                    for m in &args[2..] {
                        n += z.remove(m) as i64;
                    }
                    if z.is_empty() {
                        self.map.remove(&key);
                    }
                } else if self.live(&key).is_some() {
                    return Err(wrong_type());
                }
                Ok(Reply::Int(n))
            }
            "ZSCORE" => match self.live(&key) {
                None => Ok(Reply::Nil),
                Some(Val::ZSet(z)) => Ok(match z.score(&arg(2)?) {
                    Some(score) => Reply::Bulk(score.to_string()),
                    None => Reply::Nil,
                }),
                Some(_) => Err(wrong_type()),
            },
            "ZRANGEBYSCORE" | "ZREMRANGEBYSCORE" | "ZRANGE" => {
                let scores = args.iter().any(|a| a.eq_ignore_ascii_case("WITHSCORES"));
                let picked: Vec<(i64, String)> = match self.live(&key) {
                    None => Vec::new(),
                    Some(Val::ZSet(z)) => {
                        let order = &z.order;
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
                                .map(|(s, m)| (*s, m.as_str().to_string()))
                                .collect()
                        } else {
                            let (lo, hi) = (score(&arg(2)?)?, score(&arg(3)?)?);
                            order
                                .iter()
                                .skip_while(|(s, _)| *s < lo)
                                .take_while(|(s, _)| *s <= hi)
                                .map(|(s, m)| (*s, m.as_str().to_string()))
                                .collect()
                        }
                    }
                    Some(_) => return Err(wrong_type()),
                };
                if name == "ZREMRANGEBYSCORE" {
                    if let Some(Val::ZSet(z)) = self.live(&key) {
                        for (_, m) in &picked {
                            z.remove(m);
                        }
                        if z.is_empty() {
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

    fn hash_mut(&mut self, key: &str) -> Result<&mut Fields, String> {
        if self.live(key).is_none() {
            self.map
                .insert(key.to_string(), (Val::Hash(Fields::default()), NO_EXPIRY));
        }
        match self.live(key) {
            Some(Val::Hash(h)) => Ok(h),
            _ => Err(wrong_type()),
        }
    }

    fn zset_mut(&mut self, key: &str) -> Result<&mut ZSet, String> {
        if self.live(key).is_none() {
            self.map
                .insert(key.to_string(), (Val::ZSet(ZSet::default()), NO_EXPIRY));
        }
        match self.live(key) {
            Some(Val::ZSet(z)) => Ok(z),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn run(st: &mut Store, args: &[&str]) -> Reply {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        st.command(&args).unwrap()
    }

    fn bulks(r: Reply) -> Vec<String> {
        match r {
            Reply::Array(items) => items
                .into_iter()
                .map(|i| match i {
                    Reply::Bulk(s) => s,
                    _ => panic!("not a bulk string"),
                })
                .collect(),
            _ => panic!("not an array"),
        }
    }

    #[test]
    fn small_strings_stay_inline_up_to_22_bytes() {
        assert_eq!(std::mem::size_of::<Small>(), 24);
        for s in ["", "c", "1234567890123456789012", "12345678901234567890123", "ünïcødé"] {
            assert_eq!(Small::new(s).as_str(), s);
        }
        assert!(matches!(Small::new(&"x".repeat(22)), Small::Inline { .. }));
        assert!(matches!(Small::new(&"x".repeat(23)), Small::Heap(_)));
    }

    #[test]
    fn hashes_and_sorted_sets_answer_as_redis_does() {
        let mut st = Store::default();
        assert!(matches!(
            run(&mut st, &["HSET", "k", "b", "2", "a", "1"]),
            Reply::Int(2)
        ));
        assert!(matches!(run(&mut st, &["HSET", "k", "a", "9"]), Reply::Int(0)));
        let got = bulks(run(&mut st, &["HMGET", "k", "a", "b"]));
        assert_eq!(got, ["9", "2"]);
        assert!(matches!(run(&mut st, &["HGET", "k", "zz"]), Reply::Nil));
        assert!(matches!(run(&mut st, &["HDEL", "k", "a", "b"]), Reply::Int(2)));
        assert!(matches!(run(&mut st, &["TYPE", "k"]), Reply::Status(s) if s == "none"));
        for (score, m) in [("30", "c1"), ("10", "f1"), ("20", "c2"), ("10", "e1")] {
            run(&mut st, &["ZADD", "z", score, m]);
        }
        assert!(matches!(run(&mut st, &["ZADD", "z", "5", "c2"]), Reply::Int(0)));
        let all = bulks(run(&mut st, &["ZRANGEBYSCORE", "z", "-inf", "+inf", "WITHSCORES"]));
        assert_eq!(all, ["c2", "5", "e1", "10", "f1", "10", "c1", "30"]);
        assert_eq!(bulks(run(&mut st, &["ZRANGE", "z", "-1", "-1"])), ["c1"]);
        assert!(matches!(run(&mut st, &["ZSCORE", "z", "f1"]), Reply::Bulk(s) if s == "10"));
        assert!(matches!(
            run(&mut st, &["ZREMRANGEBYSCORE", "z", "-inf", "10"]),
            Reply::Int(3)
        ));
        assert!(matches!(run(&mut st, &["ZREM", "z", "c1", "nope"]), Reply::Int(1)));
        assert!(matches!(run(&mut st, &["TYPE", "z"]), Reply::Status(s) if s == "none"));
    }
}
