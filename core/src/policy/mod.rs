//! Policies: the rules a key is held to, plan tiers, and where a key's
//! policy comes from.
//!
//! A **rule** is one token bucket (`limit` tokens per `window_ms`); a key's
//! **rules** are one to [`MAX_RULES`] of them, and a request is admitted
//! only when every rule admits it. A **tier** is a named set of rules
//! (`free = "100/min"`, `pro = "6000/min, 1000000/day"`). A key's rules come
//! from, first to last: `set_limit` in this process, the key's entry in the
//! policy store (a tier or its own rules), the tier the caller names, the
//! default tier, the limiter's `limit`/`window_ms`.
//!
//! Each rule has its own bucket. The first rule's bucket is the key's own
//! (so a key's state survives any change of its first rule, as with
//! `set_limit`); a further rule's bucket is named by the key and the rule's
//! window ([`rule_key`]), so its state survives every change that keeps its
//! window. Rules of one key must have distinct windows.
//!
//! Rules may be in **shadow mode** (`"shadow 100/min"`, or the limiter's
//! `shadow` option): they are counted and decided as usual, but a request
//! they deny is admitted (reason `shadow`, counted in `shadow_denied`).

use std::fmt;

use crate::bucket::Quota;
use crate::error::{Error, Result};
use crate::rate::{parse_quota, validate_policy};

pub mod file;

/// Most rules one key can be held to.
pub const MAX_RULES: usize = 4;

/// Separates a key from a further rule's window in that rule's bucket key.
pub const RULE_SEPARATOR: char = '\u{1f}';

/// The rules of one key: one to [`MAX_RULES`] buckets, all of which must
/// admit a request. Plain data (`Copy`), so a [`crate::Decision`] carries it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rules {
    len: u8,
    shadow: bool,
    /// Requests of a key in flight at once (`"5 concurrent"`; 0: the
    /// limiter's `concurrency`).
    concurrency: u32,
    rules: [Quota; MAX_RULES],
}

const NO_RULE: Quota = Quota::new(0, 0);

impl Rules {
    /// One rule.
    pub const fn one(p: Quota) -> Rules {
        Rules {
            len: 1,
            shadow: false,
            concurrency: 0,
            rules: [p, NO_RULE, NO_RULE, NO_RULE],
        }
    }

    /// Rules from a list: one to [`MAX_RULES`] valid policies with distinct
    /// windows. `field` names the option or argument in errors.
    pub fn new(list: &[Quota], field: &'static str) -> Result<Rules> {
        if list.is_empty() {
            return Err(Error::config(field, "needs at least one rule, like \"100/min\""));
        }
        if list.len() > MAX_RULES {
            return Err(Error::config(
                field,
                format!("has {} rules; at most {MAX_RULES} are allowed", list.len()),
            ));
        }
        let mut out = Rules::one(NO_RULE);
        for (i, p) in list.iter().enumerate() {
            let p = validate_policy(p.limit, p.window_ms)
                .map(|q| Quota {
                    calendar: p.calendar,
                    ..q
                })
                .map_err(|e| match e {
                    Error::Config { reason, .. } => Error::config(field, reason),
                    e => e,
                })?;
            if list[..i].iter().any(|q| q.window_ms == p.window_ms) {
                return Err(Error::config(
                    field,
                    format!(
                        "has two rules with a window of {} ms; keep one rule per window (the stricter one)",
                        p.window_ms
                    ),
                ));
            }
            out.rules[i] = p;
        }
        out.len = list.len() as u8;
        Ok(out)
    }

    /// Parse `"10/s, 10000/day"`: rates separated by commas (see
    /// [`parse_quota`]: calendar quotas too), optionally after the word
    /// `shadow` (`"shadow 100/min"`: the rules are in shadow mode), and
    /// optionally one concurrency limit among them (`"100/min, 5
    /// concurrent"`: see [`crate::Limiter::acquire_concurrent`]). `field`
    /// names the option in errors.
    pub fn parse(text: &str, field: &'static str) -> Result<Rules> {
        let text = text.trim();
        let (shadow, text) = match text.strip_prefix(SHADOW) {
            Some(rest) if rest.starts_with(char::is_whitespace) => (true, rest),
            _ => (false, text),
        };
        let mut list = Vec::new();
        let mut concurrency = 0u32;
        for part in text.split(',') {
            if let Some(n) = part.trim().strip_suffix(CONCURRENT) {
                let bad = || {
                    Error::config(
                        field,
                        format!(
                            "has {:?}: a concurrency limit is a whole number of requests from 1 to \
                             {MAX_CONCURRENCY}, then \"{CONCURRENT}\", once per tier, like \"5 {CONCURRENT}\"",
                            part.trim()
                        ),
                    )
                };
                let n: u32 = n.trim().parse().map_err(|_| bad())?;
                if n == 0 || n > MAX_CONCURRENCY || concurrency != 0 {
                    return Err(bad());
                }
                concurrency = n;
                continue;
            }
            let q = parse_quota(part).map_err(|e| match e {
                Error::Config { reason, .. } => Error::config(field, reason),
                e => e,
            })?;
            list.push(q);
        }
        Ok(Rules {
            concurrency,
            ..Rules::new(&list, field)?.with_shadow(shadow)
        })
    }

    /// The concurrency limit the rules set (`"5 concurrent"`), if any.
    pub fn concurrency(&self) -> Option<u64> {
        (self.concurrency > 0).then_some(self.concurrency as u64)
    }

    /// The same rules, in shadow mode or enforced.
    pub const fn with_shadow(self, shadow: bool) -> Rules {
        Rules { shadow, ..self }
    }

    /// Whether the rules are in shadow mode: a request they deny is
    /// admitted (reason `shadow`) and counted in `shadow_denied`.
    #[inline]
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// The rules, first to last.
    #[inline]
    pub fn as_slice(&self) -> &[Quota] {
        &self.rules[..self.len as usize]
    }

    /// How many rules.
    #[inline]
    #[allow(clippy::len_without_is_empty)] // never empty
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether any rule is a calendar quota.
    pub fn has_calendar(&self) -> bool {
        self.as_slice().iter().any(|p| p.calendar.is_some())
    }

    /// The first rule (the key's own bucket).
    #[inline]
    pub fn first(&self) -> Quota {
        self.rules[0]
    }
}

impl fmt::Debug for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rules({self})")
    }
}

/// The word before rules in shadow mode.
const SHADOW: &str = "shadow";

/// The word after a concurrency limit among rules (`"5 concurrent"`).
const CONCURRENT: &str = "concurrent";

/// The largest concurrency limit rules may set.
const MAX_CONCURRENCY: u32 = 1_000_000_000;

/// `"10/s, 10000/day"` (`"shadow 10/s, 10000/day"` in shadow mode): the
/// form [`Rules::parse`] reads.
impl fmt::Display for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shadow {
            write!(f, "{SHADOW} ")?;
        }
        for (i, p) in self.as_slice().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match p.calendar.spec() {
                Some(c) => write!(f, "{}/{c}", p.limit)?,
                None => write!(f, "{}/{}", p.limit, window_text(p.window_ms))?,
            }
        }
        if self.concurrency > 0 {
            write!(f, ", {} {CONCURRENT}", self.concurrency)?;
        }
        Ok(())
    }
}

/// A window as a rate's denominator: `s`, `30s`, `min`, `hour`, `day`, `250ms`.
pub fn window_text(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(86_400_000, "day"), (3_600_000, "hour"), (60_000, "min"), (1_000, "s")];
    for (unit, name) in UNITS {
        if ms % unit == 0 {
            let n = ms / unit;
            return if n == 1 { name.to_string() } else { format!("{n}{name}") };
        }
    }
    format!("{ms}ms")
}

/// The name of a rule in the RateLimit headers: `"default"` when a key has
/// one rule, else its window (`"1s"`, `"1day"`, `"30s"`).
pub fn rule_name(rules: &Rules, p: &Quota) -> String {
    if rules.len() == 1 {
        "default".to_string()
    } else if let Some(c) = p.calendar.spec() {
        format!("1{}", c.period.name())
    } else {
        let w = window_text(p.window_ms);
        if w.starts_with(|c: char| c.is_ascii_digit()) {
            w
        } else {
            format!("1{w}")
        }
    }
}

/// The bucket key of a further rule: the key, [`RULE_SEPARATOR`] and the
/// rule's window in milliseconds (a calendar quota's: its calendar, like
/// `month@Europe/Berlin`, so it never shares a bucket with a token bucket).
pub fn rule_key(key: &str, p: &Quota) -> String {
    match p.calendar.spec() {
        Some(c) => format!("{key}{RULE_SEPARATOR}{c}"),
        None => format!("{key}{RULE_SEPARATOR}{}", p.window_ms),
    }
}

/// A key's rules as a [`crate::Decision`] carries them: 0 for one rule (the
/// decision's own `limit` and `window_ms`), else the index of a set of
/// several rules in this process's table of such sets. Sets enter the table
/// when a key is first held to them (the cold path), so the admit path only
/// copies the index. Read it with [`crate::Decision::rules`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RuleSet(pub(crate) u32);

/// Distinct sets of several rules a process keeps ids for; beyond it a
/// decision names only its binding rule (`RuleSet(0)`).
pub const MAX_RULE_SETS: usize = 1 << 16;

type SetIds = std::sync::Mutex<std::collections::HashMap<Rules, u32>>;
type Sets = papaya::HashMap<u32, &'static Rules>;

fn rule_sets() -> &'static (SetIds, Sets) {
    static SETS: std::sync::OnceLock<(SetIds, Sets)> = std::sync::OnceLock::new();
    SETS.get_or_init(Default::default)
}

impl RuleSet {
    /// The id of `rules` (0 for one rule), entering it in the table if new.
    pub(crate) fn of(rules: &Rules) -> RuleSet {
        if rules.len() <= 1 && !rules.has_calendar() {
            return RuleSet(0);
        }
        let (ids, sets) = rule_sets();
        let mut ids = ids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = ids.get(rules) {
            return RuleSet(*id);
        }
        if ids.len() >= MAX_RULE_SETS {
            return RuleSet(0);
        }
        let id = ids.len() as u32 + 1;
        // Bounded by MAX_RULE_SETS sets of 72 bytes: kept for the process's life.
        let leaked: &'static Rules = Box::leak(Box::new(*rules));
        sets.pin().insert(id, leaked);
        ids.insert(*rules, id);
        RuleSet(id)
    }

    /// The set with this id (`None` for 0: one rule).
    pub fn get(self) -> Option<&'static Rules> {
        if self.0 == 0 {
            return None;
        }
        rule_sets().1.pin().get(&self.0).copied()
    }
}

/// One plan tier: a name and its rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tier {
    /// The tier's name (`free`, `pro`).
    pub name: String,
    /// What a key in this tier is held to.
    pub rules: Rules,
}

/// Check a tier's name: 1 to 64 bytes of letters, digits, `_`, `-`, `.`.
pub fn validate_tier_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::config(
            "tier",
            format!("names are 1 to 64 letters, digits, '_', '-' or '.' (got {name:?})"),
        ))
    }
}

/// Parse the `tiers` option: `"free=100/min; pro=6000/min, 1000000/day"`
/// (tiers separated by `;`, each `name=rules`).
pub fn parse_tiers(text: &str) -> Result<Vec<Tier>> {
    let mut out: Vec<Tier> = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, rules) = part.split_once('=').ok_or_else(|| {
            Error::config(
                "tiers",
                format!("each tier is name=rules, like \"pro=6000/min, 1000000/day\" (got {part:?})"),
            )
        })?;
        let name = name.trim();
        validate_tier_name(name).map_err(|e| match e {
            Error::Config { reason, .. } => Error::config("tiers", reason),
            e => e,
        })?;
        if out.iter().any(|t| t.name == name) {
            return Err(Error::config("tiers", format!("names tier {name:?} twice")));
        }
        out.push(Tier {
            name: name.to_string(),
            rules: Rules::parse(rules, "tiers")?,
        });
    }
    Ok(out)
}

/// What the policy store (or a policy file) says of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Assignment {
    /// The key is in this tier.
    Tier(String),
    /// The key has rules of its own.
    Rules(Rules),
    /// The key is exempt (`unlimited`) or blocked (`blocked`).
    Access(Access),
}

/// An allow or deny entry: a key held to no rule at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Every request is admitted (reason `unlimited`), spending nothing.
    Unlimited,
    /// Every request is denied (reason `blocked`), even in shadow mode.
    Blocked,
}

impl Access {
    /// `unlimited` or `blocked`: the stored form and the reason's name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Access::Unlimited => "unlimited",
            Access::Blocked => "blocked",
        }
    }
}

impl Assignment {
    /// Parse the stored form: `tier:NAME`, rules (`"10/s, 1000/day"`),
    /// `unlimited` or `blocked`.
    pub fn parse(text: &str) -> Result<Assignment> {
        let text = text.trim();
        for a in [Access::Unlimited, Access::Blocked] {
            if text == a.as_str() {
                return Ok(Assignment::Access(a));
            }
        }
        if let Some(name) = text.strip_prefix("tier:") {
            let name = name.trim();
            validate_tier_name(name)?;
            return Ok(Assignment::Tier(name.to_string()));
        }
        Rules::parse(text, "policy").map(Assignment::Rules)
    }
}

/// The stored form [`Assignment::parse`] reads.
impl fmt::Display for Assignment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Assignment::Tier(t) => write!(f, "tier:{t}"),
            Assignment::Rules(r) => write!(f, "{r}"),
            Assignment::Access(a) => f.write_str(a.as_str()),
        }
    }
}

/// Where a definition came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// The limiter's configuration (`limit`/`window_ms`, `tiers`).
    Config,
    /// The policy file (`policy_file`).
    File,
    /// The shared policy store (Redis, or the `memory://` authority).
    Store,
    /// `set_limit` in this process.
    SetLimit,
    /// The caller named the tier (`acquire_with(key, cost, Some(tier))`).
    Caller,
    /// The limiter's `default_tier` (or the policy file's).
    Default,
}

impl Origin {
    /// `config`, `file`, `store`, `set_limit`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Origin::Config => "config",
            Origin::File => "file",
            Origin::Store => "store",
            Origin::SetLimit => "set_limit",
            Origin::Caller => "caller",
            Origin::Default => "default_tier",
        }
    }
}

/// Why a key is held to its rules, for `inspect` and the CLI: the tier (if
/// any) and where the deciding definition came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySource {
    /// The key's tier, if its rules are a tier's.
    pub tier: Option<String>,
    /// Where the key's assignment came from: `set_limit`, the store or file
    /// entry of the key, or `Config` for a tier the caller named / the default.
    pub assigned_by: Origin,
    /// Where the rules themselves are defined (the tier's definition, or the
    /// assignment's own rules).
    pub defined_by: Origin,
    /// An allow or deny entry of the key (`assigned_by` says whose): it
    /// holds the key to no rule.
    pub access: Option<Access>,
}

impl fmt::Display for PolicySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(a) = self.access {
            return write!(f, "{} (from {})", a.as_str(), self.assigned_by.as_str());
        }
        match &self.tier {
            Some(t) => write!(
                f,
                "tier {t} (assigned by {}, defined in {})",
                self.assigned_by.as_str(),
                self.defined_by.as_str()
            ),
            None => write!(f, "own rules (from {})", self.defined_by.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_print_and_validate() {
        let r = Rules::parse("10/s, 10000/day", "tiers").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r.to_string(), "10/s, 10000/day");
        assert_eq!(Rules::parse(&r.to_string(), "x").unwrap(), r);
        assert_eq!(Rules::parse("100/30s", "x").unwrap().to_string(), "100/30s");
        let e = Rules::parse("10/s, 20/s", "tiers").unwrap_err().to_string();
        assert!(
            e.contains("`tiers`") && e.contains("two rules with a window of 1000 ms"),
            "{e}"
        );
        let e = Rules::parse("1/s,1/2s,1/3s,1/4s,1/5s", "tiers")
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 4"), "{e}");
        let e = Rules::parse("ten/s", "policy").unwrap_err().to_string();
        assert!(e.contains("`policy`"), "{e}");
        assert!(Rules::parse("", "x").is_err());
    }

    #[test]
    fn shadow_rules_parse_print_and_differ_from_enforced_ones() {
        let s = Rules::parse("  shadow 10/s, 10000/day", "tiers").unwrap();
        assert!(s.is_shadow());
        assert_eq!(s.to_string(), "shadow 10/s, 10000/day");
        assert_eq!(Rules::parse(&s.to_string(), "x").unwrap(), s);
        let enforced = Rules::parse("10/s, 10000/day", "x").unwrap();
        assert!(!enforced.is_shadow());
        assert_ne!(s, enforced);
        assert_eq!(s.with_shadow(false), enforced);
        assert_eq!(s.as_slice(), enforced.as_slice());
        for bad in ["shadow", "shadow ", "shadow10/s", "10/s shadow", "shadow shadow 1/s"] {
            let e = Rules::parse(bad, "tiers").unwrap_err().to_string();
            assert!(e.contains("`tiers`"), "{bad}: {e}");
        }
        let t = parse_tiers("beta=shadow 50/min; pro=6000/min").unwrap();
        assert!(t[0].rules.is_shadow() && !t[1].rules.is_shadow());
        assert_eq!(
            Assignment::parse("shadow 5/s").unwrap(),
            Assignment::Rules(Rules::parse("5/s", "x").unwrap().with_shadow(true))
        );
    }

    #[test]
    fn tiers_parse() {
        let t = parse_tiers("free=100/min; pro = 6000/min, 1000000/day ;").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].name, "pro");
        assert_eq!(t[1].rules.to_string(), "6000/min, 1000000/day");
        for bad in ["free", "free=100/min; free=5/s", "b@d=1/s", "x=1/s,1/s"] {
            let e = parse_tiers(bad).unwrap_err();
            assert!(e.to_string().contains("`tiers`"), "{bad}: {e}");
        }
    }

    #[test]
    fn assignments_round_trip() {
        assert_eq!(
            Assignment::parse(" blocked ").unwrap(),
            Assignment::Access(Access::Blocked)
        );
        assert_eq!(
            Assignment::parse("unlimited").unwrap(),
            Assignment::Access(Access::Unlimited)
        );
        assert!(
            Assignment::parse("Blocked").is_err(),
            "the words are lower case, as stored"
        );
        for text in ["tier:pro", "10/s, 1000/day", "shadow 1/s", "unlimited", "blocked"] {
            assert_eq!(Assignment::parse(text).unwrap().to_string(), text);
        }
        assert!(Assignment::parse("tier:").is_err());
        assert!(Assignment::parse("garbage").is_err());
    }

    #[test]
    fn names_in_headers() {
        let two = Rules::parse("10/s, 1000/day", "x").unwrap();
        let names: Vec<String> = two.as_slice().iter().map(|p| rule_name(&two, p)).collect();
        assert_eq!(names, ["1s", "1day"]);
        let one = Rules::parse("100/30s", "x").unwrap();
        assert_eq!(rule_name(&one, &one.first()), "default");
    }

    #[test]
    fn a_concurrency_limit_among_rules_parses_and_prints() {
        let r = Rules::parse(" 10/s , 3 concurrent, 1000/day ", "tiers").unwrap();
        assert_eq!((r.len(), r.concurrency()), (2, Some(3)));
        assert_eq!(r.to_string(), "10/s, 1000/day, 3 concurrent");
        assert_eq!(Rules::parse(&r.to_string(), "x").unwrap(), r);
        assert_eq!(Rules::parse("10/s", "x").unwrap().concurrency(), None);
        assert!(Rules::parse("3 concurrent", "x").is_err(), "a rate too");
    }
}
