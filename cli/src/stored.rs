//! The CLI's reads of what the Redis authority stores for a key, shared by
//! `inspect` and `top`: which commands read a key, and their answers turned
//! into the core's codec (`quotalease::internals::stored`, the one parser of
//! the stored format: a fixed-lease key's string `"c t w e v"`, an adaptive
//! key's ledger HASH and its holder records).

use quotalease::internals::stored::Stored;

/// Pipe the reads of one key: `GET`, `HGETALL` (one of them fails with
/// WRONGTYPE, so run the pipeline with `ignore_errors`) and `PTTL`.
pub fn pipe_read(pipe: &mut redis::Pipeline, redis_key: &str) {
    pipe.cmd("GET")
        .arg(redis_key)
        .cmd("HGETALL")
        .arg(redis_key)
        .cmd("PTTL")
        .arg(redis_key);
}

/// Commands [`pipe_read`] adds per key.
pub const READS: usize = 3;

/// The answers to one key's [`pipe_read`]: the stored state (None: nothing
/// stored) and its PTTL (None: missing or no expiry).
pub fn from_reads(v: &[redis::Value]) -> (Option<Stored>, Option<u64>) {
    let get: Option<String> = v
        .first()
        .and_then(|v| redis::from_redis_value(v.clone()).ok())
        .flatten();
    let hash: Vec<(String, String)> = v
        .get(1)
        .and_then(|v| redis::from_redis_value(v.clone()).ok())
        .unwrap_or_default();
    let ttl: i64 = v
        .get(2)
        .and_then(|v| redis::from_redis_value(v.clone()).ok())
        .unwrap_or(-2);
    let stored = match get {
        Some(s) => Some(Stored::from_string(&s)),
        None => Stored::from_hash(hash),
    };
    (stored, (ttl >= 0).then_some(ttl as u64))
}

/// The application's key of a Redis key `{prefix}:{<key>}`; None for the
/// ledger's expiries `{prefix}:{<key>}:x`, the old holders hash
/// `{prefix}:{<key>}:h` and anything else.
pub fn key_of<'a>(prefix: &str, redis_key: &'a str) -> Option<&'a str> {
    redis_key.strip_prefix(prefix)?.strip_prefix(":{")?.strip_suffix('}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_not_their_companions() {
        assert_eq!(key_of("ql", "ql:{user:42}"), Some("user:42"));
        assert_eq!(key_of("ql", "ql:{a{b}}"), Some("a{b}"));
        assert_eq!(key_of("ql", "ql:{a{b}}:h"), None);
        assert_eq!(key_of("ql", "ql:{a}:x"), None);
        assert_eq!(key_of("ql", "qlx:{a}"), None);
    }
}
