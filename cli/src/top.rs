//! `quotalease top`: a live view of the busiest keys in one Redis, from what
//! the authority stores (crate::stored): each key's bucket and, for adaptive
//! keys, the ledger's sums and holder records. Bounded cost per frame: at
//! most `scan_calls` `SCAN ... COUNT scan_count` steps (the cursor carries
//! over between frames, so a large keyspace is covered over several frames,
//! never with `KEYS *`), and at most `budget` keys read, in one pipeline
//! (`GET`, `HGETALL`, `PTTL` per key). SCAN's finds of the ledger's expiries
//! (`:x`) and of old holders hashes (`:h`) are not keys and are skipped.
//!
//! What the columns measure (all derived from Redis; rates between the key's
//! read now and its oldest of the last `HISTORY` reads, about 4 s):
//! - `granted/s`: tokens given out per second: stored credit at the earlier
//!   read (refill is accounted at every write, so the sum telescopes), plus
//!   the refill between the two writes those reads saw (the key's rate less
//!   the active rates `R`, none while learning, capped at capacity less the
//!   commitments `L`), less stored credit at the later read, plus what the
//!   active rates (as of the earlier read) delivered over that span; over the
//!   longer of that span and the time between the reads. Chunks, rates and
//!   fallback debits, net of give-backs. A key not written since that read
//!   gave out no chunk: only its rates delivered (on the instances, which
//!   report at their next call).
//!   The limit is the ledger's `l`; a fixed-lease key needs the keys' policy
//!   (`--rate`): its string stores the credit, not the limit. When the bucket
//!   reached its cap in between (a key under its limit), the refill it could
//!   not hold hides the takes: then the holders' demand is shown if it is
//!   larger, and `denied/s` is 0.
//! - `offered/s`: the live holders' reported demand (the ledger's `D`,
//!   admitted + denied per second as of each holder's last call). Adaptive
//!   leasing only.
//! - `denied/s`: offered less granted, at least 0 (0 when the bucket reached its cap).
//! - `holders`: live holders (`n`); `rates`: holder records running a rate.
//! - `stored`: whole tokens in the bucket as of its last write; `ttl`: its PTTL.
//! - `fallback/s`: the holders' stored fallback shares, the rate each runs its
//!   failure policy at if Redis becomes unreachable now (min-max over the
//!   holder records); `guard`: `learning` while the ledger, found lost, grants
//!   no new tokens.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

use quotalease::internals::stored::{Bucket, Ledger, Record, Stored};
use quotalease::RedactedUrl;

use crate::stored;

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
    /// What is stored (None: nothing, reads as full).
    pub stored: Option<Stored>,
    /// PTTL of the key (ms).
    pub ttl_ms: Option<u64>,
}

/// One row of the view.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    /// The application's key.
    pub key: String,
    /// Tokens granted per second (None: unknown: first read, or no limit).
    pub granted_per_s: Option<f64>,
    /// Holders' offered load per second (None: no live holders).
    pub offered_per_s: Option<f64>,
    /// Offered less granted.
    pub denied_per_s: Option<f64>,
    /// Live holders.
    pub holders: u64,
    /// Holders running a rate grant.
    pub rates: usize,
    /// Whole tokens stored (None: nothing stored, i.e. full).
    pub stored: Option<u64>,
    /// PTTL (ms).
    pub ttl_ms: Option<u64>,
    /// Per-holder fallback shares, tokens per second (min, max).
    pub fallback_per_s: Option<(f64, f64)>,
    /// The ledger is learning after a loss.
    pub learning: bool,
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

/// What a read keeps for the rates: the bucket and the ledger's sums.
pub type Kept = Option<(Bucket, Option<Ledger>)>;

/// What a key's previous reads left.
#[derive(Clone, Debug, Default)]
struct Track {
    /// The last `HISTORY` reads, oldest first.
    reads: VecDeque<(u64, Kept)>,
    row: Row,
    read_frame: u64,
}

/// What a sample keeps for later rates.
pub fn kept(s: &Sample) -> Kept {
    s.stored.as_ref().map(|st| (st.bucket, st.ledger))
}

/// Tokens given out per second between two reads of a key, and whether its
/// bucket had tokens to spare in between (it reached its cap, so the refill
/// it could not hold hides takes; or it served chunks only and held a token
/// at both reads). `limit`: the key's limit per window, `wall_ms`: between
/// the reads.
fn granted(limit: u64, policy_window: u64, before: &Kept, now: &Kept, wall_ms: f64) -> Option<(f64, bool)> {
    let Some((b2, l2)) = now else {
        // Gone: it expired full, nothing was taken (or it was never there).
        return Some((0.0, true));
    };
    let w = b2.window_ms.unwrap_or(policy_window).max(1);
    let cap = limit as f64 * w as f64;
    let Some((b1, l1)) = before else {
        // New since the last read: it started full.
        let c = b2.credit.map_or(cap, |c| c as f64);
        return Some(((cap - c).max(0.0) / w as f64 / (wall_ms / 1000.0), true));
    };
    let (Some(c1), Some(t1), Some(c2), Some(t2)) = (b1.credit, b1.refilled_at, b2.credit, b2.refilled_at) else {
        return None;
    };
    if b1.window_ms != b2.window_ms {
        return None; // the policy changed: credit in other units
    }
    let (rates, learning_until) = l1.map_or((0, 0), |l| (l.rates.min(limit), l.learning_until));
    if t2 == t1 && c2 == c1 {
        // No write since the last read: no chunk left the bucket, and the
        // rates it reserved (none for a fixed-lease key) kept delivering on
        // the instances, which report at their next call.
        return Some((rates as f64 * 1000.0 / w as f64, false));
    }
    // Refill is accounted between the two writes, so the tokens given out are
    // those of [t1, t2]: the bucket's refill (the key's rate less the active
    // rates, none while learning) up to its cap less the commitments, and
    // what the rates themselves delivered.
    let committed = l2.map_or(0, |l| l.committed);
    let span = t2.saturating_sub(t1);
    let refill_span = t2.saturating_sub(t1.max(learning_until.max(l2.map_or(0, |l| l.learning_until))));
    let full = c1 as f64 + (limit - rates) as f64 * refill_span as f64;
    let room = cap - committed as f64 * w as f64;
    let taken = (full.min(room) - c2 as f64).max(0.0) + rates as f64 * span as f64;
    // With no rates, tokens leave only as chunks, each a lease call's answer:
    // a bucket that held a token at both writes served the calls between
    // them, and what it gave out in that time is counted in chunks (a
    // holder's demand of 20/s took two chunks of 8 in the second measured),
    // not in what the holders were offered.
    let no_rates = rates == 0 && l2.is_none_or(|l| l.rates == 0);
    let spare = full > room || (no_rates && c1.min(c2) >= w as i64);
    Some((taken / w as f64 / (wall_ms.max(span as f64) / 1000.0), spare))
}

/// Derive a key's row from its previous and current reads.
pub fn row(policy: Option<(u64, u64)>, prev: Option<(u64, &Kept)>, now_ms: u64, s: &Sample) -> Row {
    let ledger = s.stored.as_ref().and_then(|st| st.ledger);
    let records: Vec<Record> = s.stored.iter().flat_map(|st| st.records().copied()).collect();
    let holders = ledger.map_or(0, |l| l.holders);
    let offered = ledger.filter(|l| l.holders > 0).map(|l| l.demand as f64 / 1000.0);
    let limit = ledger.map(|l| l.limit).filter(|&l| l > 0).or(policy.map(|p| p.0));
    let granted = match (limit, prev) {
        (Some(limit), Some((then_ms, before))) if now_ms > then_ms => {
            let w = policy.map_or(1, |p| p.1);
            granted(limit, w, before, &kept(s), (now_ms - then_ms) as f64)
        }
        _ => None,
    };
    let shares = records.iter().map(|r| r.fallback_per_s());
    let fallback = shares.clone().reduce(f64::min).zip(shares.reduce(f64::max));
    // A bucket with tokens to spare between the reads (at its cap, or
    // serving chunks only with a token left at both reads) denied nothing
    // for want of them, and what was taken is hidden by the refill it could
    // not hold or counted in whole chunks: the holders' demand is the better
    // figure.
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
        holders,
        rates: records.iter().filter(|r| r.has_rate()).count(),
        stored: s.stored.as_ref().and_then(|st| st.bucket.tokens()),
        ttl_ms: s.ttl_ms,
        fallback_per_s: fallback,
        learning: ledger.is_some_and(|l| l.learning(now_ms)),
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
        pipe.ignore_errors();
        for k in &pick {
            stored::pipe_read(&mut pipe, &format!("{}:{{{k}}}", self.o.key_prefix));
        }
        let answers: Vec<(Option<Stored>, Option<u64>)> = if pick.is_empty() {
            Vec::new()
        } else {
            let flat: Vec<redis::Value> = pipe.query(&mut self.conn).map_err(|e| self.err("read", &e))?;
            flat.chunks(stored::READS).map(stored::from_reads).collect()
        };
        for (k, (stored, ttl_ms)) in pick.iter().zip(answers) {
            let s = Sample {
                key: k.clone(),
                stored,
                ttl_ms,
            };
            let t = self.tracked.entry(k.clone()).or_default();
            // Rates over the oldest read kept: a moving window of HISTORY reads.
            let prev = t.reads.front().map(|(at, b)| (*at, b));
            t.row = row(self.o.policy, prev, now, &s);
            if t.reads.len() == HISTORY {
                t.reads.pop_front();
            }
            t.reads.push_back((now, kept(&s)));
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
        None => "unknown (adaptive keys store theirs; pass --rate for fixed-lease keys' granted/s)".into(),
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
        let line = format!(
            "{key:<key_w$}  {:>9}  {:>9}  {:>8}  {:>7}  {:>5}  {:>6}  {:>4}  {:>10}  {}",
            rate(r.granted_per_s),
            rate(r.offered_per_s),
            rate(r.denied_per_s),
            r.holders,
            r.rates,
            r.stored.map_or("full".to_string(), |t| t.to_string()),
            ttl(r.ttl_ms),
            fb,
            if r.learning { "learning" } else { "" },
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if f.rows.is_empty() {
        out.push_str("(no keys under this prefix yet)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotalease::internals::stored::Holder;

    fn bucket(credit: i64, at: u64, w: u64) -> Bucket {
        Bucket {
            credit: Some(credit),
            refilled_at: Some(at),
            window_ms: Some(w),
        }
    }

    fn fixed(credit: i64, at: u64, w: u64) -> Option<Stored> {
        Some(Stored {
            bucket: bucket(credit, at, w),
            ..Stored::default()
        })
    }

    fn sample(stored: Option<Stored>) -> Sample {
        Sample {
            key: "k".into(),
            stored,
            ttl_ms: None,
        }
    }

    fn kept_of(s: Option<Stored>) -> Kept {
        kept(&sample(s))
    }

    #[test]
    fn granted_is_credit_before_plus_refill_less_credit_after() {
        // 600/min: 600 units per ms, a token is 60 000 units.
        let p = Some((600, 60_000));
        let before = kept_of(fixed(300 * 60_000, 1_000, 60_000));
        let s = sample(fixed(295 * 60_000, 2_000, 60_000));
        // 300 tokens + 10 refilled in 1 s - 295 = 15 tokens taken in 1 s.
        let r = row(p, Some((1_000, &before)), 2_000, &s);
        assert_eq!(r.granted_per_s, Some(15.0));
        assert_eq!(r.stored, Some(295));
        // Without the policy a fixed-lease key's refill is unknown.
        assert_eq!(row(None, Some((1_000, &before)), 2_000, &s).granted_per_s, None);
        // First read: no rate yet.
        assert_eq!(row(p, None, 2_000, &s).granted_per_s, None);
        // Written 900 ms before the first read and 300 ms before the second: the
        // 1 600 ms between the writes refilled 16 tokens, all taken (credit
        // unchanged): 10 per second, not 16 per (1 s) read interval.
        let stale = kept_of(fixed(4_750, 1_100, 60_000));
        let later = sample(fixed(4_750, 2_700, 60_000));
        assert_eq!(row(p, Some((2_000, &stale)), 3_000, &later).granted_per_s, Some(10.0));
        // No write since: nothing left a fixed-lease bucket.
        let same = sample(fixed(4_750, 1_100, 60_000));
        assert_eq!(row(p, Some((2_000, &stale)), 3_000, &same).granted_per_s, Some(0.0));
        // A key gone since (expired full): nothing taken.
        assert_eq!(
            row(p, Some((2_000, &stale)), 3_000, &sample(None)).granted_per_s,
            Some(0.0)
        );
    }

    /// A 10/s ledger key: credit `c` (in 1/1000 token), rates `r` (tokens per
    /// second), commitments `l`, live holders' demand `d` (tokens/s) over
    /// `holders` records of "L r d f w v k".
    fn ledger(c: i64, at: u64, r: u64, l: u64, d: u64, holders: &[&str]) -> Option<Stored> {
        Some(Stored {
            bucket: bucket(c, at, 1_000),
            ledger: Some(Ledger {
                limit: 10,
                rates: r,
                committed: l,
                demand: d * 1000,
                holders: holders.iter().filter(|h| h.ends_with(" 1")).count() as u64,
                ..Ledger::default()
            }),
            holders: holders
                .iter()
                .enumerate()
                .map(|(i, raw)| Holder {
                    id: i.to_string(),
                    raw: raw.to_string(),
                    record: Record::parse(raw),
                })
                .collect(),
        })
    }

    #[test]
    fn a_ledger_gives_its_limit_rates_demand_and_shares() {
        let hs = ["0 6 30000 6 1000 3 1", "2 0 10000 2 1000 3 1", "0 0 0 2 1000 1 0"];
        // Saturated: empty before and after, rates of 6/s running: the bucket
        // refilled 4 tokens (10 - 6) and gave them out, the rates 6 more.
        let before = kept_of(ledger(0, 1_000, 6, 2, 40, &hs));
        let s = sample(ledger(0, 2_000, 6, 2, 40, &hs));
        // No policy needed: the ledger stores its limit.
        let r = row(None, Some((1_000, &before)), 2_000, &s);
        assert_eq!(r.granted_per_s, Some(10.0));
        assert_eq!((r.offered_per_s, r.denied_per_s), (Some(40.0), Some(30.0)));
        // No write since: the rates alone delivered, 6 per second.
        let quiet = sample(ledger(0, 1_000, 6, 2, 40, &hs));
        assert_eq!(
            row(None, Some((1_000, &before)), 2_000, &quiet).granted_per_s,
            Some(6.0)
        );
        assert_eq!(
            (r.holders, r.rates),
            (2, 1),
            "a record without a live commitment is no holder"
        );
        // Stored fallback shares: 6, 2 and 2 per second.
        assert_eq!(r.fallback_per_s, Some((2.0, 6.0)));
        assert!(!r.learning);
        // A debt stores no tokens.
        assert_eq!(
            row(None, None, 2_000, &sample(ledger(-500, 2_000, 0, 0, 0, &[]))).stored,
            Some(0)
        );
        // A bucket at its cap (capacity less commitments) hides its takes:
        // demand stands, nothing denied.
        let nearly = kept_of(ledger(7_000, 1_000, 0, 2, 40, &hs));
        let later = sample(ledger(7_500, 2_000, 0, 2, 40, &hs));
        let r2 = row(None, Some((1_000, &nearly)), 2_000, &later);
        assert_eq!((r2.granted_per_s, r2.denied_per_s), (Some(40.0), Some(0.0)));
        // Chunks only (no rates) with a token left at both reads: every lease
        // call was served, and the 1.5 tokens given out in chunks say less
        // than the demand. With half a token left, 2 tokens went out and the
        // rest of the demand counts as denied.
        let chunks = kept_of(ledger(1_500, 1_000, 0, 5, 40, &hs));
        let after = |c| {
            row(
                None,
                Some((1_000, &chunks)),
                2_000,
                &sample(ledger(c, 1_100, 0, 5, 40, &hs)),
            )
        };
        let r4 = after(1_000);
        assert_eq!((r4.granted_per_s, r4.denied_per_s), (Some(40.0), Some(0.0)));
        let r5 = after(500);
        assert_eq!((r5.granted_per_s, r5.denied_per_s), (Some(2.0), Some(38.0)));
        // Learning after a loss: no refill until z, and the guard says so.
        let mut lost = ledger(0, 2_000, 0, 0, 40, &hs);
        lost.as_mut().unwrap().ledger.as_mut().unwrap().learning_until = 5_000;
        let r3 = row(
            None,
            Some((1_000, &kept_of(ledger(0, 1_000, 0, 0, 40, &hs)))),
            2_000,
            &sample(lost),
        );
        assert_eq!(r3.granted_per_s, Some(0.0));
        assert!(r3.learning);
        let text = render(
            &Options {
                redis: "redis://h:1".into(),
                key_prefix: "ql".into(),
                policy: None,
                rows: 5,
                scan_count: 1,
                scan_calls: 1,
                budget: 5,
                max_tracked: 5,
            },
            &Frame {
                rows: vec![r, r3],
                ..Frame::default()
            },
            100,
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[4].ends_with("2.0-6.0"), "{text}");
        assert!(lines[5].ends_with("learning"), "{text}");
    }
}
