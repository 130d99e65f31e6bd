//! The backend circuit: closed while the authority answers, open after an
//! error or timeout; while open, callers apply the failure policy and one
//! probe at a time is let through with exponential backoff.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// First probe delay after the circuit opens, and the cap of the backoff.
const BACKOFF_MIN_MS: u64 = 50;
const BACKOFF_MAX_MS: u64 = 1_000;
/// A probe outstanding this long is presumed lost and another may go out.
const PROBE_STALE_MS: u64 = 2_000;

pub(crate) struct Circuit {
    open: AtomicBool,
    probing: AtomicBool,
    probe_since: AtomicU64,
    next_probe: AtomicU64,
    backoff: AtomicU64,
    /// Clock reading of the last failure: the answers of one failed round
    /// trip arrive at one instant and count as one failure.
    last_failure: AtomicU64,
    /// Clock reading when the circuit last opened.
    opened_at: AtomicU64,
}

/// A change of state the caller must report (log, metric, event).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    Opened,
    Closed,
}

impl Default for Circuit {
    fn default() -> Self {
        Circuit {
            open: AtomicBool::new(false),
            probing: AtomicBool::new(false),
            probe_since: AtomicU64::new(0),
            next_probe: AtomicU64::new(0),
            backoff: AtomicU64::new(BACKOFF_MIN_MS),
            last_failure: AtomicU64::new(u64::MAX),
            opened_at: AtomicU64::new(0),
        }
    }
}

impl Circuit {
    #[inline]
    pub fn is_open(&self) -> bool {
        self.open.load(Relaxed)
    }

    /// Milliseconds until the next probe may go out (0 when closed or due).
    pub fn ms_to_probe(&self, now: u64) -> u64 {
        if !self.is_open() {
            return 0;
        }
        self.next_probe.load(Relaxed).saturating_sub(now)
    }

    /// While open: true for exactly one caller once the backoff has passed.
    pub fn take_probe(&self, now: u64) -> bool {
        if !self.is_open() || now < self.next_probe.load(Relaxed) {
            return false;
        }
        if !self.probing.swap(true, AcqRel) {
            self.probe_since.store(now, Relaxed);
            return true;
        }
        // A probe that never reported back (its key already had a request in
        // flight, or the request was lost) must not stop probing for good.
        if now.saturating_sub(self.probe_since.load(Relaxed)) >= PROBE_STALE_MS {
            self.probe_since.store(now, Relaxed);
            return true;
        }
        false
    }

    pub fn on_success(&self) -> Option<Transition> {
        self.probing.store(false, Release);
        self.backoff.store(BACKOFF_MIN_MS, Relaxed);
        self.open.swap(false, AcqRel).then_some(Transition::Closed)
    }

    pub fn on_failure(&self, now: u64) -> Option<Transition> {
        if self.last_failure.swap(now, AcqRel) == now && self.is_open() {
            return None;
        }
        let backoff = self.backoff.load(Relaxed);
        self.next_probe.store(now + backoff, Relaxed);
        self.backoff.store((backoff * 2).min(BACKOFF_MAX_MS), Relaxed);
        self.probing.store(false, Release);
        if self.is_open() {
            return None;
        }
        self.opened_at.store(now, Relaxed);
        (!self.open.swap(true, AcqRel)).then_some(Transition::Opened)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_probes_with_backoff_and_closes() {
        let c = Circuit::default();
        assert!(!c.take_probe(0));
        assert_eq!(c.on_failure(100), Some(Transition::Opened));
        // the other answers of the same failed round trip change nothing
        assert_eq!(c.on_failure(100), None);
        assert_eq!(c.ms_to_probe(100), 50);
        // a later failure doubles the backoff: next probe at 101 + 100
        assert_eq!(c.on_failure(101), None);
        assert!(!c.take_probe(200));
        assert!(c.take_probe(201));
        assert!(!c.take_probe(200), "only one probe at a time");
        assert_eq!(c.on_failure(201), None);
        assert_eq!(c.ms_to_probe(201), 200);
        assert!(c.take_probe(401));
        assert_eq!(c.on_success(), Some(Transition::Closed));
        assert!(!c.is_open());
        assert_eq!(c.on_success(), None);
    }
}
