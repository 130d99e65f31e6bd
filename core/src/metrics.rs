//! Counters with the names docs/design.md fixes, and their Prometheus exposition.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::error::{Error, Result};

/// A snapshot of a limiter's counters. Same names in every language.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
    /// Authority calls (lease and give-back scripts; one per key per call,
    /// even when several go out in one pipelined round trip).
    pub backend_calls: u64,
    /// Authority calls that failed or timed out.
    pub backend_errors: u64,
    /// Tokens granted by the authority: chunks, and rate-grant tokens as
    /// they accrue locally.
    pub tokens_leased: u64,
    /// Tokens given back to the authority.
    pub tokens_returned: u64,
    /// Leased tokens dropped locally unused (lease TTL, eviction, fork); tokens
    /// given back by `flush()` count in `tokens_returned` only.
    pub tokens_expired: u64,
    /// 1 while the failure policy is in force, else 0.
    pub fallback_active: u64,
    /// Times the limiter entered or left the failure policy.
    pub fallback_transitions: u64,
    /// Keys tracked locally now.
    pub keys_tracked: u64,
    /// Tokens this instance holds unspent now: its share of the fleet's
    /// overshoot bound (summed over instances, the fleet's bound).
    pub overshoot_bound: u64,
    /// Requests admitted only because their rules are in shadow mode (each
    /// is counted in `denied` too: `denied` is what the rules decided).
    pub shadow_denied: u64,
    /// Tokens reserved requests used beyond their estimate, charged when
    /// they were settled (from the local lease, else as a debt at the authority).
    pub tokens_debited: u64,
}

impl Metrics {
    /// Every metric as (name, help, is_counter, value), in a fixed order.
    pub fn fields(&self) -> [(&'static str, &'static str, bool, u64); 13] {
        [
            ("admitted", "Requests admitted.", true, self.admitted),
            ("denied", "Requests denied.", true, self.denied),
            ("backend_calls", "Authority script calls.", true, self.backend_calls),
            (
                "backend_errors",
                "Authority calls that failed or timed out.",
                true,
                self.backend_errors,
            ),
            (
                "tokens_leased",
                "Tokens granted by the authority.",
                true,
                self.tokens_leased,
            ),
            (
                "tokens_returned",
                "Tokens given back to the authority.",
                true,
                self.tokens_returned,
            ),
            (
                "tokens_expired",
                "Leased tokens dropped locally unused.",
                true,
                self.tokens_expired,
            ),
            (
                "fallback_active",
                "1 while the backend failure policy is in force.",
                false,
                self.fallback_active,
            ),
            (
                "fallback_transitions",
                "Entries into and exits from the failure policy.",
                true,
                self.fallback_transitions,
            ),
            ("keys_tracked", "Keys tracked locally.", false, self.keys_tracked),
            (
                "overshoot_bound",
                "Leased tokens held unspent: this instance's share of the overshoot bound.",
                false,
                self.overshoot_bound,
            ),
            (
                "shadow_denied",
                "Requests the rules denied, admitted in shadow mode.",
                true,
                self.shadow_denied,
            ),
            (
                "tokens_debited",
                "Tokens settled reservations used beyond their estimate.",
                true,
                self.tokens_debited,
            ),
        ]
    }

    /// Prometheus text exposition, every name prefixed `quotalease_`.
    pub fn prometheus(&self) -> String {
        render(&[(*self, String::new())])
    }

    /// [`prometheus`](Self::prometheus) with `labels` on every sample
    /// (`[("limiter", "api")]` gives `quotalease_admitted_total{limiter="api"} 7`).
    /// Label names follow the Prometheus data model (`[a-zA-Z_][a-zA-Z0-9_]*`,
    /// not starting with `__`, each once); values are escaped. Several
    /// limiters in one exposition: [`prometheus_text`].
    pub fn prometheus_with(&self, labels: &[(&str, &str)]) -> Result<String> {
        prometheus_text(&[(*self, labels)])
    }
}

/// Several sources' metrics (one per limiter, told apart by their labels) in
/// one Prometheus exposition: each family's `# HELP` and `# TYPE` once, then
/// one sample per source. Concatenating the limiters' own texts would repeat
/// the families, which Prometheus rejects. Errors ([`Error::Config`], field
/// `labels`): an invalid or repeated label name, or two sources with the same
/// labels (their samples would be one series twice).
pub fn prometheus_text(sources: &[(Metrics, &[(&str, &str)])]) -> Result<String> {
    let mut rendered: Vec<(Metrics, String)> = Vec::with_capacity(sources.len());
    for (m, labels) in sources {
        let set = label_set(labels)?;
        if rendered.iter().any(|(_, other)| *other == set) {
            return Err(Error::config(
                "labels",
                format!(
                    "two limiters have the same labels {}; give each its own (e.g. limiter=\"api\")",
                    if set.is_empty() { "(none)" } else { &set }
                ),
            ));
        }
        rendered.push((*m, set));
    }
    Ok(render(&rendered))
}

/// Every family once, each source's sample under it.
fn render(sources: &[(Metrics, String)]) -> String {
    let mut out = String::with_capacity(1600 * sources.len().max(1));
    let fields: Vec<_> = sources.iter().map(|(m, _)| m.fields()).collect();
    for (i, (name, help, counter, _)) in Metrics::default().fields().into_iter().enumerate() {
        let (suffix, ty) = if counter { ("_total", "counter") } else { ("", "gauge") };
        let _ = writeln!(out, "# HELP quotalease_{name}{suffix} {help}");
        let _ = writeln!(out, "# TYPE quotalease_{name}{suffix} {ty}");
        for ((_, labels), f) in sources.iter().zip(&fields) {
            let _ = writeln!(out, "quotalease_{name}{suffix}{labels} {}", f[i].3);
        }
    }
    out
}

/// `{a="x",b="y"}` (`""` for no labels), checked and escaped.
fn label_set(labels: &[(&str, &str)]) -> Result<String> {
    let mut out = String::new();
    for (i, (name, value)) in labels.iter().enumerate() {
        validate_label_name(name)?;
        if labels[..i].iter().any(|(n, _)| n == name) {
            return Err(Error::config("labels", format!("label {name:?} is given twice")));
        }
        out.push(if i == 0 { '{' } else { ',' });
        out.push_str(name);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    if !out.is_empty() {
        out.push('}');
    }
    Ok(out)
}

/// A label name of the Prometheus data model: `[a-zA-Z_][a-zA-Z0-9_]*`, and
/// not `__`-prefixed (reserved for Prometheus itself).
fn validate_label_name(name: &str) -> Result<()> {
    let mut bytes = name.bytes();
    let ok = matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !ok {
        return Err(Error::config(
            "labels",
            format!("{name:?} is not a Prometheus label name (letters, digits and _, not starting with a digit)"),
        ));
    }
    if name.starts_with("__") {
        return Err(Error::config(
            "labels",
            format!("{name:?}: names starting with __ are reserved for Prometheus"),
        ));
    }
    Ok(())
}

/// Limiter-wide counters (per-key admit/deny counts live in the entries).
#[derive(Default)]
pub(crate) struct Counters {
    pub admitted_retired: AtomicU64,
    pub denied_retired: AtomicU64,
    pub backend_calls: AtomicU64,
    pub backend_errors: AtomicU64,
    pub tokens_leased: AtomicU64,
    pub tokens_returned: AtomicU64,
    pub tokens_expired: AtomicU64,
    pub fallback_transitions: AtomicU64,
    pub shadow_denied: AtomicU64,
    pub tokens_debited: AtomicU64,
    /// Clock reading (ms) of the last shadow-mode log line.
    pub shadow_logged_at: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        if n > 0 {
            c.fetch_add(n, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labelled_sources_share_each_family() {
        let a = Metrics {
            admitted: 3,
            ..Metrics::default()
        };
        let b = Metrics {
            admitted: 5,
            ..Metrics::default()
        };
        let text = prometheus_text(&[(a, &[("limiter", "api")]), (b, &[("limiter", "a\"b\\c\nd")])]).unwrap();
        assert_eq!(text.matches("# TYPE quotalease_admitted_total counter").count(), 1);
        assert!(
            text.contains("quotalease_admitted_total{limiter=\"api\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("quotalease_admitted_total{limiter=\"a\\\"b\\\\c\\nd\"} 5\n"),
            "{text}"
        );
        // no labels: the text of before
        assert!(a.prometheus().contains("\nquotalease_admitted_total 3\n"));
        assert_eq!(a.prometheus(), a.prometheus_with(&[]).unwrap());
    }

    #[test]
    fn bad_labels_are_config_errors() {
        let m = Metrics::default();
        for (labels, why) in [
            (&[("1x", "v")][..], "not a Prometheus label name"),
            (&[("a-b", "v")], "not a Prometheus label name"),
            (&[("", "v")], "not a Prometheus label name"),
            (&[("__name__", "v")], "reserved"),
            (&[("a", "1"), ("a", "2")], "twice"),
        ] {
            let e = m.prometheus_with(labels).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Config);
            assert!(e.to_string().contains(why), "{labels:?}: {e}");
            assert!(e.to_string().contains("`labels`"), "{e}");
        }
        let e = prometheus_text(&[(m, &[("l", "x")]), (m, &[("l", "x")])]).unwrap_err();
        assert!(e.to_string().contains("same labels"), "{e}");
    }
}
