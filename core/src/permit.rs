//! [`Permit`]: one of a key's requests in flight, counted against the
//! limiter's `concurrency` across the fleet until it is released.

use std::sync::Arc;

use crate::decision::Decision;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::reservation::Reservation;

/// A request in flight on a key, from
/// [`Limiter::acquire_concurrent`](crate::Limiter::acquire_concurrent):
/// admitted while fewer than the key's concurrency limit of its requests
/// are in flight across the fleet. [`release`](Self::release) it when the request
/// ends; a permit dropped unreleased is released then.
///
/// A permit is a reservation of one token of the key's permit bucket,
/// settled at 0 when released: held at this instance meanwhile (and
/// reported held at every lease call, which renews its commitment), free
/// again for every instance once released. An instance that dies holding
/// permits frees them when its commitment expires at the authority.
pub struct Permit {
    inner: Reservation,
    key: Box<str>,
}

impl Permit {
    pub(crate) fn new(
        engine: Arc<Engine>,
        key: &str,
        bucket: &str,
        tier: Option<&str>,
        decision: Decision,
    ) -> Result<Self> {
        Ok(Permit {
            inner: Reservation::new(engine, bucket, tier, 1, decision)?,
            key: key.into(),
        })
    }

    /// The decision, as `acquire` would have returned it: `limit` is the
    /// key's `concurrency`, `remaining` the permits left.
    pub fn decision(&self) -> Decision {
        self.inner.decision()
    }

    /// Whether the request may go ahead (a permit was taken).
    pub fn allowed(&self) -> bool {
        self.inner.allowed()
    }

    /// The key the permit is for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether [`release`](Self::release) was called.
    pub fn is_released(&self) -> bool {
        self.inner.is_settled()
    }

    /// Release the permit: the key may have one more request in flight.
    /// Once only. Errors ([`Error::Reservation`]): released already; a
    /// denied permit (nothing was taken). [`Error::Closed`] when the
    /// limiter was closed.
    pub fn release(&self) -> Result<()> {
        if !self.allowed() {
            return Err(Error::Reservation(
                "the request was denied, so no permit was taken; release only an admitted permit".into(),
            ));
        }
        if self.inner.is_settled() {
            return Err(Error::Reservation(
                "this permit was released already; release each permit once".into(),
            ));
        }
        self.inner.settle(0)
    }
}

impl Drop for Permit {
    /// Unreleased, it is released now.
    fn drop(&mut self) {
        if self.allowed() && !self.inner.is_settled() {
            let _ = self.inner.settle(0);
        }
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.key)
            .field("decision", &self.decision())
            .field("released", &self.is_released())
            .finish()
    }
}
