//! Backend transitions, reported to every binding.

use std::fmt;

/// What happened to the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The backend failed: the failure policy is now in force.
    Degraded,
    /// The backend answered again: back to leasing.
    Recovered,
}

impl EventKind {
    /// `"degraded"` or `"recovered"`, in every binding.
    pub fn as_str(&self) -> &'static str {
        match self {
            EventKind::Degraded => "degraded",
            EventKind::Recovered => "recovered",
        }
    }
}

/// A backend transition with a human-readable message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Which transition.
    pub kind: EventKind,
    /// What happened and what the limiter does now.
    pub message: String,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

/// A registered listener.
pub type Listener = std::sync::Arc<dyn Fn(&Event) + Send + Sync + 'static>;
