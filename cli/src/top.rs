//! `quotalease top`: a live view of the busiest keys in one Redis, from what
//! the authority stores (crate::stored): each key's bucket and its adaptive
//! holders. Bounded cost per frame: at most `scan_calls` `SCAN ... COUNT
//! scan_count` steps (the cursor carries over between frames, so a large
//! keyspace is covered over several frames, never with `KEYS *`), and at most
//! `budget` keys read, in one pipeline (`GET`, `PTTL`, `HGETALL` per key).
//!
//! What the columns measure (all derived from Redis; rates between the key's
//! read now and its oldest of the last `HISTORY` reads, about 4 s):
//! - `granted/s`: tokens that left the bucket per second: stored credit at the
//!   earlier read (refill is accounted at every write, so the sum telescopes), plus the refill between the two writes those reads saw
//!   (capped at capacity), less stored credit at the later read, over the
//!   longer of that span and the time between the reads; chunks and rate
//!   grants, net of give-backs. A key not written since its last read keeps
//!   its figure (rate grants accrue on the instances and are paid at their
//!   next call). Needs the keys' policy (`--rate`): Redis stores the credit,
//!   not the limit. Summed over time it is exactly what the bucket gave out:
//!   what the fleet admitted plus what its instances hold unspent (at most the
//!   key's budget). When the bucket reached capacity in between (a key under
//!   its limit), the refill it could not hold hides the takes: then the
//!   holders' demand is shown if it is larger, and `denied/s` is 0.
//! - `offered/s`: the live holders' reported demand (admitted + denied per second,
//!   each holder's one-second average as of its last call). Adaptive leasing only.
//! - `denied/s`: offered less granted, at least 0 (0 when the bucket reached capacity).
//! - `holders`, `rates`: live holder records, and those running a rate grant.
//! - `stored`: whole tokens in the bucket as of its last write; `ttl`: its PTTL.
//! - `fallback/s`: each live holder's share of the key's rate, the rate it
//!   runs its static share at if Redis becomes unreachable now (min-max over
//!   the holders); `guard`: the failover guard's quarantine is set.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

use quotalease::adaptive::{demand_units, water_fill};
use quotalease::bucket::Policy;
use quotalease::RedactedUrl;

use crate::stored::{self, Bucket};

/// What `top` takes.
#[derive(Clone, Debug)]
pub struct Options {
    /// Redis URL (redis:// or rediss://).
    pub redis: String,
    /// The limiters' key_prefix.
    pub key_prefix: String,
    /// The keys' policy (limit, window_ms), when known.
    pub policy: Option<(u64, u64)>,
    /// Rows shown.
    pub rows: usize,
    /// COUNT of each SCAN step.
    pub scan_count: u64,
    /// SCAN steps per frame at most.
    pub scan_calls: usize,
    /// Keys read per frame at most.
    pub budget: usize,
    /// Keys remembered at most (the least recently found are dropped).
    pub max_tracked: usize,
}

/// One key as read in one frame.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// The application's key.
    pub key: String,
    /// The bucket string (None: no bucket stored, reads as full).
    pub bucket: Option<Bucket>,
    /// PTTL of the bucket (ms).
    pub ttl_ms: Option<u64>,
    /// Live holder records (expired ones left out).
    pub holders: Vec<quotalease::adaptive::Holder>,
    /// The failover guard's quarantine is set.
    pub quarantine: bool,
}

/// One row of the view.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    /// The application's key.
    pub key: String,
    /// Tokens granted per second (None: unknown: first read, or no policy).
    pub granted_per_s: Option<f64>,
    /// Holders' offered load per second (None: no holder records).
    pub offered_per_s: Option<f64>,
    /// Offered less granted.
    pub denied_per_s: Option<f64>,
    /// Live holders.
    pub holders: usize,
    /// Holders running a rate grant.
    pub rates: usize,
    /// Whole tokens stored (None: no bucket, i.e. full).
    pub stored: Option<u64>,
    /// PTTL (ms).
    pub ttl_ms: Option<u64>,
    /// Per-holder fallback rates, tokens per second (min, max).
    pub fallback_per_s: Option<(f64, f64)>,
    /// Quarantined by the failover guard.
    pub quarantine: bool,
}

/// One frame: what `render` draws.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frame {
    /// Redis TIME of the frame (ms).
    pub now_ms: u64,
    /// Rows, busiest first.
    pub rows: Vec<Row>,
    /// Keys known so far.
    pub keys_known: usize,
    /// Keys read this frame.
    pub keys_read: usize,
    /// The SCAN cursor went round the keyspace at least once.
    pub scan_complete: bool,
    /// Redis did not answer this frame (the rows are the last frame's).
    pub error: Option<String>,
}

/// Reads of a key kept for its rates: granted/s is measured over the last
/// `HISTORY` - 1 frame intervals (about 4 s at the default interval).
pub const HISTORY: usize = 5;

/// What a key's previous reads left.
#[derive(Clone, Debug, Default)]
struct Track {
    /// The last `HISTORY` reads, oldest first.
    reads: VecDeque<(u64, Option<Bucket>)>,
    row: Row,
    read_frame: u64,
}

/// Derive a key's row from its previous and current reads.
pub fn row(
    policy: Option<(u64, u64)>,
    prev: Option<(u64, &Option<Bucket>, Option<f64>)>,
    now_ms: u64,
    s: &Sample,
) -> Row {
    let live: Vec<_> = s.holders.iter().filter(|h| h.expires > now_ms).collect();
    let rates = live.iter().filter(|h| h.rate > 0 && h.rate_until > now_ms).count();
    let window = s.bucket.and_then(|b| b.window_ms).or(policy.map(|p| p.1));
    let offered = (!live.is_empty()).then(|| live.iter().map(|h| h.demand as f64).sum::<f64>() / 1000.0);
    let granted = match (policy, prev) {
        (Some((limit, w)), Some((then_ms, before, last_rate))) if now_ms > then_ms => {
            let cap = (limit * w) as f64;
            let wu = window.unwrap_or(w).max(1) as f64;
            let wall_ms = (now_ms - then_ms) as f64;
            match (before, s.bucket) {
                // Gone: it expired full, nothing was taken (or it was never there).
                (_, None) => Some((0.0, true)),
                // New since the last read: it started full.
                (None, Some(b)) => {
                    let c = b.credit.map_or(cap, |c| c as f64);
                    Some(((cap - c).max(0.0) / wu / (wall_ms / 1000.0), true))
                }
                (Some(b1), Some(b2)) => match (b1.credit, b1.refilled_at, b2.credit, b2.refilled_at) {
                    // No write since the last read: the last figure stands (rate
                    // grants accrue on the instances and are paid at their next call).
                    (Some(c1), Some(t1), Some(c2), Some(t2)) if t2 == t1 && c2 == c1 => last_rate.map(|r| (r, false)),
                    (Some(c1), Some(t1), Some(c2), Some(t2)) => {
                        // Refill is accounted between the two writes, so the
                        // tokens taken are those of [t1, t2]; over at least
                        // the time between the reads.
                        let span = t2.saturating_sub(t1);
                        let full = c1 as f64 + limit as f64 * span as f64;
                        let taken = (full.min(cap) - c2 as f64).max(0.0);
                        Some((taken / wu / (wall_ms.max(span as f64) / 1000.0), full > cap))
                    }
                    _ => None,
                },
            }
        }
        _ => None,
    };
    let fallback = match (policy, live.is_empty()) {
        (Some((limit, w)), false) => {
            let p = Policy { limit, window_ms: w };
            let demands: Vec<u64> = live.iter().map(|h| demand_units(h.demand, p)).collect();
            let shares = water_fill(&demands, limit);
            let per_s = |u: u64| u as f64 * 1000.0 / w as f64;
            let lo = shares.iter().copied().min().map(per_s);
            let hi = shares.iter().copied().max().map(per_s);
            lo.zip(hi)
        }
        _ => None,
    };
    // A bucket that reached capacity between the reads had tokens to spare:
    // nothing was denied for want of them, and the refill it could not hold
    // hides what was taken, so the holders' demand is the better figure.
    let (granted, denied) = match (granted, offered) {
        (Some((g, true)), Some(o)) => (Some(g.max(o)), Some(0.0)),
        (Some((g, false)), Some(o)) => (Some(g), Some((o - g).max(0.0))),
        (g, _) => (g.map(|(g, _)| g), None),
    };
    Row {
        key: s.key.clone(),
        granted_per_s: granted,
        offered_per_s: offered,
        denied_per_s: denied,
        holders: live.len(),
        rates,
        stored: s.bucket.and_then(|b| b.tokens()),
        ttl_ms: s.ttl_ms,
        fallback_per_s: fallback,
        quarantine: s.quarantine,
    }
}

fn busy(r: &Row) -> f64 {
    r.granted_per_s.unwrap_or(0.0) + r.offered_per_s.unwrap_or(0.0)
}

/// Keeps the SCAN cursor and every key's last read between frames.
pub struct Sampler {
    o: Options,
    conn: redis::Connection,
    cursor: u64,
    scan_complete: bool,
    frame: u64,
    tracked: HashMap<String, Track>,
    last: Frame,
}

impl Sampler {
    /// Connect (errors print the URL redacted).
    pub fn new(o: Options) -> Result<Sampler, String> {
        let conn = crate::redis_util::connect(&o.redis)?;
        Ok(Sampler {
            o,
            conn,
            cursor: 0,
            scan_complete: false,
            frame: 0,
            tracked: HashMap::new(),
            last: Frame::default(),
        })
    }

    /// Sample one frame. `now_ms` overrides Redis TIME (deterministic tests
    /// whose limiters run on a manual clock).
    pub fn frame(&mut self, now_ms: Option<u64>) -> Frame {
        match self.try_frame(now_ms) {
            Ok(f) => {
                self.last = f.clone();
                f
            }
            Err(e) => {
                // Keep the last frame's rows and say why they are old.
                if let Ok(c) = crate::redis_util::connect(&self.o.redis) {
                    self.conn = c;
                }
                Frame {
                    error: Some(e),
                    ..self.last.clone()
                }
            }
        }
    }

    fn try_frame(&mut self, now_ms: Option<u64>) -> Result<Frame, String> {
        self.frame += 1;
        let now = match now_ms {
            Some(t) => t,
            None => crate::redis_util::time_ms(&mut self.conn)?,
        };
        self.scan()?;
        // The busiest keys every frame, then the ones read longest ago.
        let mut order: Vec<(&String, &Track)> = self.tracked.iter().collect();
        order.sort_by(|a, b| busy(&b.1.row).total_cmp(&busy(&a.1.row)).then(a.0.cmp(b.0)));
        let mut pick: Vec<String> = order.iter().take(self.o.rows).map(|(k, _)| (*k).clone()).collect();
        let mut rest: Vec<(&String, &Track)> = order.iter().skip(self.o.rows).copied().collect();
        rest.sort_by_key(|(k, t)| (t.read_frame, (*k).clone()));
        pick.extend(rest.iter().map(|(k, _)| (*k).clone()));
        pick.truncate(self.o.budget);

        let mut pipe = redis::pipe();
        for k in &pick {
            let rk = format!("{}:{{{k}}}", self.o.key_prefix);
            pipe.cmd("GET")
                .arg(&rk)
                .cmd("PTTL")
                .arg(&rk)
                .cmd("HGETALL")
                .arg(format!("{rk}:h"));
        }
        type One = (Option<String>, i64, Vec<(String, String)>);
        let answers: Vec<One> = if pick.is_empty() {
            Vec::new()
        } else {
            let flat: Vec<redis::Value> = pipe.query(&mut self.conn).map_err(|e| self.err("read", &e))?;
            flat.chunks(3)
                .map(|c| {
                    let get: Option<String> = redis::from_redis_value(c[0].clone()).unwrap_or(None);
                    let ttl: i64 = redis::from_redis_value(c[1].clone()).unwrap_or(-2);
                    let h: Vec<(String, String)> = redis::from_redis_value(c[2].clone()).unwrap_or_default();
                    (get, ttl, h)
                })
                .collect()
        };
        for (k, (get, ttl, fields)) in pick.iter().zip(answers) {
            let (holders, quarantine) = stored::split_holders(fields);
            let s = Sample {
                key: k.clone(),
                bucket: get.as_deref().map(Bucket::parse),
                ttl_ms: (ttl >= 0).then_some(ttl as u64),
                holders: holders.into_iter().filter_map(|(_, _, h)| h).collect(),
                quarantine,
            };
            let t = self.tracked.entry(k.clone()).or_default();
            // Rates over the oldest read kept: a moving window of HISTORY reads.
            let prev = t.reads.front().map(|(at, b)| (*at, b, t.row.granted_per_s));
            t.row = row(self.o.policy, prev, now, &s);
            if t.reads.len() == HISTORY {
                t.reads.pop_front();
            }
            t.reads.push_back((now, s.bucket));
            t.read_frame = self.frame;
        }
        // Forget keys with nothing stored any more.
        self.tracked
            .retain(|_, t| t.row.stored.is_some() || t.row.holders > 0 || t.read_frame != self.frame);
        let mut rows: Vec<Row> = self.tracked.values().map(|t| t.row.clone()).collect();
        rows.sort_by(|a, b| busy(b).total_cmp(&busy(a)).then(a.key.cmp(&b.key)));
        rows.truncate(self.o.rows);
        Ok(Frame {
            now_ms: now,
            rows,
            keys_known: self.tracked.len(),
            keys_read: pick.len(),
            scan_complete: self.scan_complete,
            error: None,
        })
    }

    fn err(&self, what: &str, e: &redis::RedisError) -> String {
        format!(
            "{what} failed on {}: {}",
            RedactedUrl(&self.o.redis),
            quotalease::redact_secrets(&e.to_string(), &self.o.redis)
        )
    }

    /// At most `scan_calls` SCAN steps from where the last frame stopped.
    fn scan(&mut self) -> Result<(), String> {
        let mut pattern = String::new();
        for ch in self.o.key_prefix.chars() {
            if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(ch);
        }
        pattern.push_str(":{*");
        for _ in 0..self.o.scan_calls {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(self.cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(self.o.scan_count)
                .query(&mut self.conn)
                .map_err(|e| self.err("SCAN", &e))?;
            for rk in keys {
                if let Some(k) = stored::key_of(&self.o.key_prefix, &rk) {
                    if !self.tracked.contains_key(k) && self.tracked.len() < self.o.max_tracked {
                        self.tracked.insert(k.to_owned(), Track::default());
                    }
                }
            }
            self.cursor = next;
            if next == 0 {
                self.scan_complete = true;
                break;
            }
        }
        Ok(())
    }
}

fn rate(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x >= 100.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.1}"),
    }
}

fn ttl(v: Option<u64>) -> String {
    match v {
        None => "-".into(),
        Some(ms) if ms >= 60_000 => format!("{}m", ms / 60_000),
        Some(ms) => format!("{}s", ms / 1000),
    }
}

/// The frame as text, `width` columns at most (keys are cut to fit). Pure:
/// the same frame always draws the same text.
pub fn render(o: &Options, f: &Frame, width: usize) -> String {
    let mut out = String::new();
    let policy = match o.policy {
        Some((l, w)) => format!("{l} per {} s", w as f64 / 1000.0),
        None => "unknown (pass --rate for granted/s, denied/s, fallback/s)".into(),
    };
    let _ = writeln!(
        out,
        "quotalease top  {}  prefix {}  policy {policy}",
        RedactedUrl(&o.redis),
        o.key_prefix
    );
    let _ = writeln!(
        out,
        "keys known {}{}  read this frame {} (budget {})  state {}",
        f.keys_known,
        if f.scan_complete { "" } else { " (scan in progress)" },
        f.keys_read,
        o.budget,
        match &f.error {
            None => "redis ok".to_string(),
            Some(e) => format!("REDIS UNREACHABLE, rows are the last frame's: {e}"),
        }
    );
    out.push('\n');
    let cols = "granted/s  offered/s  denied/s  holders  rates  stored   ttl  fallback/s  guard";
    let key_w = width.saturating_sub(cols.len() + 2).clamp(8, 48);
    let _ = writeln!(out, "{:<key_w$}  {cols}", "KEY");
    for r in &f.rows {
        let mut key = r.key.clone();
        if key.chars().count() > key_w {
            key = key.chars().take(key_w - 1).collect::<String>() + "~";
        }
        let fb = match r.fallback_per_s {
            None => "-".into(),
            Some((lo, hi)) if (hi - lo).abs() < 0.05 => format!("{lo:.1}"),
            Some((lo, hi)) => format!("{lo:.1}-{hi:.1}"),
        };
        let _ = writeln!(
            out,
            "{key:<key_w$}  {:>9}  {:>9}  {:>8}  {:>7}  {:>5}  {:>6}  {:>4}  {:>10}  {}",
            rate(r.granted_per_s),
            rate(r.offered_per_s),
            rate(r.denied_per_s),
            r.holders,
            r.rates,
            r.stored.map_or("full".to_string(), |t| t.to_string()),
            ttl(r.ttl_ms),
            fb,
            if r.quarantine { "quarantine" } else { "-" },
        );
    }
    if f.rows.is_empty() {
        out.push_str("(no keys under this prefix yet)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotalease::adaptive::Holder;

    fn bucket(credit: u64, at: u64, w: u64) -> Option<Bucket> {
        Some(Bucket {
            credit: Some(credit),
            refilled_at: Some(at),
            window_ms: Some(w),
        })
    }

    #[test]
    fn granted_is_credit_before_plus_refill_less_credit_after() {
        // 600/min: 600 units per ms, a token is 60 000 units.
        let p = Some((600, 60_000));
        let before = bucket(300 * 60_000, 1_000, 60_000);
        let s = Sample {
            key: "k".into(),
            bucket: bucket(295 * 60_000, 2_000, 60_000),
            ..Sample::default()
        };
        // 300 tokens + 10 refilled in 1 s - 295 = 15 tokens taken in 1 s.
        let r = row(p, Some((1_000, &before, None)), 2_000, &s);
        assert_eq!(r.granted_per_s, Some(15.0));
        assert_eq!(r.stored, Some(295));
        // Without the policy the refill is unknown.
        assert_eq!(row(None, Some((1_000, &before, None)), 2_000, &s).granted_per_s, None);
        // First read: no rate yet.
        assert_eq!(row(p, None, 2_000, &s).granted_per_s, None);
        // Written 900 ms before the first read and 300 ms before the second: the
        // 1 600 ms between the writes refilled 16 tokens, all taken (credit
        // unchanged): 10 per second, not 16 per (1 s) read interval.
        let stale = bucket(4_750, 1_100, 60_000);
        let later = Sample {
            bucket: bucket(4_750, 2_700, 60_000),
            ..s.clone()
        };
        assert_eq!(
            row(p, Some((2_000, &stale, None)), 3_000, &later).granted_per_s,
            Some(10.0)
        );
        // No write since: the last figure stands.
        let same = Sample {
            bucket: stale,
            ..s.clone()
        };
        assert_eq!(
            row(p, Some((2_000, &stale, Some(7.5))), 3_000, &same).granted_per_s,
            Some(7.5)
        );
        // A bucket gone since (expired full): nothing taken.
        let gone = Sample {
            bucket: None,
            ..s.clone()
        };
        assert_eq!(
            row(p, Some((2_000, &stale, Some(7.5))), 3_000, &gone).granted_per_s,
            Some(0.0)
        );
    }

    #[test]
    fn offered_and_denied_from_holders() {
        let h = |demand, expires| Holder {
            demand,
            expires,
            ..Holder::default()
        };
        let before = bucket(0, 1_000, 1_000);
        let s = Sample {
            key: "k".into(),
            bucket: bucket(0, 2_000, 1_000),
            holders: vec![h(30_000, 9_999), h(10_000, 9_999), h(50_000, 10)],
            ..Sample::default()
        };
        // 10/s key, empty before and after: 10 granted per second; 40 offered.
        let r = row(Some((10, 1_000)), Some((1_000, &before, None)), 2_000, &s);
        assert_eq!(r.holders, 2, "an expired holder is not live");
        assert_eq!(r.granted_per_s, Some(10.0));
        assert_eq!(r.offered_per_s, Some(40.0));
        assert_eq!(r.denied_per_s, Some(30.0));
        // A bucket near capacity hides its takes: demand stands, nothing denied.
        let nearly_full = bucket(9_000, 1_000, 1_000);
        let later = Sample {
            bucket: bucket(9_500, 2_000, 1_000),
            ..s.clone()
        };
        let r2 = row(Some((10, 1_000)), Some((1_000, &nearly_full, None)), 2_000, &later);
        assert_eq!((r2.granted_per_s, r2.denied_per_s), (Some(40.0), Some(0.0)));
        // Water-filled shares of 10/s over demands 30 and 10: 5 and 5.
        assert_eq!(r.fallback_per_s, Some((5.0, 5.0)));
    }
}
