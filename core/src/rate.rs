//! Rates: a (limit, window) pair checked for use (`validate_policy`) and
//! parsed from text such as `"600/min"` (`parse_rate`). Re-exported by
//! `config` and the crate root.

use crate::bucket::{Quota, MAX_CAPACITY_UNITS};
use crate::calendar::{period_of, Calendar, Period};
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
    Ok(Quota::new(limit, window_ms))
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
    let unit = per[digits..].trim();
    // ("day" is a window of 24 hours; the other calendar units are only calendars)
    if let Some(p) = period_of(unit.trim_end_matches('s')).filter(|&p| p != Period::Day) {
        return Err(Error::config(
            "rate",
            format!(
                "{rate:?} names a calendar {unit}, which needs a time zone: write \"{n}/{p}@UTC\" or \"{n}/{p}@Europe/Berlin\" \
                 (at most {n} in each calendar {p}), or a fixed window like \"{n}/30d\"",
                n = n.trim(),
                p = p.name()
            ),
        ));
    }
    let unit_ms: u64 = match unit {
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

/// Parse one rule: a rate (see [`parse_rate`]) or a calendar quota such as
/// `"1000000/month@Europe/Berlin"`, `"10000/day@UTC"`,
/// `"500/month@billing-day-15"` or `"500/month@billing-day-15 America/New_York"`:
/// at most `limit` in each calendar day, week (from Monday), month or year
/// of the time zone, the whole quota coming back at each period's start.
pub fn parse_quota(text: &str) -> Result<Quota> {
    let Some((rate, anchor)) = text.split_once('@') else {
        let (limit, window_ms) = parse_rate(text)?;
        return Ok(Quota::new(limit, window_ms));
    };
    let bad = || {
        Error::config(
            "rate",
            format!(
                "must look like \"1000000/month@Europe/Berlin\" before its \"@\": a whole number of tokens, \"/\" \
                 and one of day, week, month, year (got {text:?})"
            ),
        )
    };
    let (n, unit) = rate.trim().split_once('/').ok_or_else(bad)?;
    let limit: u64 = n.trim().parse().map_err(|_| bad())?;
    let period = period_of(unit.trim()).ok_or_else(bad)?;
    let calendar = Calendar::parse(period, anchor).map_err(|reason| Error::config("rate", reason))?;
    let window_ms = period.nominal_ms();
    validate_policy(limit, window_ms).map_err(|e| match e {
        Error::Config { .. } if limit > 0 => Error::config(
            "rate",
            format!(
                "allows at most {} per {} ({limit} is more: credit is exact up to 2^52 units of 1/{window_ms} \
                 token); use a shorter period",
                MAX_CAPACITY_UNITS / window_ms,
                period.name()
            ),
        ),
        e => e,
    })?;
    Ok(Quota {
        limit,
        window_ms,
        calendar,
    })
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
        for bad in [
            "",
            "10",
            "x/min",
            "10/fortnight",
            "0/min",
            "10/0s",
            "10/month",
            "10/weeks",
        ] {
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

#[cfg(test)]
mod calendar_tests {
    use super::*;

    #[test]
    fn calendar_quotas_parse() {
        let q = parse_quota("1000000/month@Europe/Berlin").unwrap();
        assert_eq!((q.limit, q.window_ms), (1_000_000, Period::Month.nominal_ms()));
        assert_eq!(q.calendar.spec().unwrap().to_string(), "month@Europe/Berlin");
        let q = parse_quota(" 10000 / day @ UTC ").unwrap();
        assert_eq!(q.calendar.spec().unwrap().to_string(), "day@UTC");
        assert_eq!(parse_quota("600/min").unwrap(), Quota::new(600, 60_000));
        let e = parse_quota("2000000/month@UTC").unwrap_err().to_string();
        assert!(e.contains("at most 1737499 per month"), "{e}");
        let e = parse_quota("10/fortnight@UTC").unwrap_err().to_string();
        assert!(e.contains("one of day, week, month, year"), "{e}");
        let e = parse_quota("10/day@Nowhere/Land").unwrap_err().to_string();
        assert!(e.contains("does not know"), "{e}");
        let e = parse_rate("10/month").unwrap_err().to_string();
        assert!(e.contains("\"10/month@UTC\""), "{e}");
        assert!(parse_quota("0/day@UTC").is_err());
        // A day without a zone stays a 24-hour token bucket.
        assert_eq!(parse_quota("10/day").unwrap(), Quota::new(10, 86_400_000));
    }
}
