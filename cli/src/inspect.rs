//! `quotalease inspect`: a key's authoritative bucket in Redis, read with
//! `Limiter::inspect`, and what it means for "why was this denied?".

use std::fmt::Write as _;

use quotalease::{Config, Limiter};

use crate::redis_util;
use crate::stored::{self, Bucket};

/// What `inspect` takes.
#[derive(Clone, Debug)]
pub struct Options {
    /// Redis URL.
    pub redis: String,
    /// The key, as the application passes it to `acquire`.
    pub key: String,
    /// The key's policy, when known: (limit, window_ms).
    pub policy: Option<(u64, u64)>,
    /// The limiter's `key_prefix`.
    pub key_prefix: String,
}

fn secs(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// Inspect the key and describe it.
pub fn run(o: &Options) -> Result<String, String> {
    quotalease::validate_key(&o.key).map_err(crate::explain)?;
    let (limit, window_ms) = o.policy.unwrap_or((1, 60_000));
    let limiter = Limiter::new(Config {
        url: o.redis.clone(),
        limit,
        window_ms,
        key_prefix: o.key_prefix.clone(),
        backend_timeout_ms: 2_000,
        ..Config::default()
    })
    .map_err(crate::explain)?;
    let mut conn = redis_util::connect(&o.redis)?;
    // The shared policy store's say on the key (docs/policies.md).
    let stored_policy = limiter.policy_get(&o.key).ok().flatten();
    let _ = limiter.refresh_policies();
    let resolved = crate::policy::stored_rules(&limiter, &o.key).ok().flatten();
    let insp = limiter.inspect(&o.key).map_err(crate::explain)?;
    let now = redis_util::time_ms(&mut conn)?;
    let redis_key = format!("{}:{{{}}}", o.key_prefix, o.key);
    // The stored value is "credit refilled_at window epoch version" (crate::stored).
    let stored_window: Option<u64> = redis::cmd("GET")
        .arg(&redis_key)
        .query::<Option<String>>(&mut conn)
        .map_err(|e| format!("GET failed: {e}"))?
        .and_then(|v| Bucket::parse(&v).window_ms);
    let pttl = redis_util::pttl(&mut conn, &redis_key)?;
    // Adaptive leasing's holder records (crate::stored), without the failover
    // guard's '~' fields.
    let (holders, _quarantine) = stored::split_holders(
        redis::cmd("HGETALL")
            .arg(format!("{redis_key}:h"))
            .query(&mut conn)
            .map_err(|e| format!("HGETALL failed: {e}"))?,
    );
    let elsewhere = if insp.authority_tokens.is_none() {
        redis_util::find_prefixes(&mut conn, &o.key)?
    } else {
        Vec::new()
    };
    let _ = limiter.close();

    let mut out = String::new();
    let _ = writeln!(out, "key        {}", o.key);
    let _ = writeln!(out, "redis key  {redis_key} on {}", quotalease::RedactedUrl(&o.redis));
    match (&stored_policy, &resolved) {
        (Some(entry), Some((rules, source))) => {
            let _ = writeln!(out, "store      entry {entry}: {rules}, {source}");
        }
        (Some(entry), None) => {
            let _ = writeln!(
                out,
                "store      entry {entry} (its tier is not defined in the store: the limiters' \
                 `tiers` option or policy file defines it)"
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "store      no entry for the key: its callers' tier (or the limiters' limit) applies"
            );
        }
    }
    match o.policy {
        Some((l, w)) => {
            let _ = writeln!(out, "policy     {l} per {} (as given)", secs(w));
        }
        None => {
            let _ = writeln!(
                out,
                "policy     not given: pass --limit and --window-ms (or --rate) to see tokens now"
            );
        }
    }
    let Some(tokens) = insp.authority_tokens else {
        let full = match o.policy {
            Some((l, _)) => format!(" ({l} tokens)"),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "bucket     none stored: the key reads as a full bucket{full}.\n           \
             Nothing was taken from it recently, or it refilled and expired (or --key-prefix differs\n           \
             from the limiter's key_prefix, {:?} here).",
            o.key_prefix
        );
        if !elsewhere.is_empty() {
            let _ = writeln!(
                out,
                "elsewhere  the same key under other prefixes: {}",
                elsewhere.join(", ")
            );
        }
        out.push_str(&hints());
        return Ok(out);
    };
    if !holders.is_empty() {
        let w = stored_window.unwrap_or(window_ms).max(1) as f64;
        let _ = writeln!(
            out,
            "holders    {} live (adaptive leasing): demand and rate per second; rates are paid from the refill",
            holders.len()
        );
        let mut paid = 0.0;
        for (id, v, parsed) in &holders {
            let Some(h) = parsed else {
                let _ = writeln!(out, "           {id}: unreadable record {v:?}");
                continue;
            };
            let (demand, held, expires, rate, until) = (h.demand, h.held, h.expires, h.rate, h.rate_until);
            let active = until > now && rate > 0;
            let per_s = rate as f64 * 1000.0 / w;
            if active {
                paid += per_s;
            }
            let _ = writeln!(
                out,
                "           {id}: demand {:.1}/s, holds up to {held}, {}, forgotten in {}",
                demand as f64 / 1000.0,
                if active {
                    format!("rate {per_s:.2}/s for {}", secs(until - now))
                } else {
                    "chunks (no rate)".to_string()
                },
                secs(expires.saturating_sub(now))
            );
        }
        if paid > 0.0 {
            let _ = writeln!(
                out,
                "           rates running: {paid:.2} tokens/s in all (the bucket refills by the key's rate less this)"
            );
        }
    }
    let refilled_at = insp.authority_refilled_at_ms.unwrap_or(now);
    let age = now.saturating_sub(refilled_at);
    let _ = writeln!(
        out,
        "stored     {tokens} tokens, as of {} ago (Redis time {refilled_at} ms){}",
        secs(age),
        match stored_window {
            Some(w) => format!(", window {}", secs(w)),
            None => String::new(),
        }
    );
    match pttl.or(insp.authority_ttl_ms) {
        Some(ttl) => {
            let _ = writeln!(
                out,
                "expires    in {} (PTTL: when the bucket is full again it is dropped; a missing key reads as full)",
                secs(ttl)
            );
        }
        None => {
            let _ = writeln!(out, "expires    never (no PTTL set: not written by quotalease?)");
        }
    }
    if let Some((l, w)) = o.policy {
        let elapsed = age.min(w);
        let refill = elapsed as f64 * l as f64 / w as f64;
        let now_tokens = (tokens as f64 + refill).min(l as f64);
        let whole = now_tokens.floor() as u64;
        let per_token_ms = w as f64 / l as f64;
        let next_ms = if whole >= l {
            0.0
        } else {
            (1.0 - now_tokens.fract()) * per_token_ms
        };
        let full_ms = (l as f64 - now_tokens) * per_token_ms;
        let _ = writeln!(
            out,
            "now        {whole} of {l} tokens (refilled to Redis TIME){}",
            if whole >= l {
                "; full".to_string()
            } else {
                format!(
                    "; next token in {}, full in {}",
                    secs(next_ms.ceil() as u64),
                    secs(full_ms.ceil() as u64)
                )
            }
        );
        let verdict = if whole >= 1 {
            "a request of cost 1 would get tokens from the authority now; a denial on an instance came\n           \
             from its local state (see below)"
                .to_string()
        } else {
            format!(
                "the bucket is empty: instances deny with reason \"exhausted\" (Retry-After about {})",
                secs(next_ms.ceil() as u64)
            )
        };
        let _ = writeln!(out, "verdict    {verdict}");
    }
    out.push_str(&hints());
    Ok(out)
}

fn hints() -> String {
    "on each instance (limiter.metrics(), or metrics_prometheus() with the quotalease_ prefix):\n  \
     denied          with the decision's reason: exhausted = this bucket was empty; fallback = Redis\n                  \
     was unreachable and on_backend_failure decided; pending = try_acquire while a lease was\n                  \
     in flight\n  \
     fallback_active 1 while the failure policy is in force (see backend_errors, fallback_transitions)\n  \
     overshoot_bound tokens the instance holds unspent (its share of instances x lease_size)\n"
        .to_string()
}
