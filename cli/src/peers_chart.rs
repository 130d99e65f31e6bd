//! `quotalease bench --chart`: a self-contained SVG bar chart of a run,
//! admitted/s and Redis commands per admitted request for each strategy,
//! grouped by key distribution.

use std::fmt::Write as _;

use crate::bench::{Bench, Strategy};
use crate::chart::{esc, nice};
use crate::dist::{Dist, ZIPF_S};

const W: f64 = 1000.0;
const H: f64 = 580.0;
const PANEL_TOP: f64 = 150.0;
const PANEL_H: f64 = 300.0;
const PANELS_X: [f64; 2] = [80.0, 590.0];
const PANEL_W: f64 = 380.0;

fn colour(s: Strategy) -> &'static str {
    match s {
        Strategy::Lease => "#2ca02c",
        Strategy::Exact => "#1f77b4",
        Strategy::Gcra => "#9467bd",
    }
}

/// 1234567 -> "1.23M", 93423 -> "93.4k".
fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.2}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn small(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn axis_label(v: f64, big: bool) -> String {
    if big && v >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if big && v >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round())
    } else {
        format!("{v:.1}")
    }
}

/// 2.5 -> "2.5", 2.0 -> "2".
fn trim(v: f64) -> String {
    let t = format!("{v:.2}");
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// 1000000000 -> "1e9", 600 -> "600".
fn count(v: u64) -> String {
    let (mut mant, mut z) = (v, 0u32);
    while mant != 0 && mant % 10 == 0 {
        mant /= 10;
        z += 1;
    }
    match (v >= 100_000 && z >= 5, mant) {
        (true, 1) => format!("1e{z}"),
        (true, m) => format!("{m}e{z}"),
        _ => v.to_string(),
    }
}

/// One bar: (strategy, full value, solid part, label lines).
type Bar = (Strategy, f64, f64, Vec<String>);

fn panel(o: &mut String, x0: f64, title: &str, groups: &[(String, Vec<Bar>)], big: bool) {
    let top = PANEL_TOP;
    let bottom = top + PANEL_H;
    let max = groups
        .iter()
        .flat_map(|(_, b)| b.iter().map(|b| b.1))
        .fold(0.0, f64::max);
    let step = nice(max * 1.25 / 5.0);
    let y_max = ((max * 1.25 / step).ceil() * step).max(step);
    let y_of = |v: f64| bottom - v / y_max * PANEL_H;
    let _ = writeln!(
        o,
        r##"<text x="{x0}" y="{}" font-size="15" font-weight="bold" fill="#222">{}</text>"##,
        top - 18.0,
        esc(title)
    );
    let mut v = 0.0;
    while v <= y_max + 1e-9 {
        let y = y_of(v);
        let _ = writeln!(
            o,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e6e6e6"/><text x="{:.1}" y="{:.1}" font-size="11" fill="#666" text-anchor="end">{}</text>"##,
            x0 + PANEL_W,
            x0 - 6.0,
            y + 4.0,
            axis_label(v, big)
        );
        v += step;
    }
    let _ = writeln!(
        o,
        r##"<line x1="{x0}" y1="{bottom}" x2="{:.1}" y2="{bottom}" stroke="#888"/>"##,
        x0 + PANEL_W
    );
    let gw = PANEL_W / groups.len().max(1) as f64;
    let bw = (gw * 0.8 / 3.0).min(60.0);
    let mut labels = String::new();
    for (gi, (label, bars)) in groups.iter().enumerate() {
        let gx = x0 + gi as f64 * gw;
        let start = gx + (gw - bw * bars.len() as f64) / 2.0;
        for (bi, (s, full, solid, lines)) in bars.iter().enumerate() {
            let x = start + bi as f64 * bw + 3.0;
            let w = bw - 6.0;
            let c = colour(*s);
            let (yf, ys) = (y_of(*full), y_of(*solid));
            if full > solid {
                let _ = writeln!(
                    o,
                    r##"<rect x="{x:.1}" y="{yf:.1}" width="{w:.1}" height="{:.1}" fill="{c}" fill-opacity="0.3" stroke="{c}"/>"##,
                    bottom - yf
                );
            }
            let _ = writeln!(
                o,
                r##"<rect x="{x:.1}" y="{ys:.1}" width="{w:.1}" height="{:.1}" fill="{c}"/>"##,
                (bottom - ys).max(0.5)
            );
            // The last line (the value) sits on the bar, bold; the others
            // above it. Drawn after every bar, on a white halo.
            for (li, line) in lines.iter().rev().enumerate() {
                let (weight, fill, size) = if li == 0 {
                    ("bold", c, 12)
                } else {
                    ("normal", "#444", 11)
                };
                let _ = writeln!(
                    labels,
                    r##"<text x="{:.1}" y="{:.1}" font-size="{size}" font-weight="{weight}" fill="{fill}" stroke="#ffffff" stroke-width="3" paint-order="stroke" text-anchor="middle">{}</text>"##,
                    x + w / 2.0,
                    yf - 5.0 - li as f64 * 13.0,
                    esc(line)
                );
            }
        }
        for (li, part) in label.split('\n').enumerate() {
            let (size, fill) = if li == 0 { (14, "#222") } else { (12, "#555") };
            let _ = writeln!(
                o,
                r##"<text x="{:.1}" y="{:.1}" font-size="{size}" font-weight="{}" fill="{fill}" text-anchor="middle">{}</text>"##,
                gx + gw / 2.0,
                bottom + 20.0 + li as f64 * 16.0,
                if li == 0 { "bold" } else { "normal" },
                esc(part)
            );
        }
    }
    o.push_str(&labels);
}

/// "12.8x fewer" or "1.25x more" commands than gcra's `g`.
fn fewer(v: f64, g: f64) -> String {
    if v <= g {
        format!("{:.1}x fewer", g / v.max(1e-12))
    } else {
        format!("{:.2}x more", v / g.max(1e-12))
    }
}

/// The chart of `b`, as an SVG document.
pub fn svg(b: &Bench) -> String {
    let o = &b.options;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let _ = writeln!(
        s,
        r##"<text x="{}" y="30" font-size="19" font-weight="bold" fill="#222">quotalease leasing vs per-request Redis limiting, one Redis, same load</text>"##,
        PANELS_X[0]
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="52" font-size="13" fill="#555">quotalease bench: {} threads x {} s per strategy, limit {} per {} ms, lease_size {} (refill_threshold {})</text>"##,
        PANELS_X[0],
        o.threads,
        o.duration_ms as f64 / 1000.0,
        count(o.limit),
        o.window_ms,
        b.lease_size,
        b.refill_threshold
    );
    let bounds = format!(
        "overshoot bound: lease {} tokens (1 instance x lease_size), exact 0, gcra 0",
        b.lease_size
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="70" font-size="13" fill="#555">{}</text>"##,
        PANELS_X[0],
        esc(&bounds)
    );
    let mut lx = PANELS_X[0];
    for st in Strategy::ALL {
        let name = format!("{} ({})", st.as_str(), st.about());
        let _ = writeln!(
            s,
            r##"<rect x="{lx}" y="88" width="14" height="14" fill="{}"/><text x="{}" y="100" font-size="13" fill="#333">{}</text>"##,
            colour(st),
            lx + 20.0,
            esc(&name)
        );
        lx += 40.0 + name.chars().count() as f64 * 6.6;
    }
    let group = |d: &crate::bench::DistResult| {
        let what = match d.dist {
            Dist::Hot => "1 key".to_string(),
            Dist::Zipf => format!("Zipf s={ZIPF_S}, {} keys", d.keys),
            Dist::RoundRobin => format!("round-robin, {} keys", d.keys),
        };
        format!("{}\n{what}", d.dist.as_str())
    };
    let thr: Vec<(String, Vec<Bar>)> = b
        .dists
        .iter()
        .map(|d| {
            let g = d.get(Strategy::Gcra).admitted_per_s().max(1e-9);
            let bars = d
                .results
                .iter()
                .map(|r| {
                    let v = r.admitted_per_s();
                    let mut lines = vec![si(v)];
                    if r.strategy != Strategy::Gcra {
                        lines.insert(0, format!("{:.1}x gcra", v / g));
                    }
                    (r.strategy, v, v, lines)
                })
                .collect();
            (group(d), bars)
        })
        .collect();
    let cmds: Vec<(String, Vec<Bar>)> = b
        .dists
        .iter()
        .map(|d| {
            let g = d.get(Strategy::Gcra).commands_per_admitted();
            let bars = d
                .results
                .iter()
                .map(|r| {
                    let v = r.commands_per_admitted();
                    let mut lines = vec![small(v)];
                    if r.strategy != Strategy::Gcra {
                        lines.insert(0, fewer(v, g));
                    }
                    (r.strategy, v, r.calls_per_admitted(), lines)
                })
                .collect();
            (group(d), bars)
        })
        .collect();
    panel(
        &mut s,
        PANELS_X[0],
        "admitted requests / s (higher is better)",
        &thr,
        true,
    );
    panel(
        &mut s,
        PANELS_X[1],
        "Redis commands / admitted (lower is better)",
        &cmds,
        false,
    );
    let note_y = PANEL_TOP + PANEL_H + 72.0;
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{note_y}" font-size="12" fill="#555">Right: whole bar = every command Redis ran (INFO commandstats delta), solid part = script calls (EVALSHA round trips).</text>"##,
        PANELS_X[0]
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{}" font-size="12" fill="#555">Left: closed loop, each thread sends its next request when the last is decided; all strategies replay the same key sequences.</text>"##,
        PANELS_X[0],
        note_y + 18.0
    );
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_labels() {
        assert_eq!(si(1_234_567.0), "1.23M");
        assert_eq!(si(93_423.0), "93.4k");
        assert_eq!(si(2_345.0), "2.35k");
        assert_eq!(si(950.0), "950");
        assert_eq!(small(0.3125), "0.31");
        assert_eq!(small(0.0629), "0.063");
        assert_eq!(small(4.0), "4.00");
        assert_eq!(count(1_000_000_000), "1e9");
        assert_eq!(count(25_000_000), "25e6");
        assert_eq!(count(600), "600");
        assert_eq!(count(100_001), "100001");
        assert_eq!(axis_label(800_000.0, true), "800k");
        assert_eq!(axis_label(1_000_000.0, true), "1M");
        assert_eq!(axis_label(2.5, false), "2.5");
        assert_eq!(fewer(0.3125, 4.0), "12.8x fewer");
        assert_eq!(fewer(5.0, 4.0), "1.25x more");
    }
}
