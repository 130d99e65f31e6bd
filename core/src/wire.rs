//! The wire between the engine and an authority: one [`Call`] about one key
//! (or the policy store), its [`Reply`], and the [`Done`] callback that
//! receives it. A leaf: the broker carries these without knowing who
//! answers them, and every authority answers them.

use crate::bucket::{Grant, Quota};
use crate::guard::{Guard, Seen};
use crate::ledger::{Answer, Ask};

/// One request to the authority about one key.
#[derive(Clone, Debug)]
pub(crate) enum Call {
    /// Take up to `want` tokens if at least `need` are there; with
    /// `adaptive`, the ledger decides (see [`crate::ledger`]).
    Lease {
        key: String,
        policy: Quota,
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
        policy: Quota,
        tokens: u64,
        now: Now,
        holder: u64,
        adaptive: bool,
        /// The holder is closing: with `adaptive`, everything else it has in
        /// the ledger's sums goes too (its demand, fallback share, the spent
        /// rest of its commitment).
        leaving: bool,
        /// With `adaptive`: the last lease call whose answer the holder had
        /// applied when it gave back. The ledger ends only a rate that such
        /// a call set: one set by a later call runs on at the holder when
        /// that answer lands (docs/design.md, "Lost replies").
        seen: u64,
        /// Which tokens: see [`Back`].
        what: Back,
        /// The holder's tuning (with `adaptive`: the ledger's arguments).
        tuning: crate::ledger::Tuning,
    },
    /// Read the stored bucket without changing it.
    Inspect { key: String, policy: Quota, now: Now },
    /// A request to the policy store (never about one bucket). `base` is
    /// the store's Redis key prefix, set when the call is sent.
    Policy { base: String, op: PolicyOp },
    /// `check()`: connect and run the probe script, which reads (never
    /// writes) `key` through the script path leases take.
    Check { key: String },
}

/// What a [`Call::GiveBack`] moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Back {
    /// Unspent tokens the holder held (of its commitment, with `adaptive`).
    Held,
    /// Take `tokens` instead (a reservation settled above its estimate):
    /// what the bucket cannot pay becomes a debt that its refill pays first.
    Debit,
}

impl Back {
    /// The ledger script's op for a give-back call: "g" (held tokens
    /// back), "x" (and the holder leaves), "d" (a debit).
    pub(crate) fn ledger_op(self, leaving: bool) -> &'static str {
        match self {
            Back::Held if leaving => "x",
            Back::Held => "g",
            Back::Debit => "d",
        }
    }
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
    /// The time of day (Unix ms) when `ms` was read: where calendar
    /// quotas' boundaries are computed.
    pub wall_ms: u64,
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl Now {
    /// The time a Redis script is told: `None` means Redis `TIME`.
    pub fn for_script(self) -> Option<u64> {
        self.explicit.then_some(self.ms)
    }

    /// What [`crate::ledger::args`] reads of it.
    pub fn parts(self) -> (u64, bool, u64) {
        (self.ms, self.explicit, self.wall_ms)
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
    /// A [`Call::Check`] went through.
    Checked,
}

/// How a failure that is the backend's refusal of the configuration begins
/// (see [`misconfigured`]).
const MISCONFIGURED: &str = "misconfigured: ";

/// The failure of a call the backend refused because of the configuration
/// (credentials, database, scheme, protocol, ACL), not because it is away:
/// the engine answers such a failure with [`crate::Error::Misconfigured`]
/// instead of its failure policy. `reason` says what to change.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn misconfigured(reason: impl std::fmt::Display) -> String {
    format!("{MISCONFIGURED}{reason}")
}

/// The reason of a [`misconfigured`] failure text (`None`: any other failure).
pub(crate) fn misconfiguration(err: &str) -> Option<&str> {
    err.strip_prefix(MISCONFIGURED)
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
///
/// A call that got no reply in time fails with a text made by [`silence`]:
/// the circuit tells silence (perhaps a slow authority) from an error.
pub(crate) type Done = Box<dyn FnOnce(std::result::Result<Reply, String>) + Send>;

/// How every "no reply in time" failure begins (see [`silence`]).
const SILENCE: &str = "timed out";

/// The failure of a call that got no reply within `backend_timeout_ms`
/// (`detail` says which wait, e.g. "after 250 ms").
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn silence(detail: std::fmt::Arguments) -> String {
    format!("{SILENCE} {detail}")
}

/// Whether a failed call's text says silence rather than an error.
pub(crate) fn is_silence(err: &str) -> bool {
    err.starts_with(SILENCE)
}

/// How the failure of a call that certainly never reached the authority
/// ends (see [`unsent`]).
const UNSENT: &str = " (not sent)";

/// The failure `err` of a call that certainly never reached the authority
/// (no connection could be opened before anything was written, or the
/// authority is down in a simulated outage): the authority's state is as
/// if the call had not been made.
pub(crate) fn unsent(err: String) -> String {
    if is_unsent(&err) {
        err
    } else {
        err + UNSENT
    }
}

/// Whether a failed call certainly never reached the authority.
pub(crate) fn is_unsent(err: &str) -> bool {
    err.ends_with(UNSENT)
}
