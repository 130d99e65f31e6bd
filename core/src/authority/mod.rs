//! The authority seam: where each key's authoritative token bucket lives.
//!
//! The engine talks to an [`Authority`] in one way for every backend: it
//! hands over a [`Call`] and a [`Done`] callback. The in-memory authority
//! answers inline (the callback has run when `call` returns); the Redis
//! authority queues the call on the process-wide broker, which sends it in a
//! pipelined batch and runs the callback from the broker thread.

use std::sync::Arc;

use arc_swap::ArcSwapOption;

use crate::broker::{self, Broker, Target};
use crate::bucket::{Grant, Policy};
use crate::error::{Error, Result};
use crate::guard::{Guard, Seen};
use crate::ledger::{Answer, Ask};

pub(crate) mod embedded;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(not(feature = "redis"))]
#[path = "redis_disabled.rs"]
pub(crate) mod redis;

pub(crate) use memory::MemoryAuthority;

/// One request to the authority about one key.
#[derive(Clone, Debug)]
pub(crate) enum Call {
    /// Take up to `want` tokens if at least `need` are there; with
    /// `adaptive`, the ledger decides (see [`crate::ledger`]).
    Lease {
        key: String,
        policy: Policy,
        want: u64,
        need: u64,
        now: Now,
        adaptive: Option<Ask>,
        /// What the caller saw of the bucket (the failover guard).
        guard: Guard,
    },
    /// Return `tokens` (capped at capacity) from `holder` (0: none); with
    /// `adaptive`, to the holder's commitment in the ledger.
    GiveBack {
        key: String,
        policy: Policy,
        tokens: u64,
        now: Now,
        holder: u64,
        adaptive: bool,
        /// The holder is closing: with `adaptive`, everything else it has in
        /// the ledger's sums goes too (its demand, fallback share, the spent
        /// rest of its commitment).
        leaving: bool,
    },
    /// Read the stored bucket without changing it.
    Inspect { key: String, policy: Policy, now: Now },
    /// A request to the policy store (never about one bucket). `base` is
    /// the store's Redis key prefix, set when the call is sent.
    Policy { base: String, op: PolicyOp },
}

/// What the policy store is asked: see `docs/policies.md`.
#[derive(Clone, Debug)]
pub(crate) enum PolicyOp {
    /// What changed since version `since` (0: know nothing yet).
    Poll { since: u64 },
    /// The stored entries of these keys.
    Get { keys: Vec<String> },
    /// Set (`Some`) or delete (`None`) a tier's rules (`tier`) or a key's entry.
    Set {
        tier: bool,
        name: String,
        value: Option<String>,
    },
    /// Every stored tier and key entry.
    List,
}

/// Changes kept in the store's log, so a poll can name the keys that changed.
pub(crate) const POLICY_LOG_LEN: u64 = 1024;

/// The policy store's answers.
#[derive(Clone, Debug)]
pub(crate) enum PolicyReply {
    /// `tiers`: every stored tier (`None`: nothing changed since); `changed`:
    /// the keys whose entries changed (`None`: any may have, read again).
    Poll {
        version: u64,
        keys: u64,
        tiers: Option<Vec<(String, String)>>,
        changed: Option<Vec<String>>,
    },
    Values(Vec<Option<String>>),
    Version(u64),
    List {
        version: u64,
        tiers: Vec<(String, String)>,
        keys: Vec<(String, String)>,
    },
}

impl PolicyReply {
    /// Read a poll's log (newest first, `"t NAME"` / `"k KEY"`) into the keys that changed.
    pub fn changed_keys(log: &[String]) -> Vec<String> {
        let mut keys: Vec<String> = log
            .iter()
            .filter_map(|l| l.strip_prefix("k ").map(str::to_string))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

/// The caller's clock reading; `explicit` when the authority must use it
/// instead of its own clock (manual clocks in deterministic tests).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Now {
    pub ms: u64,
    pub explicit: bool,
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl Now {
    /// The time a Redis script is told: `None` means Redis `TIME`.
    pub fn for_script(self) -> Option<u64> {
        self.explicit.then_some(self.ms)
    }
}

/// What the stored bucket holds, for `inspect`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stored {
    /// Whole tokens stored (`None`: no bucket stored, which reads as full).
    pub tokens: Option<u64>,
    /// Clock reading of the last refill.
    pub refilled_at_ms: Option<u64>,
    /// Milliseconds until the stored bucket expires (Redis only).
    pub ttl_ms: Option<u64>,
}

/// The answer to a [`Call`], variant by variant.
#[derive(Clone, Debug)]
pub(crate) enum Reply {
    /// A chunk (possibly empty), for adaptive calls the rest of the answer,
    /// and the bucket's stamp (the failover guard).
    Grant(Grant, Option<Answer>, Seen),
    /// A give-back was taken.
    Returned,
    Stored(Stored),
    Policy(PolicyReply),
}

/// The ledger script's lease reply as a [`Reply`].
pub(crate) fn ledger_reply(r: &[i64]) -> Result<Reply, String> {
    let ((granted, remaining, wait_ms), answer, (epoch, version, alive_ms, lost)) =
        crate::ledger::parse(r).ok_or_else(|| format!("unexpected reply from the ledger script: {r:?}"))?;
    Ok(Reply::Grant(
        Grant {
            granted,
            remaining,
            wait_ms,
        },
        Some(answer),
        Seen {
            epoch,
            version,
            alive_ms,
            lost,
        },
    ))
}

/// Receives the answer to one call exactly once.
pub(crate) type Done = Box<dyn FnOnce(std::result::Result<Reply, String>) + Send>;

/// A Redis backend seen from one limiter: where its calls go.
pub(crate) struct Remote {
    target: Target,
    prefix: String,
    /// The broker link (cached; replaced after a fork).
    link: ArcSwapOption<broker::Link>,
    /// The policy store's link: its own batch loop and connection.
    policy_link: ArcSwapOption<broker::Link>,
}

/// Where a limiter's keys have their authoritative buckets.
pub(crate) enum Authority {
    /// In this process: answers inline.
    Memory(Arc<MemoryAuthority>),
    /// Redis (single node or cluster), through the process-wide broker.
    Remote(Remote),
}

impl Authority {
    pub fn remote(target: Target, prefix: &str) -> Self {
        Authority::Remote(Remote {
            target,
            prefix: prefix.to_string(),
            link: ArcSwapOption::empty(),
            policy_link: ArcSwapOption::empty(),
        })
    }

    /// True when calls are answered before [`Authority::call`] returns.
    #[inline]
    pub fn is_inline(&self) -> bool {
        matches!(self, Authority::Memory(_))
    }

    /// Send `call`; `done` receives the answer (inline for memory).
    /// `Err` only when the call could not be sent (then `done` is dropped).
    pub fn call(&self, call: Call, done: Done) -> Result<()> {
        match self {
            Authority::Memory(m) => {
                done(m.answer(call));
                Ok(())
            }
            Authority::Remote(r) => r.send(call, done),
        }
    }

    /// The broker this authority's calls run on (Redis only).
    pub fn broker(&self) -> Option<Result<Arc<Broker>>> {
        match self {
            Authority::Memory(_) => None,
            Authority::Remote(r) => Some(r.link().map(|l| l.broker.clone())),
        }
    }
}

impl Remote {
    fn link(&self) -> Result<Arc<broker::Link>> {
        Self::cached(&self.link, &self.target)
    }

    fn cached(slot: &ArcSwapOption<broker::Link>, target: &Target) -> Result<Arc<broker::Link>> {
        if let Some(l) = slot.load_full() {
            if l.is_current() {
                return Ok(l);
            }
        }
        let l = Arc::new(broker::link(target)?);
        slot.store(Some(l.clone()));
        Ok(l)
    }

    fn send(&self, mut call: Call, done: Done) -> Result<()> {
        let store = matches!(call, Call::Policy { .. });
        let key = call.key_mut();
        *key = if store {
            policy_base(&self.prefix)
        } else {
            redis_key(&self.prefix, key)
        };
        let link = if store {
            let target = Target {
                lane: broker::Lane::Policies,
                ..self.target.clone()
            };
            Self::cached(&self.policy_link, &target)?
        } else {
            self.link()?
        };
        link.send(call, done).map_err(|_| Error::Closed)
    }
}

impl Call {
    /// The key the call is about.
    fn key_mut(&mut self) -> &mut String {
        match self {
            Call::Lease { key, .. } | Call::GiveBack { key, .. } | Call::Inspect { key, .. } => key,
            Call::Policy { base, .. } => base,
        }
    }
}

/// The prefix of the policy store's Redis keys, apart from every bucket's
/// (`{prefix}:{<key>}`) and under the same `{prefix}:*` ACL pattern; one hash
/// tag, so Redis Cluster keeps the whole store in one slot
/// (`ql:policy:{~}:tiers`, `:keys`, `:version`, `:log`).
pub fn policy_base(prefix: &str) -> String {
    format!("{prefix}:policy:{{~}}")
}

/// The Redis key of a limiter key: hash-tagged, so Redis Cluster keeps every
/// structure of one key in one slot.
pub fn redis_key(prefix: &str, key: &str) -> String {
    format!("{prefix}:{{{key}}}")
}
