//! [`Reservation`]: a request admitted at an estimate of its cost, settled
//! at its actual cost once that is known (tokens of an LLM response, bytes
//! streamed).

use std::sync::atomic::{AtomicBool, Ordering::AcqRel};
use std::sync::Arc;

use crate::decision::Decision;
use crate::engine::entry::Entry;
use crate::engine::Engine;
use crate::error::{Error, Result};

/// A request admitted (or denied) at `estimate` tokens by
/// [`Limiter::reserve`](crate::Limiter::reserve), to be settled once at
/// its actual cost with [`settle`](Self::settle).
///
/// - Settled below the estimate, the difference goes back where it came
///   from (the local lease while its commitment is live, else it is
///   dropped: never more than was granted is held).
/// - Settled above it, the difference is taken from the local lease and,
///   what that does not hold, from the authority's bucket even when that
///   drives it into debt (at most one capacity): later requests of the key
///   wait until the refill has paid it. The overage is charged when it is
///   settled, so the fleet's charged tokens stay within one token bucket's
///   bound.
/// - Dropped (or never settled), it keeps the estimate: nothing is held
///   for it meanwhile, so nothing waits for a timeout.
pub struct Reservation {
    engine: Arc<Engine>,
    key: Box<str>,
    estimate: u64,
    decision: Decision,
    /// The buckets of the key's rules it is settled on (none when denied).
    entries: Vec<Arc<Entry>>,
    settled: AtomicBool,
}

impl Reservation {
    pub(crate) fn new(
        engine: Arc<Engine>,
        key: &str,
        tier: Option<&str>,
        estimate: u64,
        decision: Decision,
    ) -> Result<Self> {
        let entries = engine.reservation_entries(key, tier, &decision, estimate)?;
        Ok(Reservation {
            engine,
            key: key.into(),
            estimate,
            decision,
            entries,
            settled: AtomicBool::new(false),
        })
    }

    /// The decision on the estimate, as `acquire` would have returned it.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Whether the request was admitted at its estimate.
    pub fn allowed(&self) -> bool {
        self.decision.allowed
    }

    /// The tokens reserved.
    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    /// The key reserved on.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether [`settle`](Self::settle) was called (successfully or not).
    pub fn is_settled(&self) -> bool {
        self.settled.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Settle at `actual` tokens (0 when the request used nothing): gives
    /// back `estimate - actual`, or takes `actual - estimate` more (see the
    /// type's documentation). Once only. Errors ([`Error::Reservation`]):
    /// settled already; a denied reservation (nothing was reserved); an
    /// actual so far above the estimate that the bucket could not count
    /// the debt exactly (2^52 credit units: for a 60 000 ms window, about
    /// 75 billion tokens).
    /// [`Error::Closed`] when the limiter was closed (the estimate stands).
    pub fn settle(&self, actual: u64) -> Result<()> {
        if !self.decision.allowed {
            return Err(Error::Reservation(
                "the request was denied, so nothing was reserved; settle only an admitted reservation".into(),
            ));
        }
        let most = self.engine.max_overage(&self.entries);
        if actual.saturating_sub(self.estimate) > most {
            return Err(Error::Reservation(
                format!(
                    "actual {actual} is more than this key can owe: at most {most} tokens beyond the \
                     estimate ({})",
                    self.estimate
                )
                .into(),
            ));
        }
        if self.settled.swap(true, AcqRel) {
            return Err(Error::Reservation(
                "this reservation was settled already; settle each reservation once".into(),
            ));
        }
        self.engine
            .settle_reservation(&self.entries, &self.decision, self.estimate, actual)
    }

    /// The error for an actual cost below 0, in the words every binding uses.
    pub fn negative_actual(actual: i128) -> Error {
        Error::Reservation(format!("actual must be a whole number of tokens, 0 or more (got {actual})").into())
    }
}

impl Drop for Reservation {
    /// Unsettled, it keeps the estimate: its tokens are no longer out.
    fn drop(&mut self) {
        if !self.settled.swap(true, AcqRel) {
            self.engine
                .release_reservation(&self.entries, &self.decision, self.estimate);
        }
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("key", &self.key)
            .field("estimate", &self.estimate)
            .field("decision", &self.decision)
            .field("settled", &self.is_settled())
            .finish()
    }
}
