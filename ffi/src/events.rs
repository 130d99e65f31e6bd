//! Backend events (degraded / recovered) delivered to a C callback.

use std::ffi::{c_char, c_void, CString};
use std::sync::{Arc, Mutex};

use quotalease::{Event, EventKind};

/// Which backend transition happened.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lease_event_kind {
    /// The backend failed: the failure policy is now in force.
    LEASE_EVENT_DEGRADED = 0,
    /// The backend answers again: back to leasing.
    LEASE_EVENT_RECOVERED = 1,
}

/// A backend-event callback: `user` is the pointer given at registration,
/// `message` a NUL-terminated description valid only during the call.
pub type lease_event_callback =
    Option<unsafe extern "C" fn(user: *mut c_void, kind: lease_event_kind, message: *const c_char)>;

/// The registered callback of one limiter (or none).
pub(crate) struct Sink {
    cb: lease_event_callback,
    user: *mut c_void,
}

// SAFETY: the user pointer is handed back to the caller's callback only; the
// caller promised (lease_set_event_callback's contract) that it may be used
// from the broker thread.
unsafe impl Send for Sink {}

pub(crate) type SharedSink = Arc<Mutex<Sink>>;

pub(crate) fn new_sink() -> SharedSink {
    Arc::new(Mutex::new(Sink {
        cb: None,
        user: std::ptr::null_mut(),
    }))
}

pub(crate) fn set(sink: &SharedSink, cb: lease_event_callback, user: *mut c_void) {
    let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
    s.cb = cb;
    s.user = user;
}

/// Deliver one event. The lock is held during the call, so once
/// `lease_set_event_callback` or `lease_limiter_free` returns, the old
/// callback is not running and will not run again.
pub(crate) fn deliver(sink: &SharedSink, e: &Event) {
    let s = sink.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(cb) = s.cb {
        let kind = match e.kind {
            EventKind::Degraded => lease_event_kind::LEASE_EVENT_DEGRADED,
            EventKind::Recovered => lease_event_kind::LEASE_EVENT_RECOVERED,
        };
        let msg = CString::new(e.message.replace('\0', "\\0")).unwrap_or_default();
        // SAFETY: the callback and its user pointer were registered together
        // by the caller, who promised they stay valid while registered.
        unsafe { cb(s.user, kind, msg.as_ptr()) };
    }
}
