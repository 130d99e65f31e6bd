//! Typed errors. Every binding maps [`ErrorKind`] to its own exception or
//! status code, so the same mistake reads the same way in every language.

/// Everything that can go wrong when building or calling a limiter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A configuration value is invalid; `field` names the option.
    #[error("invalid configuration: `{field}` {reason}")]
    Config {
        /// The option's name, as in docs/design.md (`limit`, `lease_size`, `url`, ...).
        field: &'static str,
        /// What is wrong and what would be accepted.
        reason: String,
    },
    /// An option name that does not exist (set by name, e.g. from a binding's
    /// keyword arguments); kind [`ErrorKind::Config`].
    #[error("invalid configuration: unknown option `{name}`{}", suggest(.suggestion))]
    UnknownOption {
        /// The name as given.
        name: Box<str>,
        /// The closest known option, spelled like `name` (snake or camel case).
        suggestion: Option<Box<str>>,
    },
    /// The key is empty, too long or not valid for the backend.
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// The cost is 0 or larger than the key's limit (it could never be admitted).
    #[error("invalid cost {cost}: must be at least 1 and at most the key's limit ({limit})")]
    InvalidCost {
        /// The cost asked for.
        cost: u64,
        /// The key's limit.
        limit: u64,
    },
    /// A call named a tier that neither the configuration, the policy file
    /// nor the store defines; kind [`ErrorKind::Config`].
    #[error("invalid configuration: unknown tier {name:?} ({}); define it in `tiers`, the policy file or the store", known_tiers(.known))]
    UnknownTier {
        /// The tier as named.
        name: Box<str>,
        /// The tiers known, comma-separated.
        known: Box<str>,
    },
    /// The limiter was closed; build a new one.
    #[error("the limiter is closed; create a new Limiter")]
    Closed,
    /// The backend failed (only for calls that must reach it, such as
    /// `flush()`; `acquire` never fails for a backend error: it applies the
    /// failure policy instead).
    #[error("backend error: {0}")]
    Backend(String),
    /// The backend is reachable but refuses this configuration: wrong
    /// credentials, a database index it does not have, a cluster URL at a
    /// server that is not in a cluster (or the reverse), a port that does not
    /// speak the Redis protocol, an ACL user lacking a permission the scripts
    /// need. Not an outage, so no failure policy hides it: `acquire` (once
    /// its local tokens are spent) and `check` return it for as long as the
    /// backend answers this way; the next successful call clears it.
    #[error("misconfigured backend {backend}: {reason}")]
    Misconfigured {
        /// The URL, redacted as [`crate::redact_url`] prints it.
        backend: Box<str>,
        /// What the backend refused and what to change (credentials removed).
        reason: Box<str>,
    },
    /// A reservation cannot be settled so: it was settled already, it was
    /// denied (nothing was reserved), or the actual cost is not a whole
    /// number of tokens, 0 or more (see [`crate::Reservation::settle`]).
    #[error("invalid settle: {0}")]
    Reservation(Box<str>),
}

/// The category of an [`Error`], stable across languages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// [`Error::Config`]
    Config,
    /// [`Error::InvalidKey`]
    InvalidKey,
    /// [`Error::InvalidCost`]
    InvalidCost,
    /// [`Error::Closed`]
    Closed,
    /// [`Error::Backend`]
    Backend,
    /// [`Error::Misconfigured`]
    Misconfigured,
    /// [`Error::Reservation`]
    Reservation,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 7] = [
        ErrorKind::Config,
        ErrorKind::InvalidKey,
        ErrorKind::InvalidCost,
        ErrorKind::Closed,
        ErrorKind::Backend,
        ErrorKind::Misconfigured,
        ErrorKind::Reservation,
    ];

    /// The kind's name in every binding: `config`, `invalid_key`,
    /// `invalid_cost`, `closed`, `backend`, `misconfigured`, `reservation`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorKind::Config => "config",
            ErrorKind::InvalidKey => "invalid_key",
            ErrorKind::InvalidCost => "invalid_cost",
            ErrorKind::Closed => "closed",
            ErrorKind::Backend => "backend",
            ErrorKind::Misconfigured => "misconfigured",
            ErrorKind::Reservation => "reservation",
        }
    }
}

impl Error {
    /// The error's category.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Config { .. } | Error::UnknownOption { .. } | Error::UnknownTier { .. } => ErrorKind::Config,
            Error::InvalidKey(_) => ErrorKind::InvalidKey,
            Error::InvalidCost { .. } => ErrorKind::InvalidCost,
            Error::Closed => ErrorKind::Closed,
            Error::Backend(_) => ErrorKind::Backend,
            Error::Misconfigured { .. } => ErrorKind::Misconfigured,
            Error::Reservation(_) => ErrorKind::Reservation,
        }
    }

    /// The error of a failed backend call whose text is `err` (as the
    /// broker hands it over, credentials already removed): the backend's
    /// refusal of the configuration ([`Error::Misconfigured`], naming `url`
    /// redacted) when the connection classified it so, else [`Error::Backend`].
    pub(crate) fn of_backend(err: &str, url: &str) -> Self {
        match crate::wire::misconfiguration(err) {
            Some(reason) => Error::Misconfigured {
                backend: crate::redact::redact_url(url).into(),
                reason: reason.into(),
            },
            None => Error::Backend(err.to_string()),
        }
    }

    /// A configuration error. Any `scheme://...` in the reason, and any
    /// quoted value holding `@`, is shown as [`crate::redact_url`] shows it:
    /// a value echoed back (`got "..."`) may be a Redis URL with its
    /// password (with or without its scheme), given to the wrong field.
    pub(crate) fn config(field: &'static str, reason: impl Into<String>) -> Self {
        Error::Config {
            field,
            reason: crate::redact::redact_config_text(&reason.into()),
        }
    }
}

fn known_tiers(known: &str) -> String {
    if known.is_empty() {
        "no tiers are defined".into()
    } else {
        format!("known tiers: {known}")
    }
}

fn suggest(s: &Option<Box<str>>) -> String {
    match s {
        Some(s) => format!("; did you mean `{s}`?"),
        None => format!("; the options are {}", crate::option_names::OPTION_NAMES.join(", ")),
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    #[test]
    fn errors_stay_small() {
        // `acquire` returns Result<Decision>: a larger error costs every
        // admitted request a larger copy (measured: 206 -> 245 instructions).
        assert!(std::mem::size_of::<super::Error>() <= 40);
    }

    #[test]
    fn an_unknown_tier_names_the_known_ones_or_says_there_are_none() {
        let e = |known: &str| super::Error::UnknownTier {
            name: "gold".into(),
            known: known.into(),
        };
        assert_eq!(
            e("free, pro").to_string(),
            "invalid configuration: unknown tier \"gold\" (known tiers: free, pro); \
             define it in `tiers`, the policy file or the store"
        );
        assert_eq!(
            e("").to_string(),
            "invalid configuration: unknown tier \"gold\" (no tiers are defined); \
             define it in `tiers`, the policy file or the store"
        );
    }
}
