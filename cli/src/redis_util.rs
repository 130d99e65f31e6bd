//! Direct Redis access for what the limiter does not expose: a reachability
//! check, Redis `TIME`, `PTTL` and `INFO commandstats`.

use std::collections::BTreeMap;
use std::time::Duration;

use quotalease::{redact_secrets, RedactedUrl};

/// A synchronous connection with 2 s connect/read/write timeouts. Errors
/// print the URL redacted and the redis crate's reasons without the URL's
/// credentials (`quotalease::redact_url`).
pub fn connect(url: &str) -> Result<redis::Connection, String> {
    let shown = RedactedUrl(url);
    let reason = |e: &dyn std::fmt::Display| redact_secrets(&e.to_string(), url);
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(format!(
            "--redis {shown:?}: this command needs one Redis server (redis:// or rediss://)"
        ));
    }
    let client =
        redis::Client::open(url).map_err(|e| format!("--redis {shown:?} is not a valid Redis URL: {}", reason(&e)))?;
    let conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(|e| format!("cannot reach Redis at {shown}: {}", reason(&e)))?;
    let t = Some(Duration::from_secs(2));
    conn.set_read_timeout(t).map_err(|e| reason(&e))?;
    conn.set_write_timeout(t).map_err(|e| reason(&e))?;
    Ok(conn)
}

/// Fail early, with a clear message, when the server does not answer.
pub fn ping(url: &str) -> Result<(), String> {
    if url.contains("+cluster://") {
        return Ok(()); // the limiter reports cluster problems itself
    }
    let mut c = connect(url)?;
    redis::cmd("PING").query::<String>(&mut c).map_err(|e| {
        format!(
            "Redis at {} does not answer PING: {}",
            RedactedUrl(url),
            redact_secrets(&e.to_string(), url)
        )
    })?;
    Ok(())
}

/// Redis' clock in milliseconds (the clock the authority refills by).
pub fn time_ms(c: &mut redis::Connection) -> Result<u64, String> {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(c).map_err(|e| format!("TIME failed: {e}"))?;
    Ok(s * 1000 + us / 1000)
}

/// `PTTL key`: `None` when the key does not exist or has no expiry.
pub fn pttl(c: &mut redis::Connection, key: &str) -> Result<Option<u64>, String> {
    let v: i64 = redis::cmd("PTTL")
        .arg(key)
        .query(c)
        .map_err(|e| format!("PTTL failed: {e}"))?;
    Ok((v >= 0).then_some(v as u64))
}

/// Redis keys holding `key` under any prefix (`*:{key}`), at most 5.
pub fn find_prefixes(c: &mut redis::Connection, key: &str) -> Result<Vec<String>, String> {
    let mut pattern = String::from("*:\\{");
    for ch in key.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\' | '{' | '}') {
            pattern.push('\\');
        }
        pattern.push(ch);
    }
    pattern.push_str("\\}");
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    for _ in 0..100 {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query(c)
            .map_err(|e| format!("SCAN failed: {e}"))?;
        found.extend(keys);
        cursor = next;
        if cursor == 0 || found.len() >= 5 {
            break;
        }
    }
    found.truncate(5);
    found.sort();
    Ok(found)
}

/// Calls per command from `INFO commandstats` (`cmdstat_evalsha` -> `evalsha`).
pub fn commandstats(c: &mut redis::Connection) -> Result<BTreeMap<String, u64>, String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(c)
        .map_err(|e| format!("INFO commandstats failed: {e}"))?;
    Ok(parse_commandstats(&info))
}

/// Parse the text of `INFO commandstats`.
pub fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.trim().strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.parse().ok());
        if let Some(calls) = calls {
            out.insert(name.to_string(), calls);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commandstats() {
        let info =
            "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_info:calls=3,usec=1,usec_per_call=0.3\r\ngarbage\r\n";
        let m = parse_commandstats(info);
        assert_eq!(m.get("evalsha"), Some(&12));
        assert_eq!(m.get("info"), Some(&3));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn refuses_cluster_and_bad_urls() {
        assert!(connect("redis+cluster://127.0.0.1:1")
            .err()
            .unwrap()
            .contains("one Redis server"));
        assert!(connect("http://x").err().unwrap().contains("one Redis server"));
    }
}
