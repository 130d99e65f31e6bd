//! Which rules a key is held to: plan tiers, the policy store's and file's
//! per-key entries, `set_limit`, and keeping every entry in step when one
//! of them changes. See docs/policies.md.
//!
//! The admit path reads two things of this: the entry's `mark` (how its
//! rules were chosen; a call naming another tier goes to the cold path,
//! which resolves again) and, for a call naming a tier, the tier's id in the
//! current [`TierMap`] (one map lookup). Everything else here runs on the
//! cold path or on the broker's ticker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

mod store;

use super::entry::{Entry, ACCESS_BLOCKED, ACCESS_UNLIMITED, MARK_DEFAULT, MARK_PINNED, MARK_SUB, MORE_CALENDAR};
use super::{lock, Engine};
use crate::error::{Error, Result};
use crate::policy::file::PolicyFile;
use crate::policy::{rule_key, Access, Assignment, Origin, PolicySource, Rules, Tier};

/// What names the bucket of a key's permits in flight (after the key; the
/// separator is refused in keys callers give).
pub(crate) const IN_FLIGHT_SUFFIX: &str = "\u{1f}inflight";
const _: () = assert!(IN_FLIGHT_SUFFIX.len() <= crate::keys::MAX_BUCKET_SUFFIX);

/// One tier as the limiter knows it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TierDef {
    /// Stable for the limiter's life (an entry's `mark`).
    pub id: u32,
    pub rules: Rules,
    pub origin: Origin,
}

/// Every tier: the configuration's, redefined by the policy file's, by the store's.
#[derive(Default, Debug, PartialEq, Eq)]
pub(crate) struct TierMap {
    by_name: HashMap<Box<str>, TierDef, foldhash::fast::RandomState>,
}

impl TierMap {
    #[inline]
    pub fn get(&self, name: &str) -> Option<&TierDef> {
        self.by_name.get(name)
    }

    /// The tier with this id (`None` for the marks that are no tier's).
    pub fn get_by_id(&self, id: u32) -> Option<&str> {
        if id == MARK_DEFAULT || id == MARK_PINNED || id == MARK_SUB {
            return None;
        }
        self.name_of(id)
    }

    fn name_of(&self, id: u32) -> Option<&str> {
        self.by_name.iter().find(|(_, d)| d.id == id).map(|(n, _)| &**n)
    }

    fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.by_name.keys().map(|k| &**k).collect();
        v.sort_unstable();
        v
    }
}

/// A key's rules and how they were chosen.
#[derive(Clone, Debug)]
pub(crate) struct Resolution {
    pub rules: Rules,
    pub mark: u32,
    pub source: PolicySource,
}

/// The limiter's policy state.
pub(crate) struct Policies {
    pub tiers: ArcSwap<TierMap>,
    ids: Mutex<HashMap<String, u32>>,
    config_tiers: Vec<Tier>,
    default_tier: Mutex<Option<String>>,
    file: Mutex<Option<PolicyFile>>,
    /// The store's tiers at the last poll (each the last good definition).
    store_tiers: Mutex<Vec<Tier>>,
    /// The store's entries of keys asked for: `None`, the store has none.
    cache: Mutex<HashMap<String, Option<Assignment>>>,
    /// The store's version at the last poll, and how many key entries it holds.
    version: AtomicU64,
    store_keys: AtomicU64,
    /// The first poll was answered (or failed: then the store is skipped
    /// until a poll succeeds).
    polled: AtomicBool,
    polling: AtomicBool,
    last_poll: AtomicU64,
    /// The store did not answer the last poll (logged once per outage).
    unreachable: AtomicBool,
    /// Polls answered (for `refresh_policies`).
    polls: AtomicU64,
}

impl Policies {
    pub fn new(cfg: &crate::Config, file: Option<PolicyFile>) -> Policies {
        let p = Policies {
            tiers: ArcSwap::from_pointee(TierMap::default()),
            ids: Mutex::new(HashMap::new()),
            config_tiers: cfg.tiers.clone(),
            default_tier: Mutex::new(cfg.default_tier.clone().or_else(|| file.as_ref()?.default_tier.clone())),
            file: Mutex::new(file),
            store_tiers: Mutex::new(Vec::new()),
            cache: Mutex::new(HashMap::new()),
            version: AtomicU64::new(0),
            store_keys: AtomicU64::new(0),
            polled: AtomicBool::new(false),
            polling: AtomicBool::new(false),
            last_poll: AtomicU64::new(0),
            unreachable: AtomicBool::new(false),
            polls: AtomicU64::new(0),
        };
        p.rebuild();
        p
    }

    /// Rebuild the tier map; true when it changed.
    fn rebuild(&self) -> bool {
        let mut ids = lock(&self.ids);
        let mut map = TierMap::default();
        let file_tiers = lock(&self.file).as_ref().map(|f| f.tiers.clone()).unwrap_or_default();
        let store = lock(&self.store_tiers).clone();
        let layers = [
            (self.config_tiers.clone(), Origin::Config),
            (file_tiers, Origin::File),
            (store, Origin::Store),
        ];
        for (tiers, origin) in layers {
            for t in tiers {
                let next = ids.len() as u32;
                let id = *ids.entry(t.name.clone()).or_insert(next);
                map.by_name.insert(
                    t.name.into_boxed_str(),
                    TierDef {
                        id,
                        rules: t.rules,
                        origin,
                    },
                );
            }
        }
        if **self.tiers.load() == map {
            return false;
        }
        self.tiers.store(Arc::new(map));
        true
    }

    fn file_entry(&self, key: &str) -> Option<Assignment> {
        lock(&self.file).as_ref()?.keys.get(key).cloned()
    }

    /// Every tier's name and definition now, sorted by name.
    pub fn tier_list(&self) -> Vec<(String, Rules, Origin)> {
        let map = self.tiers.load();
        map.names()
            .into_iter()
            .filter_map(|n| map.get(n).map(|d| (n.to_string(), d.rules, d.origin)))
            .collect()
    }
}

impl Engine {
    /// The id of the tier named `name`, for the admit path's check.
    #[inline]
    pub(super) fn tier_id(&self, name: &str) -> Result<u32> {
        match self.policies.tiers.load().get(name) {
            Some(d) => Ok(d.id),
            None => Err(self.unknown_tier(name)),
        }
    }

    #[cold]
    fn unknown_tier(&self, name: &str) -> Error {
        let map = self.policies.tiers.load();
        let known = map.names().join(", ");
        Error::UnknownTier {
            name: name.into(),
            known: known.into(),
        }
    }

    /// Whether `e`'s rules were chosen for a call naming `tier`.
    #[inline(always)]
    pub(super) fn rules_fit(&self, e: &Entry, tier: Option<&str>) -> Result<bool> {
        let mark = e.mark.load(Relaxed);
        if mark == MARK_PINNED {
            return Ok(true);
        }
        let want = match tier {
            None => MARK_DEFAULT,
            Some(t) => self.tier_id(t)?,
        };
        Ok(want == mark)
    }

    /// The rules `key` is held to on a call naming `tier`, and why; all in
    /// shadow mode when the limiter is.
    pub(crate) fn resolve(&self, key: &str, tier: Option<&str>) -> Result<Resolution> {
        let mut r = self.resolve_rules(key, tier)?;
        if !self.r.adaptive && (r.rules.has_calendar() || r.rules.concurrency().is_some()) {
            // (the limiter's own rules were checked when it was built: this
            // is a tier or entry of the policy store or file)
            return Err(Error::config("tiers", crate::config::CALENDAR_NEEDS_LEDGER));
        }
        if self.r.cfg.shadow && r.source.access.is_none() {
            r.rules = r.rules.with_shadow(true);
        }
        Ok(r)
    }

    fn resolve_rules(&self, key: &str, tier: Option<&str>) -> Result<Resolution> {
        if let Some(base) = key.strip_suffix(IN_FLIGHT_SUFFIX) {
            // a key's permits in flight: its rules' `"N concurrent"` (its
            // own entry's, the call's tier's or its assigned tier's), else
            // the limiter's `concurrency`; chosen again as its key's are
            let r = self.resolve_rules(base, tier)?;
            let n = r.rules.concurrency().unwrap_or(self.r.cfg.concurrency);
            if n == 0 {
                return Err(Error::config(
                    "concurrency",
                    "is 0 and the key's rules set none (\"5 concurrent\"), so this key takes no permits: \
                     set the limiter's concurrency, or a concurrency in the key's tier",
                ));
            }
            return Ok(Resolution {
                rules: Rules::one(crate::bucket::Quota {
                    limit: n,
                    ..self.r.in_flight_policy()
                }),
                mark: r.mark,
                source: r.source,
            });
        }
        if let Some(p) = lock(&self.overrides).get(key) {
            return Ok(Resolution {
                rules: Rules::one(*p),
                mark: MARK_PINNED,
                source: PolicySource {
                    tier: None,
                    assigned_by: Origin::SetLimit,
                    defined_by: Origin::SetLimit,
                    access: None,
                },
            });
        }
        let map = self.policies.tiers.load();
        let stored = lock(&self.policies.cache).get(key).cloned().flatten();
        let own = stored
            .map(|a| (a, Origin::Store))
            .or_else(|| self.policies.file_entry(key).map(|a| (a, Origin::File)));
        if let Some((a, by)) = own {
            match a {
                // Held to no rule; its decisions report the limiter's own.
                Assignment::Access(access) => {
                    return Ok(Resolution {
                        rules: Rules::one(self.r.policy()),
                        mark: MARK_PINNED,
                        source: PolicySource {
                            tier: None,
                            assigned_by: by,
                            defined_by: by,
                            access: Some(access),
                        },
                    })
                }
                Assignment::Rules(rules) => {
                    return Ok(Resolution {
                        rules,
                        mark: MARK_PINNED,
                        source: PolicySource {
                            tier: None,
                            assigned_by: by,
                            defined_by: by,
                            access: None,
                        },
                    })
                }
                Assignment::Tier(name) => match map.get(&name) {
                    Some(d) => {
                        return Ok(Resolution {
                            rules: d.rules,
                            mark: MARK_PINNED,
                            source: PolicySource {
                                tier: Some(name),
                                assigned_by: by,
                                defined_by: d.origin,
                                access: None,
                            },
                        })
                    }
                    None => tracing::error!(
                        key,
                        tier = %name,
                        "quotalease: the {} puts this key in a tier nobody defines; the key keeps the tier its caller names or the default",
                        by.as_str()
                    ),
                },
            }
        }
        if let Some(name) = tier {
            let d = map.get(name).ok_or_else(|| self.unknown_tier(name))?;
            return Ok(Resolution {
                rules: d.rules,
                mark: d.id,
                source: PolicySource {
                    tier: Some(name.to_string()),
                    assigned_by: Origin::Caller,
                    defined_by: d.origin,
                    access: None,
                },
            });
        }
        let default = lock(&self.policies.default_tier).clone();
        if let Some(d) = default.as_deref().and_then(|n| map.get(n)) {
            return Ok(Resolution {
                rules: d.rules,
                mark: MARK_DEFAULT,
                source: PolicySource {
                    tier: default,
                    assigned_by: Origin::Default,
                    defined_by: d.origin,
                    access: None,
                },
            });
        }
        Ok(Resolution {
            rules: Rules::one(self.r.policy()),
            mark: MARK_DEFAULT,
            source: PolicySource {
                tier: None,
                assigned_by: Origin::Config,
                defined_by: Origin::Config,
                access: None,
            },
        })
    }

    /// The entry of `key` with its rules chosen for a call naming `tier`
    /// (the cold path: resolves and applies when they do not fit).
    pub(super) fn entry_for(&self, key: &str, tier: Option<&str>) -> Result<Arc<Entry>> {
        if let Some(e) = self.table.get(key) {
            if self.rules_fit(&e, tier)? && self.subs_present(&e) {
                return Ok(e);
            }
            let r = self.resolve(key, tier)?;
            self.apply_rules(&e, key, &r);
            return Ok(e);
        }
        let r = self.resolve(key, tier)?;
        let e = self.entry_with(key, r.rules.first(), false);
        self.apply_rules(&e, key, &r);
        Ok(e)
    }

    /// Every further rule's bucket of `e` is in the table (a bucket that
    /// left it is retired).
    fn subs_present(&self, e: &Entry) -> bool {
        e.subs[..e.further()]
            .iter()
            .all(|s| s.load().as_ref().is_some_and(|s| !s.retired.load(Acquire)))
    }

    /// `e` and the buckets of its further rules, in rule order (created if
    /// evicted), with the rules.
    pub(super) fn rule_entries(&self, e: &Arc<Entry>) -> Vec<Arc<Entry>> {
        let more = e.further();
        let mut out = Vec::with_capacity(more + 1);
        out.push(e.clone());
        for slot in &e.subs[..more] {
            let Some(s) = slot.load_full() else { continue };
            // Evicted (retired): the table's bucket of the same key and rule,
            // created again if it has none.
            let s = if s.retired.load(Acquire) {
                let again = self.entry_with(&s.key, s.policy(), true);
                slot.store(Some(again.clone()));
                again
            } else {
                s
            };
            out.push(s);
        }
        out
    }

    /// Hold `e` (the entry of `key`) to `r`'s rules: its own policy changes
    /// as with `set_limit`; further rules get (or keep) their buckets.
    pub(super) fn apply_rules(&self, e: &Arc<Entry>, key: &str, r: &Resolution) {
        self.set_entry_policy(e, r.rules.first());
        let extra = &r.rules.as_slice()[1..];
        for (j, p) in extra.iter().enumerate() {
            let s = self.entry_with(&rule_key(key, p), *p, true);
            self.set_entry_policy(&s, *p);
            e.subs[j].store(Some(s));
        }
        for sub in &e.subs[extra.len()..] {
            sub.store(None);
        }
        e.rule_set.store(crate::policy::RuleSet::of(&r.rules).0, Release);
        e.shadow.store(r.rules.is_shadow(), Release);
        let access = match r.source.access {
            None => 0,
            Some(Access::Unlimited) => ACCESS_UNLIMITED,
            Some(Access::Blocked) => ACCESS_BLOCKED,
        };
        // An allow or deny entry: the local tokens go back, and from here on
        // every request is decided on the cold path (grants landing later go
        // back too: `apply_grant` checks after adding, this swaps after setting).
        if e.access.swap(access, AcqRel) != access && access != 0 {
            let back = e.tokens.swap(0, AcqRel);
            self.give_back(e, r.rules.first(), back);
        }
        let calendar = if r.rules.has_calendar() { MORE_CALENDAR } else { 0 };
        e.more.store(extra.len() as u8 | calendar, Release);
        e.mark.store(r.mark, Release);
    }
}
