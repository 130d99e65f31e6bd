//! Rates: a (limit, window) pair checked for use (`validate_policy`) and
//! parsed from text such as `"600/min"` (`parse_rate`). Re-exported by
//! `config` and the crate root.

use crate::bucket::{Quota, MAX_CAPACITY_UNITS};
use crate::error::{Error, Result};

/// Check that (limit, window) is a usable policy.
pub fn validate_policy(limit: u64, window_ms: u64) -> Result<Quota> {
    if limit == 0 {
        return Err(Error::config("limit", "must be at least 1"));
    }
    if window_ms == 0 {
        return Err(Error::config("window_ms", "must be at least 1"));
    }
    if limit.checked_mul(window_ms).is_none_or(|u| u > MAX_CAPACITY_UNITS) {
        return Err(Error::config(
            "limit",
            format!(
                "times window_ms must be at most 2^52 ({limit} * {window_ms} is larger); \
                 use a shorter window or a smaller limit"
            ),
        ));
    }
    Ok(Quota { limit, window_ms })
}

/// The units [`parse_rate`] accepts, as its error lists them.
const RATE_UNITS: &str = "ms, s (sec, secs, second, seconds), m (min, mins, minute, minutes), \
                          h (hr, hrs, hour, hours), d (day, days)";

/// Parse a rate such as `"600/min"`, `"10/s"`, `"5000/hour"`, `"100/30s"` into
/// `(limit, window_ms)`.
pub fn parse_rate(rate: &str) -> Result<(u64, u64)> {
    let bad = || {
        Error::config(
            "rate",
            format!(
                "must look like \"600/min\", \"10/s\", \"100/30s\" or \"5000/hour\": a whole number of tokens, \
                 \"/\", an optional whole count and a lowercase unit, one of {RATE_UNITS} (got {rate:?})"
            ),
        )
    };
    let (n, per) = rate.trim().split_once('/').ok_or_else(bad)?;
    let limit: u64 = n.trim().parse().map_err(|_| bad())?;
    let per = per.trim();
    let digits = per.find(|c: char| !c.is_ascii_digit()).unwrap_or(per.len());
    let count: u64 = if digits == 0 {
        1
    } else {
        per[..digits].parse().map_err(|_| bad())?
    };
    let unit_ms: u64 = match per[digits..].trim() {
        "ms" => 1,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000,
        "d" | "day" | "days" => 86_400_000,
        _ => return Err(bad()),
    };
    let window_ms = count.checked_mul(unit_ms).ok_or_else(bad)?;
    validate_policy(limit, window_ms)?;
    Ok((limit, window_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("600/min").unwrap(), (600, 60_000));
        assert_eq!(parse_rate("10/s").unwrap(), (10, 1_000));
        assert_eq!(parse_rate("100/30s").unwrap(), (100, 30_000));
        assert_eq!(parse_rate(" 5000 / hour ").unwrap(), (5000, 3_600_000));
        assert_eq!(parse_rate("10/hr").unwrap(), (10, 3_600_000));
        assert_eq!(parse_rate("10/2hrs").unwrap(), (10, 7_200_000));
        assert_eq!(parse_rate("5/mins").unwrap(), (5, 60_000));
        assert_eq!(parse_rate("5/30secs").unwrap(), (5, 30_000));
        for bad in ["", "10", "x/min", "10/fortnight", "0/min", "10/0s"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        // A unit in capitals or a fractional count: the error lists the units.
        for bad in ["10/MIN", "1.5/s", "10/fortnight"] {
            let e = parse_rate(bad).unwrap_err().to_string();
            assert!(
                e.starts_with("invalid configuration: `rate` must look like \"600/min\"")
                    && e.contains("one of ms, s (sec, secs, second, seconds), m (min, mins, minute, minutes), h (hr, hrs, hour, hours), d (day, days)")
                    && e.ends_with(&format!("(got {bad:?})")),
                "{e}"
            );
        }
    }
}
