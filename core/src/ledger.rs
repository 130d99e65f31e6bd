//! Adaptive leasing as a ledger: what a holder asks, what the authority
//! answers, and the tuning, for the one algorithm in `authority/lua/ledger.lua`
//! that Redis and the memory authority's embedded Lua both run.
//!
//! Every commitment the authority makes (a chunk, a rate with its carry, a
//! fallback share) is recorded with its expiry; the holder honours the same
//! expiry on its own clock. The invariants I1-I4 and the bound they give are
//! in docs/design.md ("The ledger").

use std::time::Duration;

use crate::bucket::Quota;

/// How often the broker ticks registered limiters (coarse clock,
/// maintenance). It lives here, below the broker, because the tuning's
/// margins are counted in ticks ([`Tuning::check`]).
pub(crate) const TICK: Duration = Duration::from_millis(10);

/// The script: one text for Redis and for the memory authority.
pub(crate) const SCRIPT: &str = include_str!("authority/lua/ledger.lua");

/// Every tuned number of adaptive leasing, in one place; docs/design.md
/// ("Tuning") gives each its reason and the benchmark that set it. None of
/// them can change the bound, only calls, false denials and latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// How long a commitment lasts at the authority (0: until given back).
    pub commit_ms: u64,
    /// A holder stops spending this long before the authority's expiry
    /// (its maintenance runs at least this often).
    pub expiry_margin_ms: u64,
    /// How long a fallback share stays valid (and counted in F).
    pub fallback_ms: u64,
    /// After a loss: no new tokens for this long (every commitment of the
    /// lost state has expired by then).
    pub learn_ms: u64,
    /// Shortest rate grant.
    pub min_period_ms: u64,
    /// Longest rate grant (at most `commit_ms - expiry_margin_ms`).
    pub max_period_ms: u64,
    /// A full share's grant lasts long enough to deliver this many tokens.
    pub grant_tokens: u64,
    /// A rate's carry: tokens it may leave unspent, this many ms of it.
    pub carry_ms: u64,
    /// A rate is at most this percentage of the holder's demand.
    pub rate_cap_pct: u64,
    /// Rates start when the fleet's demand reaches this percentage of the
    /// key's rate and the bucket cannot serve a request.
    pub saturation_pct: u64,
    /// Chunks are sized for this many ms of demand (plus a round trip).
    pub target_ms: u64,
    /// On a saturated key a chunk is at most the holder's share of the
    /// key's rate over this many ms.
    pub chunk_ms: u64,
    /// While a key is in debt (fallback admissions debited), rates leave
    /// this percentage of its rate to the refill, which pays the debt.
    pub debt_pay_pct: u64,
    /// On a saturated key, a holder moves onto a rate once the bucket holds
    /// less than this percentage of its capacity (or cannot serve it).
    pub rate_start_pct: u64,
    /// A holder's first demand estimate waits this long (engine side)...
    pub demand_first_ms: u64,
    /// ...or for this many requests, whichever comes first.
    pub demand_first_requests: u64,
    /// Later estimates are averaged in with this half-life.
    pub demand_half_life_ms: u64,
    /// A rate is renewed this long before its end at least (two round
    /// trips when they take longer).
    pub renew_lead_ms: u64,
    /// A rate holder whose last answer left the bucket at least
    /// `recheck_pct` full asks again on a denial, at most this often.
    pub recheck_ms: u64,
    /// See `recheck_ms`.
    pub recheck_pct: u64,
    /// Under the default `overshoot_budget` ("auto"), the key's live holders
    /// together lease ahead up to this percentage of what the key refills
    /// in `target_ms` (at most its capacity), an equal part each, when that
    /// is more than 2 % of its limit (engine side).
    pub fleet_ahead_pct: u64,
    /// A rate granted within `min_period_ms` of a holder's first demand
    /// estimate that brought this percentage of the key's sum of demand or
    /// more is the shortest, a renewal too.
    pub join_pct: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        TUNING
    }
}

impl Tuning {
    /// How often a limiter's maintenance sweeps its keys (lease TTL, the
    /// ledger's expiries, accrual), for a `lease_ttl_ms`: a quarter of the
    /// TTL, and at most half `expiry_margin_ms`, so that a commitment's
    /// tokens go back (I3) before the authority forgets them, a margin after
    /// the holder's expiry, even a tick late (`TICK`).
    pub fn sweep_ms(&self, lease_ttl_ms: u64) -> u64 {
        (lease_ttl_ms / 4).clamp(5, self.expiry_margin_ms / 2)
    }

    /// Whether the bound's argument (docs/design.md, "The ledger") holds
    /// under this tuning: the relations between the knobs it relies on.
    /// Any tuning that passes keeps the bound; the values only trade calls,
    /// false denials and latency. `Err` says which relation fails.
    pub fn check(&self) -> Result<(), String> {
        let tick = TICK.as_millis() as u64;
        let rules: [(bool, &str); 7] = [
            // a longest rate ends a margin before its holder stops spending
            // (`commit_ms - expiry_margin_ms` after the call): what it accrued
            // last is spent, and the renewal comes, before the commitment ends
            (
                self.max_period_ms + 2 * self.expiry_margin_ms <= self.commit_ms,
                "max_period_ms + 2 x expiry_margin_ms must be at most commit_ms",
            ),
            (
                self.learn_ms >= self.commit_ms,
                "learn_ms must be at least commit_ms (learning outlasts every commitment of a lost state)",
            ),
            (
                1 <= self.min_period_ms && self.min_period_ms <= self.max_period_ms,
                "min_period_ms must be between 1 and max_period_ms",
            ),
            // a sweep, a tick late, comes within the margin
            (
                self.expiry_margin_ms / 2 + 2 * tick < self.expiry_margin_ms,
                "expiry_margin_ms must leave room for a sweep a tick late (more than 4 ticks)",
            ),
            (
                (1..=100).contains(&self.debt_pay_pct),
                "debt_pay_pct must be 1..=100 (0 never pays a debt back)",
            ),
            (
                self.rate_start_pct <= 100
                    && self.recheck_pct <= 100
                    && self.fleet_ahead_pct <= 100
                    && self.join_pct <= 100,
                "rate_start_pct, recheck_pct, fleet_ahead_pct and join_pct are percentages (at most 100)",
            ),
            (
                self.grant_tokens >= 1 && self.rate_cap_pct >= 1 && self.demand_half_life_ms >= 1,
                "grant_tokens, rate_cap_pct and demand_half_life_ms must be at least 1",
            ),
        ];
        match rules.iter().find(|(ok, _)| !ok) {
            Some((_, why)) => Err(why.to_string()),
            None => Ok(()),
        }
    }
}

/// The tuning of every limiter.
pub const TUNING: Tuning = Tuning {
    commit_ms: 7_000,
    expiry_margin_ms: 1_000,
    fallback_ms: 300_000,
    learn_ms: 7_000,
    min_period_ms: 1_000,
    max_period_ms: 5_000,
    grant_tokens: 40,
    carry_ms: 500,
    rate_cap_pct: 125,
    saturation_pct: 100,
    target_ms: 1_000,
    chunk_ms: 750,
    debt_pay_pct: 50,
    rate_start_pct: 50,
    demand_first_ms: 100,
    demand_first_requests: 8,
    demand_half_life_ms: 1_000,
    renew_lead_ms: 10,
    recheck_ms: 250,
    recheck_pct: 50,
    fleet_ahead_pct: 50,
    join_pct: 10,
};

/// Lease calls this process has sent, numbered from 1 (an adaptive call
/// sends its number as [`Ask::seq`]; every entry keeps the last one it
/// applied, which also tells the cold path an inline call that failed):
/// rising for every holder, whichever entry sends. A new entry
/// starts as having applied every call numbered before it, so a grant
/// answered to an evicted entry of its key is never taken back for it.
pub(crate) static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What a holder sends with an adaptive lease call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// The holder's id (one per limiter instance and process).
    pub holder: u64,
    /// Its offered load on the key, milli-tokens per second.
    pub demand: u64,
    /// Tokens it holds locally now.
    pub held: u64,
    /// Its current rate (credit units per ms; 0: none): re-granted as it is
    /// while the authority learns after a loss.
    pub rate: u64,
    /// Its current commitment cap in tokens (what a rate may fill up to).
    pub carry: u64,
    /// Tokens it admitted under the failure policy since its last answer:
    /// debited from the bucket.
    pub fallback_used: u64,
    /// Its fallback share while valid (credit units per ms; 0: none):
    /// within `fallback_ms` of a loss the authority re-grants it, and no
    /// more (`fallback` in ledger.lua).
    pub share: u64,
    /// Tokens of this grant the request that asked spends as it lands (not
    /// counted as held); 0 for a prefetch or a request that does not wait.
    pub spent: u64,
    /// Decide one request at a time: grant `need` only, never a rate (a key
    /// whose budget is under a token, and every call while the circuit is
    /// open).
    pub single: bool,
    /// Commitments expire at the authority (0: only when given back).
    pub commit_ms: u64,
    /// This call's number, rising per holder (0: none, a give-back).
    pub seq: u64,
    /// The number of the last call whose answer the holder applied: a
    /// grant made by a later call never reached it (its reply was lost),
    /// and the ledger takes it back (`unseen` in ledger.lua).
    pub applied: u64,
    /// The most tokens the holder held (local and reserved) since its lease
    /// call `low_seq` left (0: no call before this one). When that call is
    /// the last the ledger had from it, its commitment counted the rest as
    /// outstanding all along, and the ledger gives back refill its clamp
    /// cut for them (`spent_credit` in ledger.lua).
    pub low: u64,
    pub low_seq: u64,
    /// The holder's tuning (its limiter's: [`TUNING`] outside tests).
    pub tuning: Tuning,
}

/// The authority's answer beyond the chunk grant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// A rate grant in credit units per ms (0: none).
    pub rate: u64,
    /// How long the rate runs, from when the call was sent.
    pub rate_ms: u64,
    /// The holder's commitment in tokens: what it may hold at most.
    pub commit: u64,
    /// How long its tokens stay valid, from when the call was sent (0: until
    /// given back).
    pub commit_ms: u64,
    /// Its fallback share (credit units per ms, i.e. tokens per window).
    pub fallback: u64,
    /// How long the fallback share stays valid, from when the call was sent.
    pub fallback_ms: u64,
    /// Live holders of the key, this one included.
    pub holders: u64,
    /// The authority is learning after a loss for this many more ms.
    pub learning_ms: u64,
}

/// The script's `KEYS` for the state stored under `key`: the hash, the
/// sorted set of expiries, and the line of holders waiting for a permit
/// (a concurrency limit's; empty otherwise). One hash tag: one slot.
pub(crate) fn keys(key: &str) -> Vec<String> {
    vec![key.to_string(), format!("{key}:x"), format!("{key}:w")]
}

/// A holder id as the script stores it, in field and member names (`h<id>`,
/// `g<id>`, `c<id>`, ...): base 62, at most 11 characters where decimal
/// takes up to 20, so each of a key's four names per holder is 9 bytes
/// shorter, in Redis and in the memory authority alike (docs/benchmarks.md,
/// "Memory per tracked key").
pub(crate) fn holder_text(id: u64) -> String {
    const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::with_capacity(11);
    let mut n = id;
    loop {
        out.push(DIGITS[(n % 62) as usize]);
        n /= 62;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII digits")
}

/// The script's arguments after `KEYS` for one lease (`op` "l") or give-back
/// (`op` of [`crate::wire::Back::ledger_op`], `held` = the tokens). `now`:
/// the caller's clock reading, whether the script uses it (else Redis
/// `TIME`, Unix ms), and the time of day (Unix ms) at that reading. A
/// calendar quota adds its period boundaries around the time of day, on the
/// script's clock (shifted onto the caller's when the script uses that);
/// the script picks the period its own clock falls in.
#[allow(clippy::too_many_arguments)]
pub(crate) fn args(
    op: &str,
    policy: Quota,
    (now, explicit, wall): (u64, bool, u64),
    ask: &Ask,
    want: u64,
    need: u64,
    guard: (u64, u64, u64),
) -> Vec<String> {
    let t = ask.tuning;
    let mut v = vec![
        op.to_string(),
        policy.limit.to_string(),
        policy.window_ms.to_string(),
        if explicit { now.to_string() } else { String::new() },
        holder_text(ask.holder),
    ];
    v.extend(
        [
            ask.demand,
            ask.held,
            want,
            need,
            ask.single as u64,
            ask.rate,
            ask.carry,
            ask.fallback_used,
            guard.0,
            guard.1,
            guard.2,
            ask.commit_ms,
            t.fallback_ms,
            t.learn_ms,
            t.min_period_ms,
            t.max_period_ms
                .min(ask.commit_ms.saturating_sub(t.expiry_margin_ms).max(t.min_period_ms)),
            t.grant_tokens,
            t.carry_ms,
            t.rate_cap_pct,
            t.saturation_pct,
            ask.spent,
            t.debt_pay_pct,
            t.rate_start_pct,
            ask.seq,
            ask.applied,
            ask.low,
            ask.low_seq,
            t.chunk_ms,
            t.join_pct,
            ask.share,
        ]
        .map(|n| n.to_string()),
    );
    if policy.calendar.is_in_flight() {
        v.push("n".into());
    } else if let Some(b) = policy.calendar.bounds(wall) {
        let on_script_clock = |t: u64| if explicit { (t + now).saturating_sub(wall) } else { t };
        v.push("c".into());
        v.extend([b.start, b.end, b.after].map(|t| on_script_clock(t).to_string()));
    }
    v
}

/// A lease answer: `(granted, remaining, wait_ms)`, the [`Answer`], and the
/// failover stamp `(epoch, version, alive_ms, lost)`.
pub(crate) type Parsed = ((u64, u64, u64), Answer, (u64, u64, u64, bool));

/// Read the script's lease reply (15 integers).
pub(crate) fn parse(r: &[i64]) -> Option<Parsed> {
    let u = |i: usize| r.get(i).map(|&v| v.max(0) as u64);
    if r.len() != 15 {
        return None;
    }
    let answer = Answer {
        rate: u(3)?,
        rate_ms: u(4)?,
        commit: u(5)?,
        commit_ms: u(6)?,
        fallback: u(7)?,
        fallback_ms: u(8)?,
        holders: u(9)?,
        learning_ms: u(10)?,
    };
    Some(((u(0)?, u(1)?, u(2)?), answer, (u(11)?, u(12)?, u(13)?, u(14)? == 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_ids_are_short_and_distinct_in_base_62() {
        assert_eq!(holder_text(0), "0");
        assert_eq!(holder_text(61), "z");
        assert_eq!(holder_text(62), "10");
        assert_eq!(holder_text(u64::MAX), "LygHa16AHYF");
        let ids: std::collections::BTreeSet<String> = (0..5000u64)
            .map(|i| holder_text(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            .collect();
        assert_eq!(ids.len(), 5000);
        assert!(ids
            .iter()
            .all(|t| t.len() <= 11 && t.bytes().all(|b| b.is_ascii_alphanumeric())));
    }

    /// One lease call of `holder` on a 100-per-second key at `now` (ms):
    /// `(granted, remaining)`.
    fn lease(host: &crate::authority::embedded::Host, now: u64, ask: Ask, want: u64) -> (u64, u64) {
        let argv = args("l", Quota::new(100, 1_000), (now, true, now), &ask, want, 1, (0, 0, 0));
        let keys = keys("k");
        let r = host.eval(&keys, &argv, now).expect("the script answers");
        let ((granted, remaining, _), _, _) = parse(&r).expect("a lease reply");
        (granted, remaining)
    }

    /// `unseen` in ledger.lua: a grant whose reply its holder never applied
    /// goes back to the bucket at the holder's next call; one it applied
    /// does not; a call numbered below the last grant changes nothing.
    #[test]
    fn a_grant_whose_reply_was_lost_comes_back_once() {
        let host = crate::authority::embedded::Host::new(SCRIPT);
        let ask = |seq, applied, held| Ask {
            holder: 7,
            seq,
            applied,
            held,
            commit_ms: 7_000,
            ..Ask::default()
        };
        // call 1 takes 30 of 100; its reply is lost (the holder applied 0)
        assert_eq!(lease(&host, 1_000, ask(1, 0, 0), 30), (30, 70));
        // call 2 (holding nothing): the 30 came back before it takes 30 more
        assert_eq!(lease(&host, 1_000, ask(2, 0, 0), 30), (30, 70));
        // call 1 again, late (a dropped connection's command run after
        // call 2): it grants nothing and changes nothing
        assert_eq!(lease(&host, 1_000, ask(1, 0, 0), 30), (0, 70));
        // call 3 after call 2's reply was applied (30 held): nothing back
        assert_eq!(lease(&host, 1_000, ask(3, 2, 30), 30), (30, 40));
        // call 4 never heard of call 3, and spent call 2's 30: only call
        // 3's chunk comes back (what its commitment holds beyond 0 held)
        assert_eq!(lease(&host, 1_000, ask(4, 2, 0), 10), (10, 60));
    }

    /// `unseen_debit` in ledger.lua: fallback admissions a holder reports
    /// again because the reply to the call that debited them was lost are
    /// debited once.
    #[test]
    fn fallback_admissions_reported_again_are_debited_once() {
        let host = crate::authority::embedded::Host::new(SCRIPT);
        let ask = |seq, applied, held, used| Ask {
            holder: 7,
            seq,
            applied,
            held,
            fallback_used: used,
            commit_ms: 7_000,
            ..Ask::default()
        };
        // call 1 reports 20 admitted on fallback and takes 10: 70 left;
        // its reply is lost, so the holder still counts the 20
        assert_eq!(lease(&host, 1_000, ask(1, 0, 0, 20), 10), (10, 70));
        // call 2 reports the same 20: call 1's chunk comes back and the 20
        // are not taken again (50 left if they were)
        assert_eq!(lease(&host, 1_000, ask(2, 0, 0, 20), 10), (10, 70));
        // call 2 applied (the holder's count drops by its 20), 5 more
        // admitted on fallback, 10 held
        assert_eq!(lease(&host, 1_000, ask(3, 2, 10, 5), 10), (10, 55));
        // call 3's reply lost; 3 more: its chunk comes back, and of the 8
        // reported only the 3 it did not take are taken
        assert_eq!(lease(&host, 1_000, ask(4, 2, 10, 8), 10), (10, 52));
    }

    /// `spent_credit` in ledger.lua: refill the clamp cut while a holder's
    /// commitment counted tokens it no longer held comes back, up to what
    /// it was counted beyond the most it held, once, and only when the call
    /// its report starts from is the last the ledger had from it.
    #[test]
    fn refill_cut_for_tokens_spent_comes_back_once() {
        let ask = |holder, seq, applied, low, low_seq| Ask {
            holder,
            seq,
            applied,
            low,
            low_seq,
            commit_ms: 7_000,
            ..Ask::default()
        };
        // holders 7 and 8 take 50 each of a full 100: the bucket is empty,
        // and for the next 500 ms the clamp cuts its refill (50 tokens)
        let start = || {
            let host = crate::authority::embedded::Host::new(SCRIPT);
            assert_eq!(lease(&host, 1_000, ask(7, 1, 0, 0, 0), 50), (50, 50));
            assert_eq!(lease(&host, 1_000, ask(8, 2, 0, 0, 0), 50), (50, 0));
            host
        };
        // 7 held at most 20 since call 1: 30 counted too many, 30 of the
        // 50 cut come back, as much as it asks for (1: 1 comes back)
        let host = start();
        assert_eq!(lease(&host, 1_500, ask(7, 3, 1, 20, 1), 1), (1, 0));
        let host = start();
        assert_eq!(lease(&host, 1_500, ask(7, 3, 1, 20, 1), 100), (30, 0));
        // then 8, which spent all of its 50: of the cut, only the 20 not
        // given back yet (50 if the 30 given to 7 came back again)
        assert_eq!(lease(&host, 1_500, ask(8, 4, 2, 0, 2), 100), (20, 0));
        // a report that starts from another call than the ledger's last of
        // that holder (one that never arrived, or none) gets nothing
        let host = start();
        assert_eq!(lease(&host, 1_500, ask(7, 3, 1, 0, 0), 1), (0, 0));
        assert_eq!(lease(&host, 1_500, ask(8, 4, 2, 0, 3), 1), (0, 0));
        // held all along: nothing was counted too many
        let host = start();
        assert_eq!(lease(&host, 1_500, ask(7, 3, 1, 50, 1), 1), (0, 0));
    }

    /// `give_back` in ledger.lua: a give-back that reaches the ledger after
    /// a renewal its holder has not seen answered yet (sent while the
    /// renewal was in flight) leaves that renewal's rate counted, as the
    /// holder runs it once the answer lands: another holder gets no part of
    /// it (I1). A give-back that has seen it ends it.
    #[test]
    fn a_give_back_ends_only_a_rate_its_holder_has_seen() {
        let policy = Quota::new(100, 1_000);
        let lease = |host: &crate::authority::embedded::Host, ask: Ask, need: u64| {
            let argv = args("l", policy, (1_000, true, 1_000), &ask, 100, need, (0, 0, 0));
            let r = host.eval(&keys("k"), &argv, 1_000).expect("the script answers");
            let ((granted, _, _), answer, _) = parse(&r).expect("a lease reply");
            (granted, answer.rate)
        };
        let ask = |holder, seq, applied, rate| Ask {
            holder,
            demand: 200_000,
            seq,
            applied,
            rate,
            commit_ms: 7_000,
            tuning: TUNING,
            ..Ask::default()
        };
        // holder 7, at twice the key's rate alone, takes chunks until the
        // bucket runs dry and it is granted a rate (call n, applied), then
        // renews it (call n + 1, in flight); its give-back says which it
        // had applied (`seen` calls after n); then holder 8 joins
        let run = |seen: u64| {
            let host = crate::authority::embedded::Host::new(SCRIPT);
            let mut n = 1;
            let first = loop {
                let (_, rate) = lease(&host, ask(7, n, n - 1, 0), 1);
                if rate > 0 || n == 10 {
                    break rate;
                }
                n += 1;
            };
            assert!(first > 0, "a saturated key grants a rate once dry");
            let (_, renewed) = lease(&host, ask(7, n + 1, n, first), 1);
            assert!(renewed > 0);
            let back = Ask {
                holder: 7,
                applied: n + seen,
                tuning: TUNING,
                ..Ask::default()
            };
            let argv = args("g", policy, (1_000, true, 1_000), &back, 0, 0, (0, 0, 0));
            host.eval(&keys("k"), &argv, 1_000).expect("the script answers");
            let (_, other) = lease(&host, ask(8, n + 2, 0, 0), 1);
            (renewed, other)
        };
        let (renewed, other) = run(0);
        assert!(
            renewed + other <= policy.limit,
            "rates {renewed} (running once its answer lands) and {other}: over the key's {}",
            policy.limit
        );
        // seen: the rate ended, and the other holder's share is free
        let (_, other) = run(1);
        assert!(other > 0);
    }

    /// Tails (`A` in ledger.lua): a rate that ran out at its end keeps its
    /// room from new rates for its renewal grace, unless it was one of the
    /// shortest period (split while the holders joined), which keeps none.
    #[test]
    fn a_rate_that_ran_out_keeps_its_room_for_its_grace() {
        let policy = Quota::new(100, 1_000);
        let min = TUNING.min_period_ms;
        // holder 7 alone, at twice the key's rate, drains the bucket from
        // 1 s on and gets the whole rate, the shortest as it has just
        // joined; `lease(holder, now, rate)`: the rate granted and its period
        let fleet = || {
            let host = crate::authority::embedded::Host::new(SCRIPT);
            let mut seq = 0;
            let mut lease = move |holder, now, rate| {
                seq += 1;
                let ask = Ask {
                    holder,
                    demand: 200_000,
                    seq,
                    applied: seq - 1,
                    rate,
                    commit_ms: 7_000,
                    tuning: TUNING,
                    ..Ask::default()
                };
                let argv = args("l", policy, (now, true, now), &ask, 100, 1, (0, 0, 0));
                let r = host.eval(&keys("k"), &argv, now).expect("the script answers");
                let (_, answer, _) = parse(&r).expect("a lease reply");
                (answer.rate, answer.rate_ms)
            };
            let mut now = 1_000;
            let first = loop {
                let got = lease(7, now, 0);
                if got.0 > 0 || now > 1_100 {
                    break got;
                }
                now += 1;
            };
            assert_eq!(first, (100, min));
            (lease, now + min)
        };
        // the shortest rate runs out: holder 8 gets a part of it at once
        let (mut lease, end) = fleet();
        assert!(lease(8, end + 10, 0).0 > 0, "a shortest rate keeps no tail");
        // holder 7 renews after it, for longer; that rate runs out
        // unrenewed: holder 8 gets none of its room within the grace, and
        // its part once the grace is over
        let (mut lease, end) = fleet();
        let (rate, ms) = lease(7, end + 100, 100);
        assert!(rate == 100 && ms > min, "rate {rate} for {ms} ms");
        let end = end + 100 + ms;
        let (within, _) = lease(8, end + 10, 0);
        assert_eq!(within, 0, "holder 8 took the room of a rate in its grace");
        let (after, _) = lease(8, end + min + 10, 0);
        assert!(after > 0, "the tail outlived its grace");
    }

    /// `guard` in ledger.lua: a loss is found once. A holder whose answer
    /// to the call that found it was lost calls again with the same stamp:
    /// that call finds no loss (before, each emptied the bucket again and
    /// moved the learning's end).
    #[test]
    fn a_loss_is_found_once() {
        let policy = Quota::new(100, 1_000);
        // one call of holder 7 at `now` with the stamp `seen`: the answer's
        // stamp, whether it found a loss, and how long it learns
        let call = |host: &crate::authority::embedded::Host, now: u64, seq: u64, seen: (u64, u64, u64)| {
            let ask = Ask {
                holder: 7,
                demand: 10_000,
                seq,
                applied: 1,
                commit_ms: 7_000,
                tuning: TUNING,
                ..Ask::default()
            };
            let argv = args("l", policy, (now, true, now), &ask, 1, 1, seen);
            let r = host.eval(&keys("k"), &argv, now).expect("the script answers");
            let (_, answer, (e, v, alive, lost)) = parse(&r).expect("a lease reply");
            ((e, v, alive), lost, answer.learning_ms)
        };
        let learn = TUNING.learn_ms;
        // restarted empty: the first call with the old stamp finds the
        // loss, the next with the same stamp does not
        let old = crate::authority::embedded::Host::new(SCRIPT);
        let (stamp, ..) = call(&old, 1_000, 1, (0, 0, 0));
        let new = crate::authority::embedded::Host::new(SCRIPT);
        let (_, lost, learning) = call(&new, 2_000, 2, stamp);
        assert!(lost && learning == learn, "the restart is found");
        let (_, lost, learning) = call(&new, 3_000, 3, stamp);
        assert!(!lost && learning == learn - 1_000, "found again: learning {learning}");
        // rolled back to an older version: the same
        let newer = crate::authority::embedded::Host::new(SCRIPT);
        let _ = call(&newer, 1_000, 1, (0, 0, 0));
        let mut stamp = (0, 0, 0);
        for seq in 2..6 {
            stamp = call(&newer, 1_000 + 100 * seq, seq, (0, 0, 0)).0;
        }
        let older = crate::authority::embedded::Host::new(SCRIPT);
        let _ = call(&older, 1_000, 1, (0, 0, 0));
        assert!(call(&older, 2_000, 6, stamp).1, "the rollback is found");
        let (_, lost, learning) = call(&older, 3_000, 7, stamp);
        assert!(!lost && learning == learn - 1_000, "found again: learning {learning}");
    }

    #[test]
    fn the_tuning_keeps_the_bound() {
        assert_eq!(TUNING.check(), Ok(()));
        // each relation the bound relies on is refused when it fails
        let t = TUNING;
        for bad in [
            Tuning {
                max_period_ms: t.commit_ms - 2 * t.expiry_margin_ms + 1,
                ..t
            },
            Tuning {
                learn_ms: t.commit_ms - 1,
                ..t
            },
            Tuning { min_period_ms: 0, ..t },
            Tuning {
                min_period_ms: t.max_period_ms + 1,
                ..t
            },
            Tuning {
                expiry_margin_ms: 40,
                ..t
            },
            Tuning { debt_pay_pct: 0, ..t },
            Tuning {
                rate_start_pct: 101,
                ..t
            },
            Tuning { join_pct: 101, ..t },
            Tuning { grant_tokens: 0, ..t },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_sweep_comes_within_the_expiry_margin() {
        // (the longest gap between sweeps, and a tick more)
        let l = crate::Limiter::builder()
            .limit(10)
            .lease_ttl_ms(3_600_000)
            .build()
            .unwrap();
        let longest = crate::broker::longest_sweep_gap_ms(l.config());
        let tick = TICK.as_millis() as u64;
        assert!(longest + tick < TUNING.expiry_margin_ms, "{longest} ms");
        assert_eq!(TUNING.sweep_ms(2_000), 500);
        assert_eq!(TUNING.sweep_ms(1), 5);
    }
}
