//! Calendar quotas: a rule such as `"1000000/month@Europe/Berlin"` admits
//! at most `limit` requests in each calendar period of a time zone, the
//! whole quota coming back at the period's start (docs/design.md,
//! "Calendar quotas").
//!
//! A [`Calendar`] is a small id (so a [`crate::Quota`] stays `Copy` and
//! cheap to compare) of an interned [`CalendarSpec`]: the period, the time
//! zone and, for months, the billing day. The engine computes the period
//! boundaries around its clock reading and sends them to the ledger script,
//! which picks the period its own clock (Redis `TIME`) falls in.

use std::fmt;
use std::sync::{Arc, RwLock};

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// The length of a calendar period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Period {
    /// From midnight to midnight.
    Day,
    /// From Monday's midnight to the next Monday's.
    Week,
    /// From the billing day's midnight (the 1st by default; the month's
    /// last day when it is shorter) to the next month's.
    Month,
    /// From January 1st to January 1st.
    Year,
}

impl Period {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
            Period::Year => "year",
        }
    }

    /// The period's nominal length: the rule's `window_ms` (a month counts
    /// 30 days, a year 365). It sizes the credit units and the failure
    /// policy's shares; the quota itself resets at the true boundaries.
    pub fn nominal_ms(self) -> u64 {
        const DAY: u64 = 86_400_000;
        match self {
            Period::Day => DAY,
            Period::Week => 7 * DAY,
            Period::Month => 30 * DAY,
            Period::Year => 365 * DAY,
        }
    }
}

/// One calendar: a period in a time zone, with a billing day for months.
#[derive(Clone, Debug)]
pub struct CalendarSpec {
    /// Day, week, month or year.
    pub period: Period,
    /// The IANA name as written (`"Europe/Berlin"`, `"UTC"`).
    pub zone: Box<str>,
    /// The day of the month a month starts on (1..=31).
    pub billing_day: u8,
    tz: TimeZone,
}

impl PartialEq for CalendarSpec {
    fn eq(&self, o: &Self) -> bool {
        self.period == o.period && self.zone == o.zone && self.billing_day == o.billing_day
    }
}

/// A rule's calendar: 0 for a token bucket (no calendar), else the id of an
/// interned [`CalendarSpec`] (ids live as long as the process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Calendar(pub(crate) u32);

/// The calendars this process has seen, by id - 1. Only grows: a process
/// sees a handful (each distinct rule text).
static CALENDARS: RwLock<Vec<Arc<CalendarSpec>>> = RwLock::new(Vec::new());

/// A period's boundaries, as the ledger script reads them: the start of the
/// period that holds the reading, its end, and the end of the next one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The period's start (Unix ms).
    pub start: u64,
    /// Its end: the next period's start.
    pub end: u64,
    /// The end of the next period.
    pub after: u64,
}

impl Calendar {
    /// No calendar: a token bucket.
    pub const NONE: Calendar = Calendar(0);

    /// Not a calendar but a concurrency limit: `limit` permits in flight
    /// (`Limiter::acquire_concurrent`), which nothing refills; each comes
    /// back when released or when its holder's commitment expires.
    pub const IN_FLIGHT: Calendar = Calendar(u32::MAX);

    /// Whether this is a calendar quota.
    #[inline]
    pub fn is_some(self) -> bool {
        self.0 != 0 && self.0 != u32::MAX
    }

    /// Whether this is a concurrency limit ([`Calendar::IN_FLIGHT`]).
    #[inline]
    pub fn is_in_flight(self) -> bool {
        self.0 == u32::MAX
    }

    /// The spec of this calendar (`None` for [`Calendar::NONE`]).
    pub fn spec(self) -> Option<Arc<CalendarSpec>> {
        if !self.is_some() {
            return None;
        }
        let all = CALENDARS.read().unwrap_or_else(|e| e.into_inner());
        all.get(self.0 as usize - 1).cloned()
    }

    fn intern(spec: CalendarSpec) -> Calendar {
        let mut all = CALENDARS.write().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = all.iter().position(|s| **s == spec) {
            return Calendar(i as u32 + 1);
        }
        all.push(Arc::new(spec));
        Calendar(all.len() as u32)
    }

    /// Parse what follows a rule's `@` for a period: a time zone
    /// (`"Europe/Berlin"`, `"UTC"`), or for a month `"billing-day-15"`,
    /// optionally followed by a space and a time zone (UTC by default).
    /// The error is what is wrong, as a rule's configuration error says it
    /// ([`crate::parse_quota`] makes it one; a leaf module, this one names
    /// no error type).
    pub fn parse(period: Period, anchor: &str) -> Result<Calendar, String> {
        let anchor = anchor.trim();
        let (billing_day, zone) = match anchor.strip_prefix(BILLING_DAY) {
            Some(rest) => {
                let (day, zone) = rest.split_once(char::is_whitespace).unwrap_or((rest, "UTC"));
                let day: u8 = day
                    .parse()
                    .ok()
                    .filter(|d| (1..=31).contains(d))
                    .ok_or_else(|| format!("has billing day {day:?}; it must be a day of the month, 1 to 31"))?;
                if period != Period::Month {
                    return Err(format!(
                        "has a billing day on a {}; only months have one (\"1000/month@billing-day-15\")",
                        period.name()
                    ));
                }
                (day, zone.trim())
            }
            None => (1, anchor),
        };
        if zone.is_empty() {
            return Err("has no time zone after \"@\"; name one, like \"UTC\" or \"Europe/Berlin\"".into());
        }
        let tz = jiff::tz::db().get(zone).map_err(|_| {
            format!(
                "names the time zone {zone:?}, which the time zone database does not know; \
                 use an IANA name like \"UTC\", \"Europe/Berlin\" or \"America/New_York\""
            )
        })?;
        Ok(Calendar::intern(CalendarSpec {
            period,
            zone: zone.into(),
            billing_day,
            tz,
        }))
    }

    /// The boundaries around `now_ms` (Unix ms). `None` for no calendar.
    pub fn bounds(self, now_ms: u64) -> Option<Bounds> {
        let spec = self.spec()?;
        let start = spec.start_of(now_ms);
        let end = spec.next(start);
        let after = spec.next(end);
        Some(Bounds {
            start: ms(start),
            end: ms(end),
            after: ms(after),
        })
    }
}

const BILLING_DAY: &str = "billing-day-";

/// A boundary as Unix ms (boundaries before 1970 read as 0).
fn ms(d: Date_) -> u64 {
    d.1.max(0) as u64
}

/// A period start: its civil date and its instant in Unix ms.
type Date_ = (Date, i64);

impl CalendarSpec {
    /// The first instant of `d` in the zone (after a gap when midnight is in one).
    fn at(&self, d: Date) -> Date_ {
        let ms = d
            .to_zoned(self.tz.clone())
            .map(|z| z.timestamp().as_millisecond())
            .unwrap_or(i64::MAX / 2);
        (d, ms)
    }

    /// The month's start date: its billing day, or its last day when shorter.
    fn month_start(&self, year: i16, month: i8) -> Date {
        let first = Date::new(year, month, 1).unwrap_or(Date::MAX);
        let day = (self.billing_day as i8).min(first.days_in_month());
        Date::new(year, month, day).unwrap_or(first)
    }

    /// The start of the period that holds `now_ms`.
    fn start_of(&self, now_ms: u64) -> Date_ {
        let t = Timestamp::from_millisecond(now_ms.min(i64::MAX as u64) as i64).unwrap_or(Timestamp::MAX);
        let d = t.to_zoned(self.tz.clone()).date();
        let start = match self.period {
            Period::Day => d,
            Period::Week => d
                .checked_sub((d.weekday().to_monday_zero_offset() as i64).days())
                .unwrap_or(d),
            Period::Year => Date::new(d.year(), 1, 1).unwrap_or(d),
            Period::Month => {
                let this = self.month_start(d.year(), d.month());
                if d >= this {
                    this
                } else {
                    let prev = d.first_of_month().checked_sub(1.day()).unwrap_or(d);
                    self.month_start(prev.year(), prev.month())
                }
            }
        };
        self.at(start)
    }

    /// The start of the period after the one starting at `start`.
    fn next(&self, start: Date_) -> Date_ {
        let d = start.0;
        let next = match self.period {
            Period::Day => d.checked_add(1.day()),
            Period::Week => d.checked_add(7.days()),
            Period::Year => Date::new(d.year().saturating_add(1), 1, 1),
            Period::Month => d
                .first_of_month()
                .checked_add(1.month())
                .map(|m| self.month_start(m.year(), m.month())),
        };
        self.at(next.unwrap_or(Date::MAX))
    }
}

/// `month@Europe/Berlin`, `month@billing-day-15 Europe/Berlin`: the text
/// after a rule's `/`, as [`crate::Rules::parse`] reads it.
impl fmt::Display for CalendarSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@", self.period.name())?;
        if self.billing_day != 1 {
            write!(f, "{BILLING_DAY}{} ", self.billing_day)?;
        }
        f.write_str(&self.zone)
    }
}

/// The period a rule's unit names, when it may take an `@` calendar.
pub(crate) fn period_of(unit: &str) -> Option<Period> {
    Some(match unit {
        "day" => Period::Day,
        "week" => Period::Week,
        "month" => Period::Month,
        "year" => Period::Year,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> u64 {
        text.parse::<Timestamp>().unwrap().as_millisecond() as u64
    }

    fn bounds(period: Period, anchor: &str, now: &str) -> (u64, u64, u64) {
        let b = Calendar::parse(period, anchor).unwrap().bounds(at(now)).unwrap();
        (b.start, b.end, b.after)
    }

    #[test]
    fn days_follow_the_zone_across_daylight_saving() {
        // Europe/Berlin springs forward on 2026-03-29: that day has 23 hours.
        let (s, e, a) = bounds(Period::Day, "Europe/Berlin", "2026-03-29T12:00:00Z");
        assert_eq!(s, at("2026-03-28T23:00:00Z"));
        assert_eq!(e, at("2026-03-29T22:00:00Z"));
        assert_eq!(a, at("2026-03-30T22:00:00Z"));
        assert_eq!(e - s, 23 * 3_600_000);
        // ...and falls back on 2026-10-25: 25 hours.
        let (s, e, _) = bounds(Period::Day, "Europe/Berlin", "2026-10-25T12:00:00Z");
        assert_eq!(e - s, 25 * 3_600_000);
        let (s, e, _) = bounds(Period::Day, "UTC", "2026-10-25T23:59:59.999Z");
        assert_eq!((s, e), (at("2026-10-25T00:00:00Z"), at("2026-10-26T00:00:00Z")));
    }

    #[test]
    fn a_boundary_belongs_to_the_period_it_starts() {
        let (s, e, _) = bounds(Period::Month, "UTC", "2026-12-01T00:00:00Z");
        assert_eq!((s, e), (at("2026-12-01T00:00:00Z"), at("2027-01-01T00:00:00Z")));
        let (s, e, _) = bounds(Period::Month, "UTC", "2026-11-30T23:59:59.999Z");
        assert_eq!((s, e), (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z")));
    }

    #[test]
    fn months_start_on_the_billing_day_or_the_last_day() {
        let (s, e, a) = bounds(Period::Month, "billing-day-31", "2026-02-15T00:00:00Z");
        assert_eq!(s, at("2026-01-31T00:00:00Z"));
        assert_eq!(e, at("2026-02-28T00:00:00Z"));
        assert_eq!(a, at("2026-03-31T00:00:00Z"));
        let (s, e, _) = bounds(Period::Month, "billing-day-15 America/New_York", "2026-12-04T12:00:00Z");
        assert_eq!(s, at("2026-11-15T05:00:00Z"));
        assert_eq!(e, at("2026-12-15T05:00:00Z"));
    }

    #[test]
    fn weeks_start_on_monday_and_years_on_january_first() {
        // 2026-12-04 is a Friday.
        let (s, e, _) = bounds(Period::Week, "UTC", "2026-12-04T12:00:00Z");
        assert_eq!((s, e), (at("2026-11-30T00:00:00Z"), at("2026-12-07T00:00:00Z")));
        let (s, e, _) = bounds(Period::Year, "Asia/Tokyo", "2026-12-31T16:00:00Z");
        assert_eq!((s, e), (at("2026-12-31T15:00:00Z"), at("2027-12-31T15:00:00Z")));
    }

    #[test]
    fn bad_anchors_say_what_to_write() {
        for (p, a, want) in [
            (Period::Month, "Mars/Olympus", "the time zone database does not know"),
            (Period::Month, "", "has no time zone"),
            (Period::Month, "billing-day-32", "1 to 31"),
            (Period::Month, "billing-day-x", "1 to 31"),
            (Period::Day, "billing-day-3", "only months have one"),
        ] {
            let e = Calendar::parse(p, a).unwrap_err().to_string();
            assert!(e.contains(want), "{a}: {e}");
        }
    }

    #[test]
    fn equal_calendars_share_an_id_and_print_as_written() {
        let a = Calendar::parse(Period::Month, "billing-day-15 Europe/Berlin").unwrap();
        let b = Calendar::parse(Period::Month, " billing-day-15  Europe/Berlin ").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.spec().unwrap().to_string(), "month@billing-day-15 Europe/Berlin");
        assert_ne!(a, Calendar::parse(Period::Month, "Europe/Berlin").unwrap());
        assert_eq!(Calendar::NONE.spec().map(|s| s.to_string()), None);
    }
}
