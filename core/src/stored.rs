//! The codec of what the Redis authority stores for a key: the one Rust
//! reader of the stored format, shared by the core's `inspect`, the CLI's
//! `inspect` and `top`, and the tests. Model code: no Redis types, no
//! dependency on any other module of the crate, built with or without the
//! `redis` feature. Two forms live at `{prefix}:{<key>}`:
//!
//! - a fixed-lease key: the STRING `"c t w e v"` (credit in 1/w token,
//!   refilled-at ms, window w, epoch, version), written by the scripts'
//!   core/src/authority/lua/prelude.lua and read by [`Bucket::parse`];
//! - an adaptive key: the ledger's HASH (core/src/authority/lua/ledger.lua):
//!   `l w c t L R F D n e v u z y j O P b k` and one `h<holder id>` =
//!   `"L r d f w v k O P b"` per holder, read by [`Stored::from_hash`].
//!   Its expiries are the sorted set `{prefix}:{<key>}:x` (`c<id>`
//!   commitments, `r<id>` rates, `e<id>` renewal graces, `f<id>` fallback
//!   shares, scored by expiry ms).

/// The bucket both forms store (None for a field that does not parse).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Credit, in units of 1/window token (the ledger's may be negative: a debt).
    pub credit: Option<i64>,
    /// Redis-clock ms up to which refill is accounted.
    pub refilled_at: Option<u64>,
    /// The window (ms) the credit units refer to.
    pub window_ms: Option<u64>,
}

impl Bucket {
    /// Parse a fixed-lease key's string `"c t w e v"` (or the older `"c t w"`),
    /// field by field: a field that does not parse reads as None, the others
    /// still parse. Epoch and version follow the window; the failover guard
    /// reads them in the scripts, not here. A string stores no debt, so a
    /// negative credit does not parse.
    pub fn parse(value: &str) -> Bucket {
        let mut it = value.split(' ').map(|f| f.parse::<u64>().ok());
        let mut next = || it.next().flatten();
        let (credit, refilled_at, window_ms) = (next(), next(), next());
        Bucket {
            credit: credit.and_then(|c| i64::try_from(c).ok()),
            refilled_at,
            window_ms,
        }
    }

    /// Whole tokens stored (a debt stores none).
    pub fn tokens(&self) -> Option<u64> {
        Some(self.credit?.max(0) as u64 / self.window_ms?.max(1))
    }
}

/// The ledger's sums and stamps (a missing field reads as 0). Rates and
/// shares are in credit units per ms (tokens per window).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// `l`: the key's limit per window.
    pub limit: u64,
    /// `L`: tokens committed to live holders.
    pub committed: u64,
    /// `R`: sum of the active rates.
    pub rates: u64,
    /// `A`: sum of the tails, the rooms of rates that ran out at their end,
    /// kept from new rates while their holders may report them (I1 is
    /// `R + A <= l`).
    pub tails: u64,
    /// `F`: sum of the valid fallback shares.
    pub fallback: u64,
    /// `D`: the live holders' demand, milli-tokens per second.
    pub demand: u64,
    /// `n`: live holders.
    pub holders: u64,
    /// `e`: the failover guard's epoch.
    pub epoch: u64,
    /// `v`: the state's version.
    pub version: u64,
    /// `u`: Redis ms the state must live until.
    pub alive_until: u64,
    /// `z`: Redis ms until which it learns after a loss (grants no new tokens).
    pub learning_until: u64,
    /// `s`: Redis ms until which the fallback shares learn after a loss (a
    /// holder is re-granted the share it reports, no more).
    pub shares_learning_until: u64,
    /// `y`: Redis ms a saturated call last found the bucket unable to serve
    /// it (saturated holders then move onto rates; docs/design.md).
    pub dry_at: u64,
    /// `O`: refill the capacity clamp cut since the epoch `b` (credit
    /// units): what was cut after a holder's last lease call pays its
    /// fallback admissions.
    pub overflow: u64,
    /// `P`: what of the overflow has paid fallback admissions since `b`.
    pub overflow_paid: u64,
    /// `b`: the epoch of `O` and `P` (holders' snapshots of another epoch
    /// pay nothing).
    pub overflow_epoch: u64,
    /// `j`: Redis ms a holder last joined (a first rate soon after is the
    /// shortest).
    pub joined_at: u64,
    /// `k`: Redis ms a holder's first demand estimate last brought
    /// `join_pct` of `D` or more (any rate soon after is the shortest).
    pub grown_at: u64,
}

impl Ledger {
    /// Learning after a loss at `now_ms`.
    pub fn learning(&self, now_ms: u64) -> bool {
        self.learning_until > now_ms
    }
}

/// One holder record `"L r d f w v k O P b"` (the last three, the
/// overflow's sums at its last lease call, absent from older records).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Tokens committed to it.
    pub commitment: u64,
    /// Its rate, in 1/w token per ms (0: none).
    pub rate: u64,
    /// Its demand, milli-tokens per second.
    pub demand: u64,
    /// Its fallback share, in 1/w token per ms.
    pub fallback: u64,
    /// The window w of its rate and share.
    pub window_ms: u64,
    /// The state's version it was last answered with.
    pub version: u64,
    /// Its commitment is live (counted in `n`).
    pub live: bool,
}

impl Record {
    /// Parse `"L r d f w v k"` and what follows; None when it does not.
    pub fn parse(value: &str) -> Option<Record> {
        let f: Vec<u64> = value.split(' ').map(|x| x.parse().ok()).collect::<Option<_>>()?;
        let ([commitment, rate, demand, fallback, window_ms, version, k]
        | [commitment, rate, demand, fallback, window_ms, version, k, _, _, _]) = f[..]
        else {
            return None;
        };
        Some(Record {
            commitment,
            rate,
            demand,
            fallback,
            window_ms,
            version,
            live: k == 1,
        })
    }

    fn per_s(&self, units_per_ms: u64) -> f64 {
        units_per_ms as f64 * 1000.0 / self.window_ms.max(1) as f64
    }

    /// Its rate, tokens per second.
    pub fn rate_per_s(&self) -> f64 {
        self.per_s(self.rate)
    }

    /// Its fallback share, tokens per second.
    pub fn fallback_per_s(&self) -> f64 {
        self.per_s(self.fallback)
    }

    /// Running a rate grant.
    pub fn has_rate(&self) -> bool {
        self.live && self.rate > 0
    }
}

/// One `h<id>` field: the holder id, the value as stored, and its parse.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    /// The holder id (the field name without its `h`).
    pub id: String,
    /// The value as stored.
    pub raw: String,
    /// The record, or None when it does not parse.
    pub record: Option<Record>,
}

/// A key's stored state, either form.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// The bucket (both forms).
    pub bucket: Bucket,
    /// The ledger's fields (None: a fixed-lease string).
    pub ledger: Option<Ledger>,
    /// The ledger's holder records, by id.
    pub holders: Vec<Holder>,
}

impl Stored {
    /// A fixed-lease key's string.
    pub fn from_string(value: &str) -> Stored {
        Stored {
            bucket: Bucket::parse(value),
            ledger: None,
            holders: Vec::new(),
        }
    }

    /// A ledger hash (`HGETALL`'s pairs); None when empty (no such key).
    pub fn from_hash(fields: Vec<(String, String)>) -> Option<Stored> {
        if fields.is_empty() {
            return None;
        }
        let mut s = Stored {
            ledger: Some(Ledger::default()),
            ..Stored::default()
        };
        let l = s.ledger.as_mut().expect("set above");
        for (name, v) in fields {
            if let Some(id) = name.strip_prefix('h').filter(|id| !id.is_empty()) {
                let record = Record::parse(&v);
                s.holders.push(Holder {
                    id: id.to_owned(),
                    raw: v,
                    record,
                });
                continue;
            }
            let u = || v.parse::<u64>().unwrap_or(0);
            match name.as_str() {
                "c" => s.bucket.credit = v.parse().ok(),
                "t" => s.bucket.refilled_at = v.parse().ok(),
                "w" => s.bucket.window_ms = v.parse().ok(),
                "l" => l.limit = u(),
                "L" => l.committed = u(),
                "R" => l.rates = u(),
                "A" => l.tails = u(),
                "F" => l.fallback = u(),
                "D" => l.demand = u(),
                "n" => l.holders = u(),
                "e" => l.epoch = u(),
                "v" => l.version = u(),
                "u" => l.alive_until = u(),
                "z" => l.learning_until = u(),
                "s" => l.shares_learning_until = u(),
                "y" => l.dry_at = u(),
                "O" => l.overflow = u(),
                "P" => l.overflow_paid = u(),
                "b" => l.overflow_epoch = u(),
                "j" => l.joined_at = u(),
                "k" => l.grown_at = u(),
                _ => {}
            }
        }
        s.holders.sort_by(|a, b| a.id.cmp(&b.id));
        Some(s)
    }

    /// Parsed holder records.
    pub fn records(&self) -> impl Iterator<Item = &Record> {
        self.holders.iter().filter_map(|h| h.record.as_ref())
    }
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
        let s = Stored::from_string("3000 5 1000 9 1");
        assert_eq!((s.bucket.tokens(), s.ledger), (Some(3), None));
    }

    #[test]
    fn stored_strings_parse_field_by_field() {
        let b = Bucket::parse("120000 1796018722007 60000");
        assert_eq!(
            (b.credit, b.refilled_at, b.window_ms),
            (Some(120000), Some(1796018722007), Some(60000))
        );
        let b = Bucket::parse("0 5 1000");
        assert_eq!((b.credit, b.refilled_at, b.window_ms), (Some(0), Some(5), Some(1000)));
        assert_eq!(Bucket::parse("garbage"), Bucket::default());
        let b = Bucket::parse("1 x 3");
        assert_eq!((b.credit, b.refilled_at, b.window_ms), (Some(1), None, Some(3)));
        assert_eq!(Bucket::parse("-5 1 1000").credit, None);
    }

    #[test]
    fn ledger_hashes_parse_state_and_records() {
        let f = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
        };
        let s = Stored::from_hash(f(&[
            ("l", "10"),
            ("w", "1000"),
            ("c", "-2500"),
            ("t", "77"),
            ("L", "4"),
            ("R", "6"),
            ("A", "3"),
            ("F", "10"),
            ("D", "40000"),
            ("n", "2"),
            ("e", "5"),
            ("v", "9"),
            ("u", "900"),
            ("z", "0"),
            ("s", "300001"),
            ("y", "60"),
            ("O", "2000"),
            ("P", "500"),
            ("b", "3"),
            ("j", "40"),
            ("k", "45"),
            ("h7", "3 6 30000 7 1000 9 1"),
            ("h8", "1 0 10000 3 1000 8 0 2000 500 3"),
            ("h9", "garbage"),
        ]))
        .unwrap();
        // A debt stores no tokens.
        assert_eq!((s.bucket.credit, s.bucket.tokens()), (Some(-2500), Some(0)));
        let l = s.ledger.unwrap();
        assert_eq!(
            (l.limit, l.committed, l.rates, l.tails, l.demand, l.holders),
            (10, 4, 6, 3, 40000, 2)
        );
        assert!(!l.learning(1) && Ledger { learning_until: 5, ..l }.learning(1));
        assert_eq!(l.shares_learning_until, 300_001);
        assert_eq!(
            (
                l.dry_at,
                l.overflow,
                l.overflow_paid,
                l.overflow_epoch,
                l.joined_at,
                l.grown_at
            ),
            (60, 2000, 500, 3, 40, 45)
        );
        assert_eq!(s.holders.len(), 3);
        assert_eq!(s.holders[2].record, None);
        let r = s.holders[0].record.unwrap();
        assert_eq!(
            (r.commitment, r.rate, r.fallback, r.version, r.live),
            (3, 6, 7, 9, true)
        );
        assert_eq!((r.rate_per_s(), r.fallback_per_s()), (6.0, 7.0));
        assert!(r.has_rate() && !s.holders[1].record.unwrap().has_rate());
        assert_eq!(s.records().count(), 2);
        assert_eq!(Record::parse("1 2 3 4 5 6"), None);
        assert_eq!(Stored::from_hash(Vec::new()), None);
    }
}
