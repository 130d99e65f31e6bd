//! How a failed Redis call reads: an outage (the failure policy applies),
//! silence (see [`crate::wire::silence`]) or a server that refused the
//! configuration ([`misconfigured`]: a typed error, never the failure policy).

use redis::{ErrorKind, RedisError};

use crate::wire::{misconfigured, silence};

/// A failure's text: [`misconfigured`] when the server refused the
/// configuration (see [`misconfiguration_of`]), else the crate's message.
pub(super) fn err_text(e: &RedisError) -> String {
    match misconfiguration_of(e) {
        Some(why) => misconfigured(format_args!("{why} ({})", one_line(e))),
        None => e.to_string(),
    }
}

/// A connection set-up failure's text (`via`: "" or " (via Sentinel)"). The
/// crate's own connect timeout (it may fire before ours) is [`silence`],
/// like ours, not an error.
pub(super) fn connect_err(e: &RedisError, via: &str) -> String {
    match misconfiguration_of(e) {
        Some(why) => misconfigured(format_args!("{why}{via} ({})", one_line(e))),
        None if e.is_timeout() => silence(format_args!("(connect{via}: {e})")),
        None => format!("connect{via}: {e}"),
    }
}

/// The crate's message on one line (a parse error lists the bytes it did
/// not expect, one per line).
pub(super) fn one_line(e: &RedisError) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether the server, reached, refused the configuration rather than
/// failed: what to change, or `None` for an outage (refused connection,
/// timeout, reset, a server loading or failing over). Cluster set-up wraps
/// the node's error in an I/O error, so its text is read as well.
fn misconfiguration_of(e: &RedisError) -> Option<&'static str> {
    let text = e.to_string();
    let has = |s: &str| text.contains(s);
    let code = e.code().unwrap_or("");
    if e.kind() == ErrorKind::AuthenticationFailed
        || matches!(code, "WRONGPASS" | "NOAUTH")
        || has("WRONGPASS")
        || has("NOAUTH")
        || has("invalid username-password")
        || has("Password authentication failed")
        // a server with a password closes on a long unauthenticated command
        || has("unauthenticated multibulk")
    {
        return Some(if code == "NOAUTH" || has("NOAUTH") || has("unauthenticated") {
            "authentication required: the server has a password and the URL gives none \
             (redis://[USER]:PASSWORD@HOST:PORT)"
        } else {
            "authentication failed: the server refused the URL's user name or password"
        });
    }
    if has("refused to switch database") || has("DB index is out of range") || has("invalid DB index") {
        return Some("the server has no database of the URL's index (the path's /DB; most servers have 0 to 15)");
    }
    if has("cluster support disabled") {
        return Some("a redis+cluster:// URL names a server that does not run in cluster mode; use redis://");
    }
    if e.kind() == ErrorKind::Parse || has("Parse error") {
        return Some("the server does not speak the Redis protocol (RESP): is the port a Redis port?");
    }
    if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoPerm) || code == "NOPERM" {
        return Some(
            "the URL's ACL user lacks a permission the scripts need \
             (docs/redis.md, \"Redis permissions\", gives the rule)",
        );
    }
    // Not MasterNameNotFoundBySentinel: the crate says so too while the
    // sentinels fail a dead primary over (the sentinel fleet test).
    None
}
