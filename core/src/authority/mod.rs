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
use crate::error::{Error, Result};

pub(crate) mod batch;

pub(crate) mod embedded;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(not(feature = "redis"))]
#[path = "redis_disabled.rs"]
pub(crate) mod redis;

pub(crate) use crate::wire::*;
pub(crate) use memory::MemoryAuthority;

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
        let l = Arc::new(broker::link(target, batch::spawn)?);
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
            Call::Lease { key, .. } | Call::GiveBack { key, .. } | Call::Inspect { key, .. } | Call::Check { key } => {
                key
            }
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
