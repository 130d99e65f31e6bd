//! The tables `simulate` prints.

use std::fmt::Write as _;

use crate::sim::{Report, Strategy, StrategyResult};

/// Left-align the first column, right-align the others.
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width = |c: usize| {
        rows.iter()
            .filter_map(|r| r.get(c))
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..cols).map(width).collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c == 0 {
                let _ = write!(line, "{cell:<w$}", w = widths[0]);
            } else {
                let _ = write!(line, "  {cell:>w$}", w = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn secs(ms: u64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "-".into()
    } else {
        format!("{:.2}x", a as f64 / b as f64)
    }
}

fn ms(ns: f64) -> String {
    let ms = ns / 1e6;
    if ms == 0.0 {
        "0".into()
    } else if ms < 0.01 {
        format!("{:.1} us", ns / 1e3)
    } else {
        format!("{ms:.2} ms")
    }
}

fn label(r: &Report, s: Strategy) -> String {
    match s {
        Strategy::StaticShare => format!("static share (1/{})", r.scenario.shape.instances),
        _ => s.name().to_string(),
    }
}

/// The whole printed report.
pub fn render(r: &Report) -> String {
    let sc = &r.scenario;
    let shape = &sc.shape;
    let mut out = String::new();
    match &r.redis {
        None => {
            let _ = writeln!(
                out,
                "quotalease simulate: {} of traffic in virtual time ({:.1} s of wall time), seed {}",
                secs(shape.duration_ms),
                r.elapsed.as_secs_f64(),
                shape.seed
            );
        }
        Some(url) => {
            let _ = writeln!(
                out,
                "quotalease simulate: {} of traffic in real time against {}, seed {}",
                secs(shape.duration_ms),
                quotalease::RedactedUrl(url),
                shape.seed
            );
        }
    }
    for (i, p) in sc.phases.iter().enumerate() {
        let head = if i == 0 { "  fleet" } else { "" };
        let _ = writeln!(out, "{head:<9} {:>7}  {}", secs(p.start), p.label);
    }
    let weights: Vec<f64> = (1..=shape.instances.min(8))
        .map(|r| 1.0 / (r as f64).powf(shape.skew))
        .collect();
    let total: f64 = weights.iter().sum();
    let shares: Vec<String> = weights.iter().map(|w| format!("{:.0}%", w * 100.0 / total)).collect();
    let _ = writeln!(
        out,
        "          load balancer: a key's instances get traffic in proportion to 1/rank^{} ({} with {} running)",
        shape.skew,
        shares.join(" "),
        weights.len()
    );
    let _ = writeln!(
        out,
        "  limit   {} per {} for every key; lease {} tokens, refill below {}, lease TTL {} ms",
        shape.limit,
        secs(shape.window_ms),
        r.lease_size,
        r.refill_threshold,
        r.lease_ttl_ms
    );
    for (k, spec) in sc.keys.iter().enumerate() {
        let _ = writeln!(
            out,
            "  key     {:<7} {:>7} requests, {}",
            spec.name, sc.requests[k], spec.about
        );
    }
    let total_allow: u64 = r.allowance.iter().sum();
    let _ = writeln!(
        out,
        "  allowance {total_allow}: what one exact global token bucket with no latency admits"
    );
    out.push('\n');

    let latency_head = match &r.redis {
        None => format!("added latency @ {} ms RTT", r.rtt_ms),
        Some(_) => "acquire latency (measured)".to_string(),
    };
    let mut rows = vec![
        vec![
            "strategy".to_string(),
            "admitted".into(),
            "vs allowance".into(),
            "overshoot / bound".into(),
            "false denials".into(),
            "authority calls".into(),
            latency_head,
            String::new(),
        ],
        vec![
            String::new(),
            String::new(),
            String::new(),
            "(worst key)".into(),
            "(% of allowance)".into(),
            "per admitted".into(),
            "mean".into(),
            "p99".into(),
        ],
    ];
    for res in &r.results {
        rows.push(row(r, res, total_allow));
    }
    out.push_str(&table(&rows));
    out.push('\n');

    let per_key_calls = r.redis.is_none();
    let mut head = vec!["admitted by key".to_string()];
    head.extend(sc.keys.iter().map(|k| k.name.to_string()));
    if per_key_calls {
        for (i, k) in sc.keys.iter().enumerate() {
            head.push(if i == 0 {
                format!("calls/adm. {}", k.name)
            } else {
                k.name.to_string()
            });
        }
    }
    let mut rows = vec![head];
    let mut allow = vec!["allowance".to_string()];
    allow.extend(r.allowance.iter().map(u64::to_string));
    rows.push(allow);
    for res in &r.results {
        let mut row = vec![label(r, res.strategy)];
        for (k, a) in res.keys.iter().zip(&r.allowance) {
            row.push(format!("{} ({})", k.admitted, ratio(k.admitted, *a)));
        }
        if per_key_calls {
            for k in &res.keys {
                row.push(if k.admitted == 0 {
                    "-".into()
                } else if k.calls == 0 {
                    "0".into()
                } else {
                    format!("{:.2}", k.calls as f64 / k.admitted as f64)
                });
            }
        }
        rows.push(row);
    }
    out.push_str(&table(&rows));
    out.push('\n');
    out.push_str(&notes(r));
    out
}

fn row(r: &Report, res: &StrategyResult, total_allow: u64) -> Vec<String> {
    let admitted = res.admitted();
    let fd = res.false_denials();
    let bound = match res.bound {
        Some(b) => b.to_string(),
        None => "none".into(),
    };
    let calls = if admitted == 0 {
        "-".into()
    } else if res.authority_calls == 0 {
        "0".into()
    } else {
        format!("{:.3}", res.authority_calls as f64 / admitted as f64)
    };
    let pct = if total_allow == 0 {
        0.0
    } else {
        fd as f64 * 100.0 / total_allow as f64
    };
    vec![
        label(r, res.strategy),
        admitted.to_string(),
        ratio(admitted, total_allow),
        format!("{} / {bound}", res.overshoot()),
        format!("{fd} ({pct:.1}%)"),
        calls,
        ms(res.latency.mean()),
        ms(res.latency.quantile(0.99) as f64),
    ]
}

fn sc_index(r: &Report, name: &str) -> Option<usize> {
    r.scenario.keys.iter().position(|k| k.name == name)
}

fn per_key_calls_note(r: &Report) -> bool {
    r.redis.is_none()
}

fn notes(r: &Report) -> String {
    let n = r.scenario.shape.instances;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "overshoot: most tokens admitted beyond the global budget at any moment (a token bucket of the\n  \
         key's limit charged with every admission); leased stays within instances x lease_size = {n} x {}.",
        r.lease_size
    );
    let _ = writeln!(
        out,
        "false denials: requests denied while that global budget still had a token (each token counted once)."
    );
    if r.redis.is_none() {
        let _ = writeln!(
            out,
            "added latency: exact waits one round trip per request; leased only when a request finds no\n  \
             local token and waits for a lease (prefetches run in the background); local buckets never wait."
        );
    }
    if per_key_calls_note(r) {
        let _ = writeln!(
            out,
            "calls/adm.: authority calls made inside that key's acquire calls, per admitted request (lease-TTL\n  \
             give-backs run outside them and count only in the first table); local buckets make none."
        );
    }
    if let (Some(naive), Some(stat), Some(exact), Some(leased)) = (
        r.result(Strategy::PerInstance),
        r.result(Strategy::StaticShare),
        r.result(Strategy::Exact),
        r.result(Strategy::Leased),
    ) {
        let allow: u64 = r.allowance.iter().sum::<u64>().max(1);
        let whale = sc_index(r, "whale");
        let steady = sc_index(r, "steady");
        let _ = writeln!(out);
        if let Some(w) = whale {
            let _ = writeln!(
                out,
                "per-instance limits let the whale through at {:.1}x its allowance: each instance enforces the\n  \
                 whole limit on its own.",
                naive.keys[w].admitted as f64 / r.allowance[w].max(1) as f64
            );
        }
        if let Some(s) = steady {
            let _ = writeln!(
                out,
                "static share denied {} of the steady key's {} requests although that key stays under its limit:\n  \
                 limit/{} is too little for the busiest instance, and too little in total when fewer run.",
                stat.keys[s].denied, r.scenario.requests[s], r.scenario.shape.instances
            );
        }
        let _ = writeln!(
            out,
            "fixed leases admitted {:.2}x the allowance with {} false denials; overshoot stays within {} x {}.",
            leased.admitted() as f64 / allow as f64,
            leased.false_denials(),
            r.scenario.max_running,
            r.lease_size
        );
        if let (Some(s), Some(w)) = (steady, whale) {
            let per = |res: &crate::sim::StrategyResult, k: usize| {
                res.keys[k].calls as f64 / res.keys[k].admitted.max(1) as f64
            };
            let _ = writeln!(
                out,
                "  It called the authority {:.2} times per admitted request of the steady key (exact: {:.2}) and\n  \
                 {:.2} times on the saturated whale (exact: {:.2}, one per request, denied ones included).",
                per(leased, s),
                per(exact, s),
                per(leased, w),
                per(exact, w)
            );
            if let Some(adaptive) = r.result(Strategy::Adaptive) {
                let _ = writeln!(
                    out,
                    "adaptive leases admitted {:.2}x the allowance with {} false denials, overshoot within {}; on\n  \
                     the saturated whale it called the authority {:.2} times per admitted request (fixed: {:.2}):\n  \
                     each instance there spends a rate grant and denies locally, with no call per request.",
                    adaptive.admitted() as f64 / allow as f64,
                    adaptive.false_denials(),
                    adaptive.bound.unwrap_or(0),
                    per(adaptive, w),
                    per(leased, w)
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align() {
        let t = table(&[vec!["a".into(), "1".into()], vec!["long name".into(), "12345".into()]]);
        assert_eq!(t, "a              1\nlong name  12345\n");
    }
}
