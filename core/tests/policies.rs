//! Plan tiers, several rules per key, the shared policy store (memory and a
//! real redis-server) and the policy file.

mod common;

use common::{await_cond, unique, RedisServer};
use quotalease::{ClockKind, Error, ErrorKind, Limiter, Mode, Origin, Reason};

const START: u64 = 1_000_000;

/// Fixed leases of one token: each bucket's answers are those of an exact
/// bucket (but for the one token a lease may hold), whatever the pattern.
fn manual(url: &str) -> quotalease::Builder {
    Limiter::builder()
        .url(url)
        .clock(ClockKind::Manual { start_ms: START })
        .policy_refresh_ms(1_000)
        .lease_size(1)
        .tier("free", "5/s")
        .tier("pro", "20/s")
        .tier("burst", "3/s, 5/min")
}

fn admitted(l: &Limiter, key: &str, tier: Option<&str>, n: usize) -> usize {
    (0..n).filter(|_| l.acquire_with(key, 1, tier).unwrap().allowed).count()
}

#[test]
fn a_tier_named_where_no_tiers_are_defined_says_so() {
    let l = Limiter::builder().limit(10).window_ms(1_000).build().unwrap();
    let e = l.acquire_with("a", 1, Some("gold")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert_eq!(
        e.to_string(),
        "invalid configuration: unknown tier \"gold\" (no tiers are defined); \
         define it in `tiers`, the policy file or the store"
    );
}

#[test]
fn a_tier_named_by_the_caller_picks_the_rules() {
    let l = manual("memory://").limit(100).window_ms(1_000).build().unwrap();
    assert_eq!(admitted(&l, "a", Some("free"), 10), 5);
    assert_eq!(admitted(&l, "b", Some("pro"), 30), 20);
    assert_eq!(admitted(&l, "c", None, 150), 100, "no tier: limit/window_ms");
    let d = l.acquire_with("a", 1, Some("free")).unwrap();
    assert_eq!((d.allowed, d.limit, d.window_ms), (false, 5, 1_000));
    // an unknown tier is a typed error that names the known ones
    let e = l.acquire_with("a", 1, Some("gold")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(matches!(e, Error::UnknownTier { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("\"gold\"") && text.contains("burst, free, pro"), "{text}");
    // ... on the cold path too (a key never seen)
    assert!(matches!(
        l.try_acquire_with("new", 1, Some("gold")),
        Err(Error::UnknownTier { .. })
    ));
    let (rules, source) = l.policy("x", Some("pro")).unwrap();
    assert_eq!(rules.to_string(), "20/s");
    assert_eq!(
        (source.tier.as_deref(), source.assigned_by),
        (Some("pro"), Origin::Caller)
    );
}

#[test]
fn a_default_tier_stands_in_for_the_limit() {
    let l = manual("memory://").default_tier("free").build().unwrap();
    assert_eq!(admitted(&l, "a", None, 10), 5);
    assert_eq!(l.config().limit, 5, "the default tier's first rule");
    let e = manual("memory://").default_tier("gold").build().unwrap_err();
    assert!(e.to_string().contains("`default_tier`"), "{e}");
    let e = Limiter::builder()
        .tier("x", "5/fortnight")
        .limit(1)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("`tiers`"), "{e}");
    let e = Limiter::builder().tier("x", "5/s, 6/s").limit(1).build().unwrap_err();
    assert!(e.to_string().contains("two rules with a window"), "{e}");
}

#[test]
fn two_rules_admit_only_together_and_report_the_binding_one() {
    let l = manual("memory://").limit(100).build().unwrap();
    // 3/s and 5/min: three in the first second, then the second-rule...
    assert_eq!(admitted(&l, "k", Some("burst"), 10), 3);
    let d = l.acquire_with("k", 1, Some("burst")).unwrap();
    assert!(!d.allowed);
    assert_eq!((d.rule, d.limit, d.window_ms), (0, 3, 1_000), "the 3/s rule denies");
    l.advance_clock(1_000).unwrap();
    assert_eq!(admitted(&l, "k", Some("burst"), 10), 2, "5/min leaves 2");
    let d = l.acquire_with("k", 1, Some("burst")).unwrap();
    assert!(!d.allowed);
    assert_eq!((d.rule, d.limit, d.window_ms), (1, 5, 60_000), "the 5/min rule denies");
    assert_eq!(d.reason, Reason::Exhausted);
    assert!(d.retry_after_ms >= 1_000, "{d:?}");
    let h = d.headers();
    assert_eq!(
        h[0],
        ("RateLimit-Policy", "\"1s\";q=3;w=1, \"1min\";q=5;w=60".to_string())
    );
    assert!(h[1].1.starts_with("\"1min\";r=0;"), "{h:?}");
    // The denials by the minute rule gave the second rule's tokens back:
    // the 3/s bucket still has its last one (12 s refill one minute token).
    l.advance_clock(12_000).unwrap();
    let d = l.acquire_with("k", 1, Some("burst")).unwrap();
    assert!(d.allowed, "{d:?}");
    // requests, not rule buckets, are counted
    let m = l.metrics();
    assert_eq!((m.admitted, m.denied), (6, 17));
    let i = l.inspect("k").unwrap();
    assert_eq!(i.rules, "3/s, 5/min");
    assert_eq!(i.tier.as_deref(), Some("burst"));
    // a cost above any rule's limit is refused before anything is taken
    let e = l.acquire_with("k", 4, Some("burst")).unwrap_err();
    assert!(matches!(e, Error::InvalidCost { cost: 4, limit: 3 }), "{e}");
}

/// A further rule's bucket is named `key`, U+001F, window: a caller's key
/// naming it is refused, even while that bucket is warm in the table (the
/// admit path checks only the length), and it never spends the bucket.
#[test]
fn a_key_naming_a_rule_bucket_is_refused_and_spends_nothing() {
    for mode in [Mode::Lease, Mode::Exact] {
        let l = manual("memory://").limit(100).mode(mode).build().unwrap();
        assert_eq!(admitted(&l, "k", Some("burst"), 2), 2);
        let sub = format!("k{}60000", quotalease::internals::RULE_SEPARATOR);
        for tier in [None, Some("burst"), Some("free")] {
            let e = l.acquire_with(&sub, 1, tier).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidKey, "{mode:?} {tier:?}: {e}");
            assert!(l.try_acquire(&sub, 1).is_err(), "{mode:?}");
        }
        assert_eq!(l.set_limit(&sub, 1, 1_000).unwrap_err().kind(), ErrorKind::InvalidKey);
        assert_eq!(l.inspect(&sub).unwrap_err().kind(), ErrorKind::InvalidKey);
        // The 5/min rule still has the three tokens the two requests left.
        l.advance_clock(1_000).unwrap();
        assert_eq!(admitted(&l, "k", Some("burst"), 10), 3, "{mode:?}");
    }
}

/// The reference: one exact bucket per rule, all-or-nothing.
struct Model {
    rules: Vec<(f64, f64)>, // (limit, window_ms)
    tokens: Vec<f64>,
    at: u64,
}

impl Model {
    fn take(&mut self, now: u64, cost: f64) -> bool {
        let dt = (now - self.at) as f64;
        self.at = now;
        for (t, (limit, window)) in self.tokens.iter_mut().zip(&self.rules) {
            *t = (*t + dt * limit / window).min(*limit);
        }
        if self.tokens.iter().all(|t| *t + 1e-9 >= cost) {
            self.tokens.iter_mut().for_each(|t| *t -= cost);
            true
        } else {
            false
        }
    }
}

#[test]
fn several_rules_in_exact_mode_match_one_exact_bucket_per_rule() {
    // Exact mode asks the authority for every request: with no local
    // tokens, any token lost or kept by a refund would show as a difference.
    let l = Limiter::builder()
        .clock(ClockKind::Manual { start_ms: START })
        .mode(Mode::Exact)
        .limit(1)
        .tier("t", "4/s, 10/10s, 30/min")
        .build()
        .unwrap();
    let mut m = Model {
        rules: vec![(4.0, 1_000.0), (10.0, 10_000.0), (30.0, 60_000.0)],
        tokens: vec![4.0, 10.0, 30.0],
        at: START,
    };
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut now = START;
    let (mut agree, mut admitted) = (0, 0);
    for _ in 0..3_000 {
        let step = next() % 400;
        now += step;
        l.advance_clock(step).unwrap();
        let cost = 1 + next() % 3;
        let got = l.acquire_with("k", cost, Some("t")).unwrap().allowed;
        let want = m.take(now, cost as f64);
        assert_eq!(got, want, "at {} ms, cost {cost}", now - START);
        agree += 1;
        admitted += usize::from(got);
    }
    assert_eq!(agree, 3_000);
    assert!(admitted > 300 && admitted < 2_900, "both outcomes seen: {admitted}");
}

#[test]
fn several_rules_with_leases_hold_every_rule() {
    let l = manual("memory://").limit(1_000).build().unwrap();
    // 3/s and 5/min offered 10/s for two minutes: the minute rule binds.
    let mut per_min = [0u64; 2];
    for ms in (0..120_000).step_by(100) {
        if l.acquire_with("k", 1, Some("burst")).unwrap().allowed {
            per_min[ms / 60_000] += 1;
        }
        l.advance_clock(100).unwrap();
    }
    // the full bucket (5) and 5 a minute refilled, plus the one token a
    // lease may hold
    assert!(per_min.iter().sum::<u64>() <= 5 + 2 * 5 + 1, "{per_min:?}");
    assert!(per_min.iter().all(|n| *n >= 4), "{per_min:?}");
}

#[test]
fn the_memory_store_is_shared_by_limiters_of_one_name() {
    let name = format!("memory://{}", unique("store"));
    let a = manual(&name).limit(100).window_ms(1_000).build().unwrap();
    let b = manual(&name).limit(100).window_ms(1_000).build().unwrap();
    assert_eq!(admitted(&b, "u1", Some("pro"), 30), 20);
    // redefine pro in the store: both limiters hold to it after a refresh
    let v = a.policy_set_tier("pro", "8/s, 100/hour").unwrap();
    assert!(v >= 1);
    b.settle().unwrap();
    b.advance_clock(1_000).unwrap();
    assert_eq!(admitted(&b, "u1", Some("pro"), 30), 8);
    let (rules, src) = b.policy("u1", Some("pro")).unwrap();
    assert_eq!(rules.to_string(), "8/s, 100/hour");
    assert_eq!(src.defined_by, Origin::Store);
    // a key's own entry wins over the tier its callers name
    a.policy_assign("u2", "tier:free").unwrap();
    b.settle().unwrap();
    assert_eq!(admitted(&b, "u2", Some("pro"), 30), 5);
    let i = b.inspect("u2").unwrap();
    assert_eq!(i.tier.as_deref(), Some("free"));
    assert!(i.policy_source.contains("assigned by store"), "{}", i.policy_source);
    a.policy_assign("u3", "2/s").unwrap();
    b.settle().unwrap();
    assert_eq!(admitted(&b, "u3", None, 5), 2);
    // the listing and the entry as stored
    let list = b.policy_list().unwrap();
    assert_eq!(list.tiers, vec![("pro".to_string(), "8/s, 100/hour".to_string())]);
    assert_eq!(list.keys.len(), 2);
    assert_eq!(b.policy_get("u2").unwrap().as_deref(), Some("tier:free"));
    assert_eq!(b.policy_get("nobody").unwrap(), None);
    // deleting gives the configuration's definition back
    a.policy_delete_tier("pro").unwrap();
    a.policy_unassign("u2").unwrap();
    b.settle().unwrap();
    b.advance_clock(1_000).unwrap();
    assert_eq!(admitted(&b, "u2", Some("pro"), 30), 20);
    // bad input: typed errors, nothing written
    let before = b.policy_list().unwrap().version;
    for e in [
        a.policy_set_tier("b@d", "1/s").unwrap_err(),
        a.policy_set_tier("ok", "1/fortnight").unwrap_err(),
        a.policy_assign("k", "tier:").unwrap_err(),
        a.policy_assign("", "1/s").unwrap_err(),
    ] {
        assert!(matches!(e.kind(), ErrorKind::Config | ErrorKind::InvalidKey), "{e}");
    }
    assert_eq!(b.policy_list().unwrap().version, before);
}

#[test]
fn lowering_a_tier_keeps_the_state_and_clamps() {
    let name = format!("memory://{}", unique("clamp"));
    let l = manual(&name).limit(100).tier("plan", "10/min").build().unwrap();
    assert_eq!(admitted(&l, "k", Some("plan"), 8), 8);
    // 2 of 10 left; lowered to 5/min: still 2 (the spent 8 stay spent)
    l.policy_set_tier("plan", "5/min").unwrap();
    assert_eq!(admitted(&l, "k", Some("plan"), 10), 2);
    // raised to 60/min: refills at the new rate (1/s), from empty
    l.policy_set_tier("plan", "60/min").unwrap();
    assert_eq!(admitted(&l, "k", Some("plan"), 10), 0);
    l.advance_clock(3_000).unwrap();
    assert_eq!(admitted(&l, "k", Some("plan"), 10), 3);
}

#[test]
fn a_malformed_store_entry_keeps_the_last_good_policy() {
    let server = common::redis_or_skip!(RedisServer::start());
    let prefix = unique("bad");
    let l = manual(&server.url()).key_prefix(&prefix).limit(100).build().unwrap();
    l.policy_set_tier("free", "2/s").unwrap();
    assert_eq!(admitted(&l, "k", Some("free"), 5), 2);
    // someone writes garbage into the store by hand
    let base = quotalease::internals::policy_base(&prefix);
    server.cli(&["HSET", &format!("{base}:tiers"), "free", "lots/forever"]);
    server.cli(&["INCR", &format!("{base}:version")]);
    l.refresh_policies().unwrap();
    let (rules, _) = l.policy("k", Some("free")).unwrap();
    assert_eq!(rules.to_string(), "2/s", "the last good definition");
    server.cli(&["HSET", &format!("{base}:keys"), "k2", "tier:no such"]);
    server.cli(&["INCR", &format!("{base}:version")]);
    l.refresh_policies().unwrap();
    assert_eq!(l.policy("k2", Some("pro")).unwrap().0.to_string(), "20/s");
}

/// A store that lost a change (a replica promoted without the last write,
/// here a copy of the store's keys put back) and is written again: a limiter
/// that saw the lost change reads the store whole, so the lost change is
/// undone there too. (With versions counted from 1, the next write would
/// get the lost change's number, and that limiter would skip it.)
#[test]
fn a_store_that_lost_a_change_and_is_written_again_is_read_whole() {
    let server = common::redis_or_skip!(RedisServer::start());
    let prefix = unique("lost");
    let a = manual(&server.url()).key_prefix(&prefix).limit(100).build().unwrap();
    let b = manual(&server.url()).key_prefix(&prefix).limit(100).build().unwrap();
    a.policy_set_tier("gold", "2/s").unwrap();
    b.refresh_policies().unwrap();
    // What a replica copied...
    let base = quotalease::internals::policy_base(&prefix);
    let parts = ["tiers", "version", "log"];
    for k in parts {
        assert_eq!(
            server.cli(&["COPY", &format!("{base}:{k}"), &format!("{base}:{k}:copy")]),
            "1"
        );
    }
    // ...before a change it never got, which b applies.
    let lost = a.policy_set_tier("gold", "3/s").unwrap();
    b.refresh_policies().unwrap();
    assert_eq!(b.policy("k", Some("gold")).unwrap().0.to_string(), "3/s");
    // The replica is promoted: the store as it copied it.
    for k in parts {
        let (copy, live) = (format!("{base}:{k}:copy"), format!("{base}:{k}"));
        assert_eq!(server.cli(&["COPY", &copy, &live, "REPLACE"]), "1");
    }
    // Versions are the server's clock in ms: once it is past the lost
    // change's, the next write (to another entry) cannot repeat its version.
    await_cond("the server's clock past the lost version", || {
        let t = server.cli(&["TIME"]);
        let secs: u64 = t.lines().next().unwrap().parse().unwrap();
        secs * 1000 + t.lines().nth(1).unwrap().parse::<u64>().unwrap() / 1000 > lost
    });
    let next = a.policy_assign("someone-else", "1/s").unwrap();
    assert_ne!(next, lost);
    b.refresh_policies().unwrap();
    assert_eq!(
        b.policy("k", Some("gold")).unwrap().0.to_string(),
        "2/s",
        "b still holds the change the store lost"
    );
    assert_eq!(b.policy("someone-else", None).unwrap().0.to_string(), "1/s");
}

#[test]
fn the_redis_store_reaches_every_instance_without_a_restart() {
    let server = common::redis_or_skip!(RedisServer::start());
    let prefix = unique("fleet");
    // real clocks: the ticker polls every 50 ms
    let fleet: Vec<Limiter> = (0..6)
        .map(|_| {
            Limiter::builder()
                .url(server.url())
                .key_prefix(&prefix)
                .limit(1_000)
                .tier("plan", "1000/s")
                .policy_refresh_ms(50)
                .build()
                .unwrap()
        })
        .collect();
    for l in &fleet {
        assert!(l.acquire_with("cust", 1, Some("plan")).unwrap().allowed);
    }
    fleet[0].policy_assign("cust", "3/min").unwrap();
    for (i, l) in fleet.iter().enumerate() {
        await_cond(&format!("instance {i} holds cust to 3/min"), || {
            let d = l.acquire_with("cust", 1, Some("plan")).unwrap();
            d.limit == 3 && d.window_ms == 60_000
        });
    }
    // the stored entry is in the store's own key space, apart from buckets
    let keys = server.cli(&["KEYS", &format!("{prefix}:policy:*")]);
    assert!(keys.contains(":keys") && keys.contains(":version"), "{keys}");
}

/// Script calls the server ran: EVALSHA and EVAL calls, less the failed
/// ones (a script's first EVALSHA fails with NOSCRIPT and is sent again).
fn script_calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    let mut total = 0;
    for line in stats.lines() {
        let Some(("cmdstat_eval" | "cmdstat_evalsha", fields)) = line.trim().split_once(':') else {
            continue;
        };
        let field = |name: &str| -> u64 {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        total += field("calls") - field("failed_calls");
    }
    total
}

/// By default a limiter follows no policy store: its only script calls are
/// its lease calls, however often it settles (`settle` polls a store it
/// follows). With the store on, the same run also polls.
#[test]
fn a_limiter_that_uses_no_store_never_polls_it() {
    let server = common::redis_or_skip!(RedisServer::start());
    let run = |refresh: Option<u64>| {
        let b = Limiter::builder()
            .url(server.url())
            .key_prefix(unique("nopoll"))
            .clock(ClockKind::Manual { start_ms: START })
            .limit(100)
            .lease_size(10);
        let l = match refresh {
            Some(ms) => b.policy_refresh_ms(ms),
            None => b,
        }
        .build()
        .unwrap();
        let before = script_calls(&server);
        for _ in 0..3 {
            for _ in 0..25 {
                assert!(l.acquire("k", 1).unwrap().allowed);
            }
            l.settle().unwrap();
        }
        (script_calls(&server) - before, l.metrics().backend_calls)
    };
    let (scripts, leases) = run(None);
    assert!(leases > 0);
    assert_eq!(
        scripts, leases,
        "a limiter with no store made script calls other than its leases"
    );
    let (scripts, leases) = run(Some(1_000));
    assert!(
        scripts > leases,
        "the store is polled when followed ({scripts} scripts, {leases} leases)"
    );
}

/// 6 instances on one Redis, manual clocks, the store polled every
/// (virtual) second: a key's tier changes mid-run; every instance enforces
/// the new limit within the refresh period, and the fleet's admitted count
/// stays within what the old and new limits allow for their intervals.
#[test]
fn a_fleet_follows_a_tier_change_within_the_refresh_period() {
    let server = common::redis_or_skip!(RedisServer::start());
    let prefix = unique("change");
    let fleet: Vec<Limiter> = (0..6)
        .map(|_| {
            Limiter::builder()
                .url(server.url())
                .key_prefix(&prefix)
                .clock(ClockKind::Manual { start_ms: START })
                .policy_refresh_ms(1_000)
                .limit(1)
                .tier("small", "60/s")
                .tier("large", "240/s")
                .build()
                .unwrap()
        })
        .collect();
    fleet[0].policy_assign("cust", "tier:small").unwrap();
    for l in &fleet {
        l.refresh_policies().unwrap();
    }
    let (step, secs, change_at) = (10u64, 20u64, 10_000u64);
    let mut admitted_before = 0u64;
    let mut admitted_after = 0u64;
    let mut late = vec![0u64; fleet.len()];
    let mut t = 0;
    while t < secs * 1_000 {
        if t == change_at {
            fleet[0].policy_assign("cust", "tier:large").unwrap();
        }
        for (i, l) in fleet.iter().enumerate() {
            // each instance offers 100/s (600/s in all)
            let d = l.acquire("cust", 1).unwrap();
            if d.allowed {
                if t < change_at {
                    admitted_before += 1;
                } else {
                    admitted_after += 1;
                }
            }
            if t >= change_at && d.limit != 240 {
                late[i] = late[i].max(t - change_at);
            }
        }
        t += step;
        for l in &fleet {
            l.advance_clock(step).unwrap();
            if t % 1_000 == 0 {
                l.settle().unwrap();
            }
        }
    }
    assert!(
        late.iter().all(|&ms| ms < 1_000),
        "every instance on the new limit within the 1 s refresh period: {late:?}"
    );
    let budget = 6 * 5; // 2 % of 240, at least 1, per instance as an upper bound
    let before_allow = 60 + 60 * change_at / 1_000;
    assert!(
        admitted_before <= before_allow + budget,
        "{admitted_before} > {before_allow}"
    );
    assert!(admitted_before >= before_allow * 9 / 10, "{admitted_before}");
    // after the change: at most the old rate for one refresh period, then the new
    let after_secs = secs - change_at / 1_000;
    let after_allow = 240 * after_secs + 240;
    assert!(
        admitted_after <= after_allow + budget,
        "{admitted_after} > {after_allow}"
    );
    // and a rate granted under the old limit ends at the change: the fleet
    // is at the new rate within the refresh period (rates of the old limit
    // ran on for up to 5 s: 1932 here)
    assert!(admitted_after >= 240 * (after_secs - 1), "{admitted_after}");
}

#[test]
fn a_policy_file_is_read_and_followed_when_it_changes() {
    let dir = std::env::temp_dir().join(unique("policyfile"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policies.toml");
    std::fs::write(
        &path,
        "default_tier = \"free\"\n[tiers]\nfree = \"4/s\"\nteam = [\"10/s\", \"100/min\"]\n[keys]\n\"vip\" = \"tier:team\"\n\"bot\" = \"blocked\"\n",
    )
    .unwrap();
    let l = Limiter::builder()
        .clock(ClockKind::Manual { start_ms: START })
        .policy_refresh_ms(1_000)
        .policy_file(path.to_str().unwrap())
        .build()
        .unwrap();
    assert_eq!(admitted(&l, "anyone", None, 10), 4);
    assert_eq!(admitted(&l, "vip", None, 20), 10);
    assert_eq!(l.acquire("bot", 1).unwrap().reason, Reason::Blocked);
    let (_, src) = l.policy("vip", None).unwrap();
    assert_eq!((src.assigned_by, src.defined_by), (Origin::File, Origin::File));
    // the file changes: followed at the next refresh (a new mtime)
    std::fs::write(&path, "default_tier = \"free\"\n[tiers]\nfree = \"2/s\"\n").unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(later)
        .unwrap();
    l.settle().unwrap();
    l.advance_clock(1_000).unwrap();
    assert_eq!(admitted(&l, "anyone", None, 10), 2);
    // a broken file: logged, the last good one kept
    std::fs::write(&path, "[tiers\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(later + std::time::Duration::from_secs(5))
        .unwrap();
    l.settle().unwrap();
    l.advance_clock(1_000).unwrap();
    assert_eq!(admitted(&l, "anyone", None, 10), 2);
    // a missing or broken file at build time is a typed error
    let e = Limiter::builder()
        .policy_file("/no/such/file.toml")
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("`policy_file`"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_limiter_without_the_store_refuses_to_write_it() {
    let name = format!("memory://{}", unique("writer"));
    let writer = Limiter::builder().url(&name).limit(1).build().unwrap();
    let reader = manual(&name).limit(100).build().unwrap();
    let e = writer.policy_set_tier("pro", "7/s").unwrap_err();
    assert!(e.to_string().contains("nothing was written"), "{e}");
    reader.settle().unwrap();
    assert_eq!(
        reader.policy("k", Some("pro")).unwrap().0.to_string(),
        "20/s",
        "not written"
    );
    assert!(writer.refresh_policies().is_err());
}

#[test]
fn a_lone_holder_on_rates_serves_a_burst_after_a_pause_as_one_bucket() {
    // Adaptive leasing (no lease_size): the bucket ran dry, the holder went
    // on a rate; a second later the refill (3 tokens) is there for a burst.
    let l = Limiter::builder()
        .clock(ClockKind::Manual { start_ms: START })
        .limit(3)
        .window_ms(1_000)
        .build()
        .unwrap();
    assert_eq!(admitted(&l, "k", None, 4), 3);
    l.advance_clock(1_000).unwrap();
    assert_eq!(admitted(&l, "k", None, 4), 3);
    l.advance_clock(500).unwrap();
    assert_eq!(admitted(&l, "k", None, 4), 1, "half a second refills 1.5 tokens");
}

#[test]
fn a_further_rule_evicted_from_the_table_comes_back_with_its_rule() {
    let l = manual("memory://").limit(100).max_keys(16).build().unwrap();
    assert_eq!(admitted(&l, "k", Some("burst"), 2), 2);
    // other keys push the table past max_keys: the oldest entries (k's) go
    for i in 0..40 {
        l.acquire(&format!("other{i}"), 1).unwrap();
        l.advance_clock(1).unwrap();
    }
    l.advance_clock(1_000).unwrap();
    // both rules hold again: 3/s now, and 5/min counts what it stored (2 spent)
    assert_eq!(admitted(&l, "k", Some("burst"), 10), 3);
    let d = l.acquire_with("k", 1, Some("burst")).unwrap();
    assert_eq!((d.allowed, d.rules().len()), (false, 2));
}

/// Shadow mode: every request the rules deny is admitted with reason
/// `shadow`, exactly where an enforcing limiter denies, and counted.
#[test]
fn a_limiter_in_shadow_mode_admits_exactly_what_enforcing_would_deny() {
    let enforcing = manual("memory://").limit(5).window_ms(1_000).build().unwrap();
    let shadow = manual("memory://")
        .limit(5)
        .window_ms(1_000)
        .shadow(true)
        .build()
        .unwrap();
    let mut would_deny = 0;
    for step in 0..40u64 {
        if step % 10 == 9 {
            enforcing.advance_clock(500).unwrap();
            shadow.advance_clock(500).unwrap();
        }
        let want = enforcing.acquire("k", 1).unwrap();
        let got = if step % 2 == 0 {
            shadow.acquire("k", 1).unwrap()
        } else {
            shadow.try_acquire("k", 1).unwrap()
        };
        assert!(got.allowed, "step {step}: shadow mode admits everything");
        assert_eq!(
            got.reason == Reason::Shadow,
            !want.allowed,
            "step {step}: {want:?} / {got:?}"
        );
        if !want.allowed {
            would_deny += 1;
            assert!(got.retry_after_ms > 0, "the would-be denial's hint is kept");
            assert_eq!(got.remaining, 0);
            assert!(
                got.headers().is_empty(),
                "no RateLimit headers for rules in shadow mode"
            );
        }
    }
    assert!(
        would_deny >= 20,
        "the schedule must deny often to test anything: {would_deny}"
    );
    let m = shadow.metrics();
    assert_eq!(m.shadow_denied, would_deny);
    assert_eq!(m.denied, would_deny, "`denied` is what the rules decided");
    assert_eq!(m.admitted + m.denied, 40);
    assert_eq!(enforcing.metrics().shadow_denied, 0);
    assert!(shadow
        .metrics_prometheus()
        .contains(&format!("quotalease_shadow_denied_total {would_deny}\n")));
    let (rules, _) = shadow.policy("k", None).unwrap();
    assert!(rules.is_shadow() && rules.to_string() == "shadow 5/s", "{rules}");
}

/// A tier or a key's own rules in shadow mode leave the others enforced,
/// and the store moves them to enforced without a restart.
#[test]
fn a_shadow_rule_is_enforced_through_the_store_without_a_restart() {
    let name = format!("memory://{}", unique("shadow"));
    let a = manual(&name)
        .limit(100)
        .window_ms(1_000)
        .tier("beta", "shadow 3/s, 4/min")
        .build()
        .unwrap();
    let b = manual(&name)
        .limit(100)
        .window_ms(1_000)
        .tier("beta", "shadow 3/s, 4/min")
        .build()
        .unwrap();
    let reasons = |l: &Limiter, key: &str, tier: Option<&str>, n: usize| -> Vec<(bool, Reason)> {
        (0..n)
            .map(|_| {
                let d = l.acquire_with(key, 1, tier).unwrap();
                (d.allowed, d.reason)
            })
            .collect()
    };
    let beta = reasons(&b, "u1", Some("beta"), 5);
    assert!(beta.iter().all(|(ok, _)| *ok), "{beta:?}");
    assert_eq!(beta.iter().filter(|(_, r)| *r == Reason::Shadow).count(), 2, "{beta:?}");
    // the other tiers of the same limiter are enforced
    assert_eq!(admitted(&b, "u2", Some("free"), 8), 5);
    // the 4/min rule binds after the refill of the 3/s one: its fourth
    // token, then a shadow denial by that rule
    b.advance_clock(1_000).unwrap();
    assert_eq!(b.acquire_with("u1", 1, Some("beta")).unwrap().reason, Reason::Lease);
    let d = b.acquire_with("u1", 1, Some("beta")).unwrap();
    assert_eq!(
        (d.allowed, d.reason, d.window_ms),
        (true, Reason::Shadow, 60_000),
        "{d:?}"
    );
    // a key's own rules in shadow mode, from the store
    a.policy_assign("u3", "shadow 2/s").unwrap();
    b.settle().unwrap();
    assert_eq!(admitted(&b, "u3", None, 6), 6);
    assert_eq!(b.policy_get("u3").unwrap().as_deref(), Some("shadow 2/s"));
    // enforced from the store: same tier name and rules, no restart
    a.policy_set_tier("beta", "3/s, 4/min").unwrap();
    a.policy_assign("u3", "2/s").unwrap();
    b.settle().unwrap();
    b.advance_clock(60_000).unwrap();
    assert_eq!(admitted(&b, "u1", Some("beta"), 6), 3);
    assert_eq!(admitted(&b, "u3", None, 6), 2);
    let m = b.metrics();
    assert_eq!(m.shadow_denied, 2 + 1 + 4, "{m:?}");
}

/// Three limiters of 1000 per minute on `server`, following its store every 50 ms.
fn redis_fleet(server: &RedisServer, prefix: &str) -> Vec<Limiter> {
    (0..3)
        .map(|_| {
            Limiter::builder()
                .url(server.url())
                .key_prefix(prefix)
                .limit(1_000)
                .policy_refresh_ms(50)
                .build()
                .unwrap()
        })
        .collect()
}

/// Shadow mode on a real redis-server: a key moved from shadow to enforced
/// in the store is denied by every instance of a fleet.
#[test]
fn the_redis_store_moves_a_key_from_shadow_to_enforced_across_a_fleet() {
    let server = common::redis_or_skip!(RedisServer::start());
    let prefix = unique("shadow");
    let fleet = redis_fleet(&server, &prefix);
    fleet[0].policy_assign("cust", "shadow 2/hour").unwrap();
    for (i, l) in fleet.iter().enumerate() {
        await_cond(&format!("instance {i} holds cust to shadow 2/hour"), || {
            l.policy("cust", None).unwrap().0.to_string() == "shadow 2/hour"
        });
    }
    for l in &fleet {
        for _ in 0..5 {
            assert!(l.acquire("cust", 1).unwrap().allowed);
        }
    }
    let shadowed: u64 = fleet.iter().map(|l| l.metrics().shadow_denied).sum();
    assert_eq!(
        shadowed,
        15 - 2,
        "the fleet's bucket admits 2 an hour; the rest is shadow"
    );
    fleet[0].policy_assign("cust", "2/hour").unwrap();
    for (i, l) in fleet.iter().enumerate() {
        await_cond(&format!("instance {i} enforces cust"), || {
            let d = l.acquire("cust", 1).unwrap();
            !d.allowed && d.reason == Reason::Exhausted
        });
    }
}

/// Allow and deny entries: `unlimited` admits everything and spends
/// nothing, `blocked` denies everything (even in shadow mode, and even
/// when the instance held leased tokens of the key); removing the entry
/// gives the key its rules back with its bucket as it was.
#[test]
fn allow_and_deny_entries_in_the_store_override_the_rules() {
    let name = format!("memory://{}", unique("access"));
    let a = manual(&name).limit(3).window_ms(60_000).build().unwrap();
    let b = manual(&name)
        .limit(3)
        .window_ms(60_000)
        .lease_size(3)
        .shadow(true)
        .build()
        .unwrap();
    // b holds leased tokens of "abuser" before the entry lands
    assert!(b.acquire("abuser", 1).unwrap().allowed);
    assert!(b.inspect("abuser").unwrap().local_tokens > 0);
    a.policy_assign("abuser", "blocked").unwrap();
    a.policy_assign("partner", "unlimited").unwrap();
    b.settle().unwrap();
    assert_eq!(b.inspect("abuser").unwrap().local_tokens, 0, "its tokens went back");
    for _ in 0..3 {
        let d = b.acquire("abuser", 1).unwrap();
        assert_eq!((d.allowed, d.reason), (false, Reason::Blocked), "{d:?}");
        assert_eq!(d.retry_after_ms, 60_000);
        assert_eq!(d.headers(), vec![("Retry-After", "60".to_string())]);
        let d = b.try_acquire("abuser", 1).unwrap();
        assert_eq!(d.reason, Reason::Blocked);
    }
    let before = b.metrics();
    for _ in 0..10 {
        let d = b.acquire("partner", 1).unwrap();
        assert_eq!(
            (d.allowed, d.reason, d.remaining),
            (true, Reason::Unlimited, 3),
            "{d:?}"
        );
        assert!(d.headers().is_empty());
    }
    let after = b.metrics();
    assert_eq!(after.admitted - before.admitted, 10);
    assert_eq!(after.tokens_leased, before.tokens_leased, "unlimited spends nothing");
    assert_eq!(after.shadow_denied, 0, "a deny entry is no rule under trial");
    let (_, src) = b.policy("abuser", None).unwrap();
    assert_eq!(src.to_string(), "blocked (from store)");
    assert_eq!(b.policy_get("partner").unwrap().as_deref(), Some("unlimited"));
    // the entries go: the rules again, the bucket as the first lease left it
    a.policy_unassign("abuser").unwrap();
    a.policy_unassign("partner").unwrap();
    b.settle().unwrap();
    let abuser: Vec<Reason> = (0..4).map(|_| b.acquire("abuser", 1).unwrap().reason).collect();
    assert_eq!(abuser, [Reason::Lease, Reason::Lease, Reason::Shadow, Reason::Shadow]);
    assert_eq!(admitted(&a, "partner", None, 5), 3);
}

/// A deny entry in the policy file, and on a real redis-server across a fleet.
#[test]
fn a_deny_entry_reaches_every_instance_of_a_redis_fleet() {
    let server = common::redis_or_skip!(RedisServer::start());
    let prefix = unique("deny");
    let fleet = redis_fleet(&server, &prefix);
    for l in &fleet {
        assert!(l.acquire("abuser", 1).unwrap().allowed);
    }
    fleet[0].policy_assign("abuser", "blocked").unwrap();
    for (i, l) in fleet.iter().enumerate() {
        await_cond(&format!("instance {i} blocks abuser"), || {
            l.acquire("abuser", 1).unwrap().reason == Reason::Blocked
        });
        assert_eq!(l.inspect("abuser").unwrap().local_tokens, 0);
    }
    fleet[0].policy_unassign("abuser").unwrap();
    for (i, l) in fleet.iter().enumerate() {
        await_cond(&format!("instance {i} admits abuser again"), || {
            l.acquire("abuser", 1).unwrap().allowed
        });
    }
}
