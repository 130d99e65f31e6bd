//! The failover guard: an authority that lost state (Redis restarted empty,
//! or a replica that missed the last writes promoted) must not hand the
//! fleet a second allowance.
//!
//! Every stored bucket carries a [`Stamp`]: an `epoch` chosen when the
//! bucket is created from nothing, and a `version` counted up by every write.
//! Each answer tells the holder the stamp and how long the bucket will exist
//! at least (`alive_ms`: until it is full again, or while rates it pays for
//! run). With every lease call the holder sends back what it saw and what
//! the authority granted it on the key within the last window ([`Guard`]).
//! The authority has lost state when
//!
//! - the bucket's epoch is not the one the holder saw although the holder's
//!   last answer promised the bucket would still exist (restart empty: the
//!   bucket is created again, with a new epoch), or
//! - the epoch is the same but the version is older than the one the holder
//!   saw (a replica promoted that missed writes: the bucket went back in
//!   time).
//!
//! Then the holder's recent grants are debited again before anything is
//! granted ([`crate::bucket::BucketState::debit`]; what the bucket cannot pay
//! becomes a debt of at most a window). Every holder does so at its first
//! call after the incident, so the re-created bucket holds what the lost one
//! would at most: after any window, the bucket is at least
//! `capacity - granted in that window`, whatever it held at its start. A
//! bucket that expired because it was full again (an idle key) has outlived
//! `alive_ms` and is not taken for a loss.

/// What the authority keeps with a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// Chosen when the bucket was created from nothing (never 0).
    pub epoch: u64,
    /// Writes since then.
    pub version: u64,
}

/// What a holder sends with a lease call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Guard {
    /// The epoch of its last answer on this key (0: none yet).
    pub epoch: u64,
    /// The version of its last answer on this key.
    pub version: u64,
    /// How much longer that answer said the bucket would exist, at least.
    pub alive_ms: u64,
    /// Tokens the authority granted it on this key within the last window
    /// at least (up to a quarter window more: counted in quarter windows).
    pub recent: u64,
    /// The key's live holders at its last answer (adaptive leasing; 0: none).
    pub holders: u64,
    /// The key's overshoot budget in tokens (what a quarantined bucket may
    /// still grant).
    pub budget: u64,
}

/// What the authority answers besides the grant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// The bucket's epoch.
    pub epoch: u64,
    /// The bucket's version after this call's write.
    pub version: u64,
    /// The bucket exists at least this long from the answer.
    pub alive_ms: u64,
    /// This call found the authority had lost state (and re-debited).
    pub lost: bool,
}

impl Stamp {
    /// A bucket created from nothing at `now` (the authority's clock).
    pub fn new(now: u64) -> Self {
        Stamp {
            epoch: now.saturating_add(2),
            version: 0,
        }
    }

    /// Whether a holder's view shows that the authority lost state.
    pub fn lost(&self, g: &Guard) -> bool {
        if g.epoch == 0 {
            return false;
        }
        if g.epoch != self.epoch {
            g.alive_ms > 0
        } else {
            g.version > self.version
        }
    }
}

/// Tokens granted to a holder on one key, counted in quarter windows (the
/// engine's side of [`Guard::recent`]): five slots of (quarter index,
/// tokens), so that the sum covers a whole window and at most a quarter more.
#[derive(Debug, Default)]
pub(crate) struct Recent([(u64, u64); 5]);

impl Recent {
    /// Count `tokens` granted at `now` for a key with window `window_ms`.
    pub fn add(&mut self, tokens: u64, now: u64, window_ms: u64) {
        let q = now / (window_ms / 4).max(1);
        let slot = &mut self.0[(q % 5) as usize];
        if slot.0 != q {
            *slot = (q, 0);
        }
        slot.1 = slot.1.saturating_add(tokens);
    }

    /// Tokens granted within the last window at least (the current quarter
    /// and the four before it: one to one and a quarter windows).
    pub fn sum(&self, now: u64, window_ms: u64) -> u64 {
        let q = now / (window_ms / 4).max(1);
        self.0
            .iter()
            .filter(|(at, _)| *at + 5 > q && *at <= q)
            .map(|(_, n)| *n)
            .fold(0, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_bucket_is_told_from_an_expired_one() {
        let st = Stamp { epoch: 10, version: 5 };
        let seen = |epoch, version, alive_ms| Guard {
            epoch,
            version,
            alive_ms,
            recent: 7,
            holders: 0,
            budget: 0,
        };
        assert!(!st.lost(&seen(0, 0, 0)), "never answered: nothing to compare");
        assert!(!st.lost(&seen(10, 5, 100)), "the bucket as it was left");
        assert!(!st.lost(&seen(10, 3, 100)), "others wrote since");
        assert!(
            st.lost(&seen(10, 6, 100)),
            "older than what the holder saw: writes lost"
        );
        assert!(st.lost(&seen(9, 2, 100)), "re-created while it should exist: lost");
        assert!(
            !st.lost(&seen(9, 2, 0)),
            "re-created after it was full again: an idle key"
        );
        assert_ne!(Stamp::new(0).epoch, 0);
    }

    #[test]
    fn recent_grants_cover_the_last_window() {
        let mut r = Recent::default();
        let w = 1000;
        r.add(3, 0, w);
        r.add(4, 260, w);
        r.add(5, 990, w);
        assert_eq!(r.sum(990, w), 12);
        // a whole window later, the first quarter still counts...
        assert_eq!(r.sum(1000, w), 12);
        r.add(1, 1010, w);
        assert_eq!(r.sum(1010, w), 13);
        // ...and a quarter after that it has left
        assert_eq!(r.sum(1250, w), 10);
        r.add(2, 1260, w);
        assert_eq!(r.sum(1260, w), 12, "the slot of quarter 0 now holds quarter 5");
        assert_eq!(r.sum(5000, w), 0, "all older than a window and a quarter");
        // a window of 1 ms still counts (quarters of at least 1 ms)
        let mut r = Recent::default();
        r.add(2, 7, 1);
        assert_eq!(r.sum(7, 1), 2);
    }
}
