//! Bounded waits: `acquire` with a deadline waits for tokens instead of
//! denying (from the local lease, a rate grant or the bucket's refill), in
//! arrival order among the waiters of one key in this process.
//!
//! A key's waiters queue on a fair (FIFO) async mutex; the one at the head
//! asks the engine as a plain `acquire` would and, while it is denied with
//! a hint that falls before its deadline, sleeps until the hint and asks
//! again. A denial whose hint falls past the deadline is returned at once:
//! waiting could not change it. The waits run on the broker's runtime, so
//! no caller's event loop blocks; a blocking caller parks its own thread.
//!
//! Each waiting request counts once in the key's demand and metrics: the
//! denials it met while waiting are taken back, and its outcome counts.

use std::collections::HashMap;
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{lock, Engine};
use crate::decision::{Decision, Reason};
use crate::error::Result;

/// One key's waiters, in arrival order.
type Queue = Arc<tokio::sync::Mutex<()>>;

/// The queues of the keys that have waiters now.
#[derive(Default)]
pub(crate) struct Waits {
    queues: Mutex<HashMap<Box<str>, Queue>>,
}

impl Waits {
    /// Drop every queue (after a fork: the parent's waiters are not here).
    pub(crate) fn forget(&self) {
        lock(&self.queues).clear();
    }
}

impl Engine {
    /// Whether requests of `key` wait in this process now.
    fn has_waiters(&self, key: &str) -> bool {
        lock(&self.waits.queues).contains_key(key)
    }

    /// How many requests of `key` wait in this process now (tests).
    pub fn waiters(&self, key: &str) -> usize {
        // The map holds one reference; each waiter holds another.
        lock(&self.waits.queues)
            .get(key)
            .map_or(0, |q| Arc::strong_count(q).saturating_sub(1))
    }

    /// The decision of `acquire` for `key` with a wait of up to `wait`, or
    /// `None` when it needs the waiting path: the key has waiters (a newcomer
    /// queues behind them) or no local tokens.
    pub fn acquire_wait_now(&self, key: &str, cost: u64, tier: Option<&str>) -> Result<Option<Decision>> {
        // After a fork, before the queues are read (`check_fork` drops them).
        self.check_open()?;
        if self.has_waiters(key) {
            return Ok(None);
        }
        self.admit_local(key, cost, tier)
    }

    /// The waiting path: queue behind the key's waiters, then ask until
    /// admitted, denied for good, or past `wait`.
    pub async fn acquire_wait(&self, key: &str, cost: u64, tier: Option<&str>, wait: Duration) -> Result<Decision> {
        let deadline = Instant::now() + wait;
        let queue = {
            let mut queues = lock(&self.waits.queues);
            queues.entry(key.into()).or_default().clone()
        };
        let out = {
            let turn = tokio::time::timeout_at(deadline, queue.lock()).await;
            match turn {
                // `_head` holds the queue's head until the decision is made.
                Ok(_head) => self.wait_at_head(key, cost, tier, deadline).await,
                // Still queued at the deadline: one last look, as `try_acquire`.
                Err(_) => self.acquire_once(key, cost, tier, false).await,
            }
        };
        drop(queue);
        self.leave_queue(key);
        out
    }

    /// Forget `key`'s queue when its last waiter left.
    fn leave_queue(&self, key: &str) {
        let mut queues = lock(&self.waits.queues);
        if queues.get(key).is_some_and(|q| Arc::strong_count(q) == 1) {
            queues.remove(key);
        }
    }

    async fn wait_at_head(&self, key: &str, cost: u64, tier: Option<&str>, deadline: Instant) -> Result<Decision> {
        loop {
            let d = self.acquire_once(key, cost, tier, true).await?;
            if d.allowed || !retryable(d.reason) {
                return Ok(d);
            }
            let hint = Duration::from_millis(d.retry_after_ms.max(1));
            if Instant::now() + hint > deadline {
                return Ok(d);
            }
            // This denial was not the request's last word: it counts once,
            // by its outcome.
            self.forget_denial(key);
            tokio::time::sleep(hint).await;
        }
    }

    /// One decision as `acquire` (`waiting`) or `try_acquire` would make it.
    async fn acquire_once(&self, key: &str, cost: u64, tier: Option<&str>, waiting: bool) -> Result<Decision> {
        if let Some(d) = self.admit_local(key, cost, tier)? {
            return Ok(d);
        }
        if waiting {
            self.acquire_slow_async(key, cost, super::Waiting::Yes, tier).await
        } else {
            self.acquire_slow(key, cost, super::Waiting::No, tier)
        }
    }

    /// Take back the count of one denial of `key` (on its own entry, where
    /// requests are counted).
    fn forget_denial(&self, key: &str) {
        if let Some(e) = self.table.get(key) {
            let _ = e.denied.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
        }
    }
}

/// Denials that time can turn into an admission. A deny entry (`blocked`)
/// stays until an operator removes it: no wait changes it.
fn retryable(r: Reason) -> bool {
    !matches!(r, Reason::Blocked)
}
