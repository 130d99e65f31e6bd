//! `quotalease inspect`: a key's authoritative state in Redis (read by
//! crate::stored, parsed by the core's `quotalease::internals::stored`:
//! a fixed-lease bucket string or an adaptive key's ledger, with its holders),
//! and what it means for "why was this denied?".

use std::fmt::Write as _;

use quotalease::Limiter;

use crate::redis_util;
use crate::stored;

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
    let limiter = Limiter::builder()
        .url(o.redis.clone())
        .limit(limit)
        .window_ms(window_ms)
        .key_prefix(o.key_prefix.clone())
        .backend_timeout_ms(2_000)
        // It reads the store's say on the key, as a limiter following it would.
        .policy_refresh_ms(1_000)
        .build()
        .map_err(crate::explain)?;
    let mut conn = redis_util::connect(&o.redis)?;
    // The shared policy store's say on the key (docs/policies.md).
    let stored_policy = limiter.policy_get(&o.key).ok().flatten();
    let _ = limiter.refresh_policies();
    let resolved = crate::policy::stored_rules(&limiter, &o.key).ok().flatten();
    let insp = limiter.inspect(&o.key).map_err(crate::explain)?;
    let now = redis_util::time_ms(&mut conn)?;
    let redis_key = format!("{}:{{{}}}", o.key_prefix, o.key);
    // The key's state in either form, and the ledger's expiries (crate::stored).
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    stored::pipe_read(&mut pipe, &redis_key);
    pipe.cmd("ZRANGE")
        .arg(format!("{redis_key}:x"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES");
    let answers: Vec<redis::Value> = pipe.query(&mut conn).map_err(|e| format!("read failed: {e}"))?;
    let (state, pttl) = stored::from_reads(&answers[..stored::READS.min(answers.len())]);
    let expiries: Vec<(String, u64)> = answers
        .get(stored::READS)
        .and_then(|v| redis::from_redis_value(v.clone()).ok())
        .unwrap_or_default();
    let expiry = |member: String| expiries.iter().find(|(m, _)| *m == member).map(|(_, at)| *at);
    let stored_window = state.as_ref().and_then(|s| s.bucket.window_ms);
    let tokens = state.as_ref().and_then(|s| s.bucket.tokens()).or(insp.authority_tokens);
    let elsewhere = if tokens.is_none() {
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
    let Some(tokens) = tokens else {
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
    if let Some(l) = state.as_ref().and_then(|s| s.ledger) {
        let w = stored_window.unwrap_or(window_ms).max(1) as f64;
        let per_s = |units: u64| units as f64 * 1000.0 / w;
        let _ = writeln!(
            out,
            "ledger     adaptive leasing, limit {} per {}: {} tokens committed, rates {:.2}/s, fallback shares \
             {:.2}/s (epoch {}, version {})",
            l.limit,
            secs(w as u64),
            l.committed,
            per_s(l.rates),
            per_s(l.fallback),
            l.epoch,
            l.version
        );
        if l.tails > 0 {
            let _ = writeln!(
                out,
                "tails      {:.2}/s of rates that ran out kept from new rates while their holders may report them",
                per_s(l.tails)
            );
        }
        if l.learning(now) {
            let _ = writeln!(
                out,
                "learning   the state was found lost: no new tokens for {} more (holders keep what they report)",
                secs(l.learning_until - now)
            );
        }
    }
    let holders = state.as_ref().map_or(&[][..], |s| &s.holders[..]);
    if !holders.is_empty() {
        let live = state.as_ref().and_then(|s| s.ledger).map_or(0, |l| l.holders);
        let _ = writeln!(
            out,
            "holders    {live} live (adaptive leasing): demand and rate per second; rates come out of the refill"
        );
        let until = |at: Option<u64>| match at {
            None => "no expiry stored".to_string(),
            Some(at) if at >= 1 << 52 => "until given back".to_string(),
            Some(at) => format!("in {}", secs(at.saturating_sub(now))),
        };
        for h in holders {
            let Some(r) = h.record else {
                let _ = writeln!(out, "           {}: unreadable record {:?}", h.id, h.raw);
                continue;
            };
            let share = format!(
                "fallback share {:.2}/s (valid {})",
                r.fallback_per_s(),
                until(expiry(format!("f{}", h.id)))
            );
            if !r.live {
                let _ = writeln!(out, "           {}: no live commitment, {share}", h.id);
                continue;
            }
            let _ = writeln!(
                out,
                "           {}: demand {:.1}/s, holds up to {}, {}, {share}, forgotten {}",
                h.id,
                r.demand as f64 / 1000.0,
                r.commitment,
                if r.has_rate() {
                    format!("rate {:.2}/s", r.rate_per_s())
                } else {
                    "chunks (no rate)".to_string()
                },
                until(expiry(format!("c{}", h.id)))
            );
        }
    }
    let refilled_at = state
        .as_ref()
        .and_then(|s| s.bucket.refilled_at)
        .or(insp.authority_refilled_at_ms)
        .unwrap_or(now);
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
     overshoot_bound tokens the instance holds unspent (its share of instances x lease_size)\n  \
     shadow_denied   requests admitted only because their rules are in shadow mode (in denied too)\n"
        .to_string()
}
