//! What the Redis authority stores for a key, parsed (the bucket string by the
//! core's `parse_stored`): the bucket string
//! `{prefix}:{<key>}` = `"c t w e v"` and the holders hash `{prefix}:{<key>}:h`
//! (`demand held expires rate rate_from rate_until version` per holder, and the
//! failover guard's `~q`, `~b`, `~r` fields). Shared by `inspect` and `top`.

use quotalease::adaptive::Holder;

/// The bucket string's first fields (None for any that does not parse).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Credit, in units of 1/window token.
    pub credit: Option<u64>,
    /// Redis-clock ms up to which refill is accounted.
    pub refilled_at: Option<u64>,
    /// The window (ms) the credit units refer to.
    pub window_ms: Option<u64>,
}

impl Bucket {
    /// Parse `"c t w e v"` (or the older `"c t w"`) with the core's own parser,
    /// the one `Limiter::inspect` uses.
    pub fn parse(value: &str) -> Bucket {
        let (credit, refilled_at, window_ms) = quotalease::parse_stored(value);
        Bucket {
            credit,
            refilled_at,
            window_ms,
        }
    }

    /// Whole tokens stored.
    pub fn tokens(&self) -> Option<u64> {
        Some(self.credit? / self.window_ms?.max(1))
    }
}

/// One holder record, or None when it does not parse.
pub fn parse_holder(value: &str) -> Option<Holder> {
    let f: Vec<u64> = value.split(' ').filter_map(|x| x.parse().ok()).collect();
    let [demand, held, expires, rate, rate_from, rate_until, ref rest @ ..] = f[..] else {
        return None;
    };
    Some(Holder {
        demand,
        held,
        expires,
        rate,
        rate_from,
        rate_until,
        version: rest.first().copied().unwrap_or(0),
    })
}

/// The holders hash: (holder id, record as stored, parsed record), without the
/// guard's fields; and whether the guard's quarantine (`~q`) is set.
#[allow(clippy::type_complexity)]
pub fn split_holders(fields: Vec<(String, String)>) -> (Vec<(String, String, Option<Holder>)>, bool) {
    let mut quarantine = false;
    let mut holders = Vec::new();
    for (id, v) in fields {
        if id == "~q" {
            quarantine = true;
        }
        if id.starts_with('~') {
            continue;
        }
        let parsed = parse_holder(&v);
        holders.push((id, v, parsed));
    }
    (holders, quarantine)
}

/// The application's key of a Redis key `{prefix}:{<key>}` or `{prefix}:{<key>}:h`.
pub fn key_of<'a>(prefix: &str, redis_key: &'a str) -> Option<&'a str> {
    let rest = redis_key.strip_prefix(prefix)?.strip_prefix(":{")?;
    rest.strip_suffix("}:h").or_else(|| rest.strip_suffix('}'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_parse_field_by_field() {
        let b = Bucket::parse("120000 1796018722007 60000 1796018700000 7");
        assert_eq!(b.credit, Some(120000));
        assert_eq!(b.window_ms, Some(60000));
        assert_eq!(b.tokens(), Some(2));
        let old = Bucket::parse("0 5 1000");
        assert_eq!((old.credit, old.refilled_at), (Some(0), Some(5)));
        assert_eq!(Bucket::parse("garbage").tokens(), None);
    }

    #[test]
    fn holders_and_keys() {
        let h = parse_holder("2500 3 9000 10 100 5000 4").unwrap();
        assert_eq!(
            (h.demand, h.held, h.rate, h.rate_until, h.version),
            (2500, 3, 10, 5000, 4)
        );
        assert_eq!(parse_holder("1 2 3").map(|h| h.demand), None);
        let (hs, q) = split_holders(vec![("~q".into(), "123".into()), ("a1".into(), "1 2 3 4 5 6".into())]);
        assert!(q);
        assert_eq!(hs.len(), 1);
        assert_eq!(hs[0].2.unwrap().version, 0);
        assert_eq!(key_of("ql", "ql:{user:42}"), Some("user:42"));
        assert_eq!(key_of("ql", "ql:{a{b}}:h"), Some("a{b}"));
        assert_eq!(key_of("ql", "qlx:{a}"), None);
        assert_eq!(key_of("ql", "ql:{a}:x"), None);
    }
}
