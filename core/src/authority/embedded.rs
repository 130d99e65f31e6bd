//! The memory authority's Lua: the ledger script (`lua/ledger.lua`) runs here
//! unchanged, in an embedded Lua 5.1 (the version Redis runs), over a small
//! in-process store that answers the Redis commands the script uses: `TYPE`,
//! `GET`, `DEL`, `HGET`, `HMGET`, `HSET`, `HDEL`, `ZADD`, `ZREM`, `ZSCORE`, `ZRANGE`,
//! `ZRANGEBYSCORE`, `ZREMRANGEBYSCORE` and `PEXPIRE`, with Redis' reply
//! shapes (a missing value is `false`, `TYPE` a status table).
//!
//! A key's values are small (a hash of about twenty short fields, a sorted
//! set of a few expiries per holder), and a process may track a million
//! keys: as Redis' own listpack encoding does, a value of at most
//! [`Pack::MAX`] entries is packed into one byte buffer and scanned, a
//! larger one kept in ordered maps (docs/benchmarks.md, "Memory per
//! tracked key").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use mlua::{Function, Lua, Value, Variadic};

/// Entries `[len a][a][len b][b]` in one buffer, each part at most 255
/// bytes. Which order the entries keep is the caller's.
#[derive(Clone, Debug, Default)]
struct Pack(Vec<u8>);

/// One entry of a [`Pack`]: its bytes in the buffer and its two parts.
struct Packed<'a> {
    at: Range<usize>,
    a: &'a [u8],
    b: &'a [u8],
}

impl Pack {
    /// The most entries kept packed. Not tuned by a benchmark: half of
    /// Redis' own default (128), and above what a key of a few holders
    /// holds (about 20 fields and 2 per holder in the hash, 2-4 members per
    /// holder in the sorted set), so that only a key of many holders moves
    /// into the maps; a scan of 64 entries of about 30 bytes reads 2 KB.
    const MAX: usize = 64;

    fn fits(a: &[u8], b: &[u8]) -> bool {
        a.len() <= 255 && b.len() <= 255
    }

    fn entries(&self) -> impl Iterator<Item = Packed<'_>> {
        let buf = &self.0[..];
        let mut at = 0;
        std::iter::from_fn(move || {
            let start = at;
            let al = *buf.get(start)? as usize;
            let bl = buf[start + 1 + al] as usize;
            at = start + 2 + al + bl;
            Some(Packed {
                at: start..at,
                a: &buf[start + 1..start + 1 + al],
                b: &buf[start + 2 + al..at],
            })
        })
    }

    fn find(&self, a: &[u8]) -> Option<Packed<'_>> {
        self.entries().find(|e| e.a == a)
    }

    /// Replace the bytes `at` with the entry (a, b) (`at` empty: insert),
    /// growing by an eighth: a doubling buffer leaves up to half unused,
    /// and a million keys each hold a few.
    fn put(&mut self, at: Range<usize>, a: &[u8], b: &[u8]) {
        let len = self.0.len() - at.len() + 2 + a.len() + b.len();
        if len > self.0.capacity() {
            self.0.reserve_exact(len - self.0.len() + self.0.len() / 8);
        }
        let entry = std::iter::once(a.len() as u8)
            .chain(a.iter().copied())
            .chain(std::iter::once(b.len() as u8))
            .chain(b.iter().copied());
        self.0.splice(at, entry);
    }

    fn cut(&mut self, at: Range<usize>) {
        self.0.drain(at);
    }
}

/// Text stored from a `&str`: always UTF-8.
fn utf8(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap_or_default()
}

/// A hash: packed in no order while small, else a map.
#[derive(Clone, Debug)]
enum Fields {
    Packed(Pack),
    Map(BTreeMap<String, String>),
}

impl Default for Fields {
    fn default() -> Self {
        Fields::Packed(Pack::default())
    }
}

impl Fields {
    fn get(&self, field: &str) -> Option<&str> {
        match self {
            Fields::Packed(p) => p.find(field.as_bytes()).map(|e| utf8(e.b)),
            Fields::Map(m) => m.get(field).map(String::as_str),
        }
    }

    /// Set `field`; true when it is new.
    fn insert(&mut self, field: &str, value: &str) -> bool {
        if let Fields::Packed(p) = self {
            let (f, v) = (field.as_bytes(), value.as_bytes());
            match p.find(f).map(|e| e.at) {
                Some(at) if Pack::fits(f, v) => {
                    p.put(at, f, v);
                    return false;
                }
                None if Pack::fits(f, v) && p.entries().count() < Pack::MAX => {
                    let end = p.0.len();
                    p.put(end..end, f, v);
                    return true;
                }
                _ => *self = Fields::Map(self.pairs().collect()),
            }
        }
        match self {
            Fields::Map(m) => m.insert(field.into(), value.into()).is_none(),
            Fields::Packed(_) => unreachable!("converted above"),
        }
    }

    fn remove(&mut self, field: &str) -> bool {
        match self {
            Fields::Packed(p) => match p.find(field.as_bytes()).map(|e| e.at) {
                Some(at) => {
                    p.cut(at);
                    true
                }
                None => false,
            },
            Fields::Map(m) => m.remove(field).is_some(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Fields::Packed(p) => p.0.is_empty(),
            Fields::Map(m) => m.is_empty(),
        }
    }

    fn pairs(&self) -> Box<dyn Iterator<Item = (String, String)> + '_> {
        match self {
            Fields::Packed(p) => Box::new(p.entries().map(|e| (utf8(e.a).into(), utf8(e.b).into()))),
            Fields::Map(m) => Box::new(m.iter().map(|(f, v)| (f.clone(), v.clone()))),
        }
    }
}

/// A score as 8 bytes whose byte order is the numbers' order.
fn score_bytes(score: i64) -> [u8; 8] {
    ((score as u64) ^ (1 << 63)).to_be_bytes()
}

fn score_of(b: &[u8]) -> i64 {
    let mut s = [0u8; 8];
    s.copy_from_slice(&b[..8]);
    (u64::from_be_bytes(s) ^ (1 << 63)) as i64
}

/// A sorted set in Redis' order (score, then member): while small, packed
/// entries whose first part is the score's bytes and the member; else an
/// ordered set with the members' scores beside it.
#[derive(Clone, Debug)]
enum ZSet {
    Packed(Pack),
    Map(Box<Ranked>),
}

/// A large sorted set: (score, member) in order, and each member's score.
type Ranked = (BTreeSet<(i64, String)>, HashMap<String, i64>);

impl Default for ZSet {
    fn default() -> Self {
        ZSet::Packed(Pack::default())
    }
}

impl ZSet {
    fn find(p: &Pack, member: &str) -> Option<Range<usize>> {
        p.entries().find(|e| &e.a[8..] == member.as_bytes()).map(|e| e.at)
    }

    fn score(&self, member: &str) -> Option<i64> {
        match self {
            ZSet::Packed(p) => p
                .entries()
                .find(|e| &e.a[8..] == member.as_bytes())
                .map(|e| score_of(e.a)),
            ZSet::Map(m) => m.1.get(member).copied(),
        }
    }

    /// Add or move `member`; true when it is new.
    fn add(&mut self, score: i64, member: &str) -> bool {
        let new = !self.remove(member);
        if let ZSet::Packed(p) = self {
            let mut a = score_bytes(score).to_vec();
            a.extend_from_slice(member.as_bytes());
            if Pack::fits(&a, b"") && p.entries().count() < Pack::MAX {
                let at = p.entries().find(|e| e.a > &a[..]).map_or(p.0.len(), |e| e.at.start);
                p.put(at..at, &a, b"");
                return new;
            }
            *self = ZSet::Map(Box::new((
                self.items().map(|(s, m)| (s, m.to_string())).collect(),
                self.items().map(|(s, m)| (m.to_string(), s)).collect(),
            )));
        }
        if let ZSet::Map(m) = self {
            m.0.insert((score, member.into()));
            m.1.insert(member.into(), score);
        }
        new
    }

    fn remove(&mut self, member: &str) -> bool {
        match self {
            ZSet::Packed(p) => match ZSet::find(p, member) {
                Some(at) => {
                    p.cut(at);
                    true
                }
                None => false,
            },
            ZSet::Map(m) => match m.1.remove(member) {
                Some(score) => m.0.remove(&(score, member.to_string())),
                None => false,
            },
        }
    }

    /// (score, member) in Redis' order.
    fn items(&self) -> Box<dyn Iterator<Item = (i64, &str)> + '_> {
        match self {
            ZSet::Packed(p) => Box::new(p.entries().map(|e| (score_of(e.a), utf8(&e.a[8..])))),
            ZSet::Map(m) => Box::new(m.0.iter().map(|(s, m)| (*s, m.as_str()))),
        }
    }

    fn len(&self) -> usize {
        match self {
            ZSet::Packed(p) => p.entries().count(),
            ZSet::Map(m) => m.1.len(),
        }
    }

    /// The members ranked `a..=b` (from 0, in Redis' order).
    fn by_rank(&self, a: usize, b: usize) -> Vec<(i64, String)> {
        let n = self.len();
        if a > b || a >= n {
            return Vec::new();
        }
        let own = |(s, m): (i64, &str)| (s, m.to_string());
        match self {
            // the script asks for the last member: walk from that end
            ZSet::Map(m) if a >= n / 2 => {
                let mut v: Vec<_> =
                    m.0.iter()
                        .rev()
                        .skip(n - 1 - b.min(n - 1))
                        .take(b - a + 1)
                        .map(|(s, m)| (*s, m.clone()))
                        .collect();
                v.reverse();
                v
            }
            _ => self.items().skip(a).take(b - a + 1).map(own).collect(),
        }
    }

    /// The members scored `lo..=hi`, in Redis' order.
    fn by_score(&self, lo: i64, hi: i64) -> Vec<(i64, String)> {
        let own = |(s, m): (i64, &str)| (s, m.to_string());
        match self {
            ZSet::Map(m) => {
                m.0.range((lo, String::new())..)
                    .take_while(|(s, _)| *s <= hi)
                    .map(|(s, m)| (*s, m.clone()))
                    .collect()
            }
            ZSet::Packed(_) => self
                .items()
                .skip_while(|(s, _)| *s < lo)
                .take_while(|(s, _)| *s <= hi)
                .map(own)
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            ZSet::Packed(p) => p.0.is_empty(),
            ZSet::Map(m) => m.1.is_empty(),
        }
    }
}

/// One stored value (`None`: the key holds none).
#[derive(Clone, Debug, Default)]
enum Val {
    #[default]
    None,
    Hash(Fields),
    ZSet(ZSet),
}

/// The suffixes of a key's companions (`ledger::keys`: the state hash `K`,
/// its sorted set of expiries `K:x`, its line `K:w`). A key and its
/// companions share one slot of the store's map, so a tracked key costs one
/// slot and one copy of its name where it cost one per value
/// (docs/benchmarks.md, "Memory per tracked key"). Any other key has a slot
/// of its own; `a:x` is part 1 of `a` whether or not `a` holds a value.
const PARTS: [&str; 3] = ["", ":x", ":w"];

/// A key's slot (its name without the suffix) and part (index in [`PARTS`]).
fn split(key: &str) -> (&str, usize) {
    PARTS
        .iter()
        .enumerate()
        .skip(1)
        .find_map(|(i, s)| key.strip_suffix(s).map(|base| (base, i)))
        .unwrap_or((key, 0))
}

/// A slot's values with their expiries, up to the last part that holds one.
type Parts = Box<[(Val, u64)]>;

/// What the embedded scripts see as Redis: values with their expiry.
#[derive(Clone, Debug, Default)]
pub struct Store {
    map: HashMap<Box<str>, Parts>,
    /// The clock reading of the running call (expiries count from it).
    now: u64,
}

const NO_EXPIRY: u64 = u64::MAX;

impl Store {
    fn live(&mut self, key: &str) -> Option<&mut Val> {
        let now = self.now;
        let (base, i) = split(key);
        if self.map.get(base)?.get(i).is_some_and(|(_, until)| *until <= now) {
            // (and the slot with it when no other part holds a value)
            self.remove(key);
            return None;
        }
        match self.map.get_mut(base)?.get_mut(i)? {
            (Val::None, _) => None,
            (v, _) => Some(v),
        }
    }

    /// `key`'s expiry, if it holds a value.
    fn until_mut(&mut self, key: &str) -> Option<&mut u64> {
        let (base, i) = split(key);
        match self.map.get_mut(base)?.get_mut(i)? {
            (Val::None, _) => None,
            (_, until) => Some(until),
        }
    }

    /// Store `val` at `key`, with no expiry.
    fn put(&mut self, key: &str, val: Val) {
        let (base, i) = split(key);
        if !self.map.contains_key(base) {
            self.map.insert(base.into(), Parts::default());
        }
        let parts = self.map.get_mut(base).expect("inserted above");
        if parts.len() <= i {
            let mut grown = std::mem::take(parts).into_vec();
            grown.resize_with(i + 1, || (Val::None, NO_EXPIRY));
            *parts = grown.into_boxed_slice();
        }
        parts[i] = (val, NO_EXPIRY);
    }

    /// Drop `key`'s value; true when it held one (expired or not).
    fn remove(&mut self, key: &str) -> bool {
        let (base, i) = split(key);
        let Some(parts) = self.map.get_mut(base) else {
            return false;
        };
        let had = parts
            .get_mut(i)
            .is_some_and(|(v, _)| !matches!(std::mem::take(v), Val::None));
        if parts.iter().all(|(v, _)| matches!(v, Val::None)) {
            self.map.remove(base);
        }
        had
    }

    /// Drop every expired value (now and then, as Redis' active expiry does).
    pub fn sweep(&mut self, now: u64) {
        self.map.retain(|_, parts| {
            for (v, until) in parts.iter_mut() {
                if *until <= now {
                    *v = Val::None;
                }
            }
            parts.iter().any(|(v, _)| !matches!(v, Val::None))
        });
    }

    /// Slots in use: keys with their companions counted once.
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
            Some(Val::Hash(h)) => Some(h.pairs().collect()),
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
                    Some(Val::None) => "none", // live() returns none of these
                }
                .into(),
            )),
            "GET" => match self.live(&key) {
                None => Ok(Reply::Nil),
                Some(_) => Err(wrong_type()),
            },
            "DEL" => {
                let held = self.live(&key).is_some();
                self.remove(&key);
                Ok(Reply::Int(held as i64))
            }
            "PEXPIRE" => {
                let ms: u64 = arg(2)?.parse().map_err(|_| "PEXPIRE: not an integer".to_string())?;
                let until = self.now.saturating_add(ms);
                self.live(&key);
                Ok(Reply::Int(match self.until_mut(&key) {
                    Some(u) => {
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
                if matches!(self.live(&key), Some(Val::Hash(h)) if h.is_empty()) {
                    self.remove(&key);
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
                        self.remove(&key);
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
                        if name == "ZRANGE" {
                            let n = z.len() as i64;
                            let at = |s: String| -> Result<i64, String> {
                                let i: i64 = s.parse().map_err(|_| "ZRANGE: not an integer".to_string())?;
                                Ok(if i < 0 { n + i } else { i })
                            };
                            let (a, b) = (at(arg(2)?)?.max(0), at(arg(3)?)?.min(n - 1));
                            if b < a {
                                Vec::new()
                            } else {
                                z.by_rank(a as usize, b as usize)
                            }
                        } else {
                            z.by_score(score(&arg(2)?)?, score(&arg(3)?)?)
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
                            self.remove(&key);
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
            self.put(key, Val::Hash(Fields::default()));
        }
        match self.live(key) {
            Some(Val::Hash(h)) => Ok(h),
            _ => Err(wrong_type()),
        }
    }

    fn zset_mut(&mut self, key: &str) -> Result<&mut ZSet, String> {
        if self.live(key).is_none() {
            self.put(key, Val::ZSet(ZSet::default()));
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

    /// Every command the ledger script calls is one this store answers: a
    /// command it lacks fails every call of the memory authority, which
    /// limiters then read as an outage (their failure policy decides).
    #[test]
    fn the_store_answers_every_command_the_ledger_calls() {
        let script = crate::ledger::SCRIPT;
        let names: std::collections::BTreeSet<&str> = script
            .split("redis.call('")
            .skip(1)
            .filter_map(|rest| rest.split('\'').next())
            // (TIME only when the caller sends no clock; this authority always does)
            .filter(|name| *name != "TIME")
            .collect();
        assert!(names.len() >= 10, "commands found in ledger.lua: {names:?}");
        for name in names {
            let mut st = Store::default();
            let args: Vec<String> = [name, "k", "1", "2", "3"].iter().map(|a| a.to_string()).collect();
            if let Err(e) = st.command(&args) {
                assert!(!e.contains("unknown command"), "ledger.lua calls {name}: {e}");
            }
        }
    }

    /// A key and its companions (`K:x`, `K:w`) take one slot of the map
    /// and one copy of the name, yet stay values of their own: their own
    /// type, expiry and deletion (the differential test below compares them
    /// with redis-server too).
    #[test]
    fn a_key_and_its_companions_share_one_slot() {
        let mut st = Store::default();
        run(&mut st, &["HSET", "user:1", "t", "5"]);
        run(&mut st, &["ZADD", "user:1:x", "9", "c1"]);
        assert_eq!(st.len(), 1, "K and K:x in one slot");
        run(&mut st, &["ZADD", "user:1:w", "3", "w1"]);
        run(&mut st, &["HSET", "user:2", "t", "5"]);
        assert_eq!(st.len(), 2);
        // K:x expires on its own; K lives on
        assert!(matches!(run(&mut st, &["PEXPIRE", "user:1:x", "10"]), Reply::Int(1)));
        st.now = 10;
        assert!(matches!(run(&mut st, &["TYPE", "user:1:x"]), Reply::Status(t) if t == "none"));
        assert!(matches!(run(&mut st, &["TYPE", "user:1"]), Reply::Status(t) if t == "hash"));
        assert!(matches!(run(&mut st, &["PEXPIRE", "user:1:x", "10"]), Reply::Int(0)));
        // a slot whose every part expired leaves the map when read
        run(&mut st, &["HSET", "user:3", "t", "5"]);
        run(&mut st, &["PEXPIRE", "user:3", "1"]);
        assert_eq!(st.len(), 3);
        st.now = 12;
        assert!(matches!(run(&mut st, &["HGET", "user:3", "t"]), Reply::Nil));
        assert_eq!(st.len(), 2);
        // deleting K leaves K:w; deleting that too frees the slot
        assert!(matches!(run(&mut st, &["DEL", "user:1"]), Reply::Int(1)));
        assert!(matches!(run(&mut st, &["TYPE", "user:1:w"]), Reply::Status(t) if t == "zset"));
        assert_eq!(st.len(), 2);
        assert!(matches!(run(&mut st, &["ZREM", "user:1:w", "w1"]), Reply::Int(1)));
        assert_eq!(st.len(), 1, "an emptied slot leaves the map");
        // the sweep drops what expired and the slots left empty
        run(&mut st, &["PEXPIRE", "user:2", "5"]);
        st.sweep(20);
        assert_eq!(st.len(), 0);
    }

    /// Seeded pseudo-random numbers (xorshift): `next(n)` is below `n`.
    fn numbers(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    /// Random operations on a hash and a sorted set, through the packed
    /// encoding and past it into the maps (more than `Pack::MAX` entries,
    /// parts over 255 bytes), answer as a plain model does.
    #[test]
    fn packed_and_map_encodings_answer_alike() {
        let mut next = numbers(0x2545_f491_4f6c_dd1d);
        for round in 0..40 {
            let (mut h, mut hm) = (Fields::default(), BTreeMap::<String, String>::new());
            let (mut z, mut zm) = (ZSet::default(), BTreeMap::<String, i64>::new());
            let names = if round % 2 == 0 { 40 } else { 150 };
            for _ in 0..600 {
                let name = format!("m{}", next(names));
                let long = next(50) == 0 && round % 4 == 1;
                let value = if long {
                    "v".repeat(300)
                } else {
                    next(1_000_000).to_string()
                };
                match next(4) {
                    0 | 1 => assert_eq!(h.insert(&name, &value), hm.insert(name.clone(), value).is_none()),
                    _ => assert_eq!(h.remove(&name), hm.remove(&name).is_some()),
                }
                let member = if long {
                    format!("{name}{}", "x".repeat(260))
                } else {
                    name.clone()
                };
                let score = next(40) as i64 - 20;
                match next(4) {
                    0 | 1 => assert_eq!(z.add(score, &member), zm.insert(member.clone(), score).is_none()),
                    _ => assert_eq!(z.remove(&member), zm.remove(&member).is_some()),
                }
                assert_eq!(h.get(&name), hm.get(&name).map(String::as_str));
                assert_eq!(z.score(&member), zm.get(&member).copied());
            }
            let pairs: BTreeMap<String, String> = h.pairs().collect();
            assert_eq!(pairs, hm);
            let mut order: Vec<(i64, String)> = zm.iter().map(|(m, s)| (*s, m.clone())).collect();
            order.sort();
            let items: Vec<(i64, String)> = z.items().map(|(s, m)| (s, m.to_string())).collect();
            assert_eq!(items, order);
            let n = order.len();
            if n > 0 {
                assert_eq!(z.by_rank(n - 1, n - 1), order[n - 1..]);
                assert_eq!(z.by_rank(0, n / 2), order[..=n / 2]);
            }
            let inside: Vec<_> = order.iter().filter(|(s, _)| (-5..=5).contains(s)).cloned().collect();
            assert_eq!(z.by_score(-5, 5), inside);
            let packed = matches!(h, Fields::Packed(_)) && matches!(z, ZSet::Packed(_));
            assert_eq!(
                packed,
                round % 2 == 0,
                "round {round}: the encodings the test means to cover"
            );
        }
    }

    /// The store against a real redis-server (the Redis authority's crate
    /// is the client).
    #[cfg(feature = "redis")]
    mod against_redis {
        use super::super::*;
        use super::numbers;

        /// A redis-server from the project's harness (`tests/harness/redisctl`),
        /// stopped on drop; None (said on stderr) when there is none and
        /// `QUOTALEASE_REQUIRE_REDIS` does not ask for one, as the integration
        /// tests do.
        struct Server(String);

        impl Server {
            fn ctl(args: &[&str]) -> std::process::Output {
                let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
                std::process::Command::new(root.join("tests/harness/redisctl"))
                    .args(args)
                    .env(
                        "QUOTALEASE_HARNESS_STATE",
                        std::env::temp_dir().join("quotalease-harness-core-lib"),
                    )
                    .output()
                    .expect("tests/harness/redisctl runs")
            }

            fn start() -> Option<Server> {
                let required = std::env::var("QUOTALEASE_REQUIRE_REDIS").is_ok_and(|v| !v.is_empty() && v != "0");
                let installed = std::process::Command::new("redis-server")
                    .arg("--version")
                    .output()
                    .is_ok();
                if !required && !installed {
                    eprintln!("the store against redis-server: skipped: no redis-server");
                    return None;
                }
                let out = Server::ctl(&["start"]);
                assert!(
                    out.status.success(),
                    "redisctl start: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                Some(Server(String::from_utf8_lossy(&out.stdout).trim().to_string()))
            }
        }

        impl Drop for Server {
            fn drop(&mut self) {
                let _ = Server::ctl(&["stop", &self.0]);
            }
        }

        /// A reply as text, the store's and the server's alike.
        fn show(r: &Reply) -> String {
            match r {
                Reply::Nil => "nil".into(),
                Reply::Int(i) => format!("i:{i}"),
                Reply::Bulk(s) => format!("b:{s}"),
                Reply::Status(s) => format!("s:{s}"),
                Reply::Array(items) => format!("[{}]", items.iter().map(show).collect::<Vec<_>>().join(", ")),
            }
        }

        fn show_value(v: &redis::Value) -> String {
            use redis::Value as V;
            match v {
                V::Nil => "nil".into(),
                V::Int(i) => format!("i:{i}"),
                V::BulkString(b) => format!("b:{}", String::from_utf8_lossy(b)),
                V::SimpleString(s) => format!("s:{s}"),
                V::Okay => "s:OK".into(),
                V::Array(items) => format!("[{}]", items.iter().map(show_value).collect::<Vec<_>>().join(", ")),
                other => format!("{other:?}"),
            }
        }

        /// The store answers every command the scripts use as a real
        /// redis-server does: random sequences on a few keys and their
        /// companions (`:x`, `:w`: one slot of the store), through both
        /// encodings and the conversion (more than `Pack::MAX` entries, parts
        /// over 255 bytes), keys emptied and deleted, commands on a key of the
        /// other type; every reply compared.
        #[test]
        fn the_store_answers_as_a_real_redis_server() {
            let Some(server) = Server::start() else { return };
            let client = redis::Client::open(format!("redis://127.0.0.1:{}", server.0)).expect("a URL");
            let mut con = client.get_connection().expect("a connection to the harness server");
            let mut st = Store::default();
            let mut next = numbers(0x9e37_79b9_7f4a_7c15);
            for step in 0..6000 {
                // a key and its companions share a slot: each on its own too
                let key = ["h", "z", "k", "h:x", "z:x", "h:w", "k:x:x"][next(7) as usize].to_string();
                let spread = if next(2) == 0 { 20 } else { 90 };
                let field = format!("f{}", next(spread));
                let value = match next(40) {
                    0 => "v".repeat(300),
                    _ => next(1_000_000).to_string(),
                };
                let score = match next(30) {
                    0 => "4503599627370496".to_string(),
                    1 => "-4503599627370496".to_string(),
                    _ => (next(100) as i64 - 50).to_string(),
                };
                let bound = |b: u64| match b {
                    0 => "-inf".to_string(),
                    1 => "+inf".to_string(),
                    b => (b as i64 - 30).to_string(),
                };
                let (lo, hi) = (bound(next(60)), bound(next(60)));
                let (a, b) = ((next(12) as i64 - 6).to_string(), (next(12) as i64 - 6).to_string());
                let with = if next(2) == 0 {
                    vec!["WITHSCORES".to_string()]
                } else {
                    vec![]
                };
                let mut args: Vec<String> = match next(16) {
                    0..=2 => vec!["HSET".into(), key, field.clone(), value],
                    3 => vec!["HGET".into(), key, field],
                    4 => vec!["HMGET".into(), key, field, format!("f{}", next(spread))],
                    5 => vec!["HDEL".into(), key, field, format!("f{}", next(spread))],
                    6..=8 => vec!["ZADD".into(), key, score, field],
                    9 => vec!["ZREM".into(), key, field, format!("f{}", next(spread))],
                    10 => vec!["ZSCORE".into(), key, field],
                    11 => vec!["ZRANGE".into(), key, a, b],
                    12 => vec!["ZRANGEBYSCORE".into(), key, lo, hi],
                    13 => vec!["ZREMRANGEBYSCORE".into(), key, lo, hi],
                    14 => vec!["TYPE".into(), key],
                    _ => vec![["DEL", "GET", "PEXPIRE"][next(3) as usize].into(), key],
                };
                if matches!(args[0].as_str(), "ZRANGE" | "ZRANGEBYSCORE") {
                    args.extend(with);
                }
                if args[0] == "PEXPIRE" {
                    args.push("600000".into());
                }
                let ours = match st.command(&args) {
                    Ok(r) => show(&r),
                    Err(e) => format!("error {}", e.split_whitespace().next().unwrap_or_default()),
                };
                let theirs = match redis::cmd(&args[0]).arg(&args[1..]).query::<redis::Value>(&mut con) {
                    Ok(v) => show_value(&v),
                    Err(e) => format!("error {}", e.code().unwrap_or("?")),
                };
                assert_eq!(ours, theirs, "step {step}: {args:?}");
            }
        }
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
