//! Time for the limiter. The admit path reads a coarse atomic clock (no
//! syscall); the broker's ticker and every cold path refresh it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

/// One epoch for every system clock of the process, so limiters sharing a
/// `memory://NAME` authority read the same time.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

use crate::config::ClockKind;

pub(crate) struct Clock {
    now: AtomicU64,
    manual: bool,
    epoch: Instant,
    /// How far the authority's clock is from this one (tests only: a jump
    /// of the authority's clock, `testing::jump_authority_clock`).
    #[cfg(feature = "test-util")]
    shift: std::sync::atomic::AtomicI64,
}

impl Clock {
    pub fn new(kind: ClockKind) -> Self {
        match kind {
            ClockKind::System => Clock {
                now: AtomicU64::new(1),
                manual: false,
                epoch: epoch(),
                #[cfg(feature = "test-util")]
                shift: Default::default(),
            },
            ClockKind::Manual { start_ms } => Clock {
                now: AtomicU64::new(start_ms),
                manual: true,
                epoch: epoch(),
                #[cfg(feature = "test-util")]
                shift: Default::default(),
            },
        }
    }

    pub fn is_manual(&self) -> bool {
        self.manual
    }

    /// The last reading: good to a few milliseconds, costs one atomic load.
    #[inline]
    pub fn coarse(&self) -> u64 {
        self.now.load(Relaxed)
    }

    /// A fresh reading (also refreshes the coarse one).
    pub fn precise(&self) -> u64 {
        if self.manual {
            return self.now.load(Relaxed);
        }
        let t = 1 + self.epoch.elapsed().as_millis() as u64;
        self.now.fetch_max(t, Relaxed);
        t
    }

    /// The time of day as Unix ms, for calendar quotas: a manual clock's
    /// reading is taken as one (so tests set a date with `clock_start_ms`).
    pub fn wall(&self) -> u64 {
        if self.manual {
            return self.now.load(Relaxed);
        }
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    /// The authority's reading at this clock's reading `ms`: the same but in
    /// tests that jumped the authority's clock.
    #[inline]
    pub fn authority(&self, ms: u64) -> u64 {
        #[cfg(feature = "test-util")]
        {
            ms.saturating_add_signed(self.shift.load(Relaxed))
        }
        #[cfg(not(feature = "test-util"))]
        {
            ms
        }
    }

    /// Jump the authority's clock by `ms` (a manual clock only; false
    /// otherwise): every later call tells the authority its time that far
    /// from this clock's.
    #[cfg(feature = "test-util")]
    pub fn jump_authority(&self, ms: i64) -> bool {
        if !self.manual {
            return false;
        }
        self.shift.fetch_add(ms, Relaxed);
        true
    }

    /// Move a manual clock forward. Returns false for the system clock.
    pub fn advance(&self, ms: u64) -> bool {
        if !self.manual {
            return false;
        }
        self.now.fetch_add(ms, Relaxed);
        true
    }
}
