//! Cheap fork detection: a `pthread_atfork` child handler bumps a generation
//! counter; a limiter compares it with its own on every call (one atomic load).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Once;

static GENERATION: AtomicU64 = AtomicU64::new(1);

extern "C" fn in_child() {
    GENERATION.fetch_add(1, Relaxed);
}

/// Install the handler (once per process) and return the current generation.
pub(crate) fn generation() -> u64 {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: registers a handler that only does an atomic add, which is
        // async-signal-safe and valid in a freshly forked child.
        unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        }
    });
    GENERATION.load(Relaxed)
}

/// The current generation, without installing anything.
#[inline]
pub(crate) fn current() -> u64 {
    GENERATION.load(Relaxed)
}
