//! A self-contained SVG chart: admitted requests per second for each
//! strategy against the limit line, one panel per busy key.

use std::fmt::Write as _;

use crate::sim::{Report, Strategy};

const W: f64 = 960.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 24.0;
const PANEL_H: f64 = 210.0;
const PANEL_GAP: f64 = 84.0;
const TOP: f64 = 100.0;

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The smallest of 1, 2, 2.5, 5 x 10^k that is at least `x`.
pub(crate) fn nice(x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= x * 0.999_999 {
            return m * p;
        }
    }
    10.0 * p
}

fn num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.1}")
    }
}

/// Per-second rates of one series of bin counts.
fn rates(bins: &[u64], bin_ms: u64, duration_ms: u64) -> Vec<(f64, f64)> {
    bins.iter()
        .enumerate()
        .map(|(i, c)| {
            let start = i as u64 * bin_ms;
            let width = bin_ms.min(duration_ms.saturating_sub(start)).max(1);
            (
                (start as f64 + width as f64 / 2.0) / 1000.0,
                *c as f64 * 1000.0 / width as f64,
            )
        })
        .collect()
}

/// The chart for `r`, as an SVG document.
pub fn svg(r: &Report) -> String {
    let sc = &r.scenario;
    let shape = &sc.shape;
    let dur_s = shape.duration_ms as f64 / 1000.0;
    let limit_rate = shape.limit as f64 * 1000.0 / shape.window_ms as f64;
    // Panels: every key whose demand reaches a fifth of its limit.
    let panels: Vec<usize> = (0..sc.keys.len()).filter(|k| sc.keys[*k].base >= 0.2).collect();
    let h = TOP + panels.len() as f64 * (PANEL_H + PANEL_GAP) + 20.0;
    let pw = W - LEFT - RIGHT;
    let x_of = |s: f64| LEFT + s / dur_s.max(1e-9) * pw;

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(o, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let title = format!(
        "Admitted requests per second: {} instances, {} per {} s per key",
        shape.instances,
        shape.limit,
        num(shape.window_ms as f64 / 1000.0)
    );
    let _ = writeln!(
        o,
        r##"<text x="{LEFT}" y="30" font-size="19" font-weight="bold" fill="#222">{}</text>"##,
        esc(&title)
    );
    let sub = match &r.redis {
        None => format!(
            "quotalease simulate: {} s in virtual time, seed {}, lease {} tokens, load balancer skew {}",
            num(dur_s),
            shape.seed,
            r.lease_size,
            shape.skew
        ),
        Some(_) => format!(
            "quotalease simulate --redis: {} s in real time, seed {}, lease {} tokens, load balancer skew {}",
            num(dur_s),
            shape.seed,
            r.lease_size,
            shape.skew
        ),
    };
    let _ = writeln!(
        o,
        r##"<text x="{LEFT}" y="52" font-size="13" fill="#555">{}</text>"##,
        esc(&sub)
    );

    // Legend.
    let mut lx = LEFT;
    let ly = 80.0;
    let _ = writeln!(
        o,
        r##"<rect x="{lx}" y="{}" width="22" height="10" fill="#dddddd"/><text x="{}" y="{}" font-size="13" fill="#333">demand</text>"##,
        ly - 5.0,
        lx + 28.0,
        ly + 4.0
    );
    lx += 90.0;
    let _ = writeln!(
        o,
        r##"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="#000" stroke-width="1.5" stroke-dasharray="6 4"/><text x="{}" y="{}" font-size="13" fill="#333">limit</text>"##,
        lx + 22.0,
        lx + 28.0,
        ly + 4.0
    );
    lx += 70.0;
    for res in &r.results {
        let s = res.strategy;
        let name = match s {
            Strategy::StaticShare => format!("static share (1/{})", shape.instances),
            _ => s.name().to_string(),
        };
        let dash = if s == Strategy::Exact {
            r#" stroke-dasharray="5 3""#
        } else {
            ""
        };
        let _ = writeln!(
            o,
            r##"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="3"{dash}/><text x="{}" y="{}" font-size="13" fill="#333">{}</text>"##,
            lx + 22.0,
            s.colour(),
            lx + 28.0,
            ly + 4.0,
            esc(&name)
        );
        lx += 40.0 + name.chars().count() as f64 * 7.0;
    }

    for (pi, &k) in panels.iter().enumerate() {
        let top = TOP + pi as f64 * (PANEL_H + PANEL_GAP) + 48.0;
        let bottom = top + PANEL_H;
        let demand = rates(&r.demand_bins[k], r.bin_ms, shape.duration_ms);
        let series: Vec<(Strategy, Vec<(f64, f64)>)> = r
            .results
            .iter()
            .map(|res| (res.strategy, rates(&res.bins[k], r.bin_ms, shape.duration_ms)))
            .collect();
        // The scale follows what was admitted (demand may be far above it).
        let top_val = series
            .iter()
            .flat_map(|(_, v)| v.iter().map(|p| p.1))
            .fold(limit_rate, f64::max);
        let y_step = nice(top_val * 1.1 / 5.0);
        let y_max = (top_val * 1.1 / y_step).ceil() * y_step;
        let y_of = |v: f64| bottom - (v.min(y_max) / y_max) * PANEL_H;

        let spec = &sc.keys[k];
        let _ = writeln!(
            o,
            r##"<text x="{LEFT}" y="{}" font-size="15" font-weight="bold" fill="#222">key "{}" <tspan font-weight="normal" fill="#555">{}</tspan></text>"##,
            top - 27.0,
            esc(spec.name),
            esc(spec.about)
        );
        let mut caption = format!(
            r##"<text x="{LEFT}" y="{}" font-size="12" fill="#555">admitted vs allowance (one exact global bucket):"##,
            top - 8.0
        );
        for res in &r.results {
            let short = match res.strategy {
                Strategy::PerInstance => "per-instance",
                Strategy::StaticShare => "static",
                Strategy::Exact => "exact",
                Strategy::Leased => "fixed",
                Strategy::Adaptive => "adaptive",
            };
            let _ = write!(
                caption,
                r##" <tspan fill="{}" font-weight="bold">{short} {:.2}x</tspan>"##,
                res.strategy.colour(),
                res.keys[k].admitted as f64 / r.allowance[k].max(1) as f64
            );
        }
        caption.push_str("</text>");
        let _ = writeln!(o, "{caption}");
        let _ = writeln!(
            o,
            r##"<rect x="{LEFT}" y="{top}" width="{pw}" height="{PANEL_H}" fill="#fafafa" stroke="#cccccc"/>"##
        );
        // Grid and y labels.
        let mut v = 0.0;
        while v <= y_max + 1e-9 {
            let y = y_of(v);
            let _ = writeln!(
                o,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#e6e6e6"/><text x="{}" y="{:.1}" font-size="11" fill="#666" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                num(v)
            );
            v += y_step;
        }
        let _ = writeln!(
            o,
            r##"<text x="16" y="{:.1}" font-size="11" fill="#666" transform="rotate(-90 16 {:.1})" text-anchor="middle">admitted / s</text>"##,
            (top + bottom) / 2.0,
            (top + bottom) / 2.0
        );
        // X ticks.
        let x_step = nice(dur_s / 6.0);
        let mut t = 0.0;
        while t <= dur_s + 1e-9 {
            let x = x_of(t);
            let _ = writeln!(
                o,
                r##"<line x1="{x:.1}" y1="{bottom}" x2="{x:.1}" y2="{}" stroke="#999"/><text x="{x:.1}" y="{}" font-size="11" fill="#666" text-anchor="middle">{} s</text>"##,
                bottom + 4.0,
                bottom + 16.0,
                num(t)
            );
            t += x_step;
        }
        // Fleet phases: a label where it fits before the next change.
        for (i, p) in sc.phases.iter().enumerate() {
            let x = x_of(p.start as f64 / 1000.0);
            if p.start > 0 {
                let _ = writeln!(
                    o,
                    r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{bottom}" stroke="#aaaaaa" stroke-dasharray="2 3"/>"##
                );
            }
            let room = sc
                .phases
                .get(i + 1)
                .map_or(LEFT + pw, |n| x_of(n.start as f64 / 1000.0))
                - x
                - 8.0;
            let long = if p.idle > 0 {
                format!("{} running, {} idle", p.running, p.idle)
            } else {
                format!("{} running", p.running)
            };
            let short = if p.idle > 0 {
                format!("{}, {} idle", p.running, p.idle)
            } else {
                p.running.to_string()
            };
            let Some(text) = [long, short]
                .into_iter()
                .find(|t| t.chars().count() as f64 * 6.2 <= room)
            else {
                continue;
            };
            let _ = writeln!(
                o,
                r##"<text x="{:.1}" y="{}" font-size="11" fill="#777">{}</text>"##,
                x + 4.0,
                top + 13.0,
                esc(&text)
            );
        }
        // Demand as an area.
        let first = demand.first().map_or(0.0, |p| p.1);
        let last = demand.last().map_or(0.0, |p| p.1);
        let mut area = format!("{LEFT:.1},{bottom:.1} {LEFT:.1},{:.1} ", y_of(first));
        for (s, v) in &demand {
            let _ = write!(area, "{:.1},{:.1} ", x_of(*s), y_of(*v));
        }
        let _ = write!(area, "{:.1},{:.1} {:.1},{bottom:.1}", LEFT + pw, y_of(last), LEFT + pw);
        let _ = writeln!(o, r##"<polygon points="{area}" fill="#dddddd" opacity="0.8"/>"##);
        // Limit line.
        let ly = y_of(limit_rate);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{ly:.1}" x2="{}" y2="{ly:.1}" stroke="#000" stroke-width="1.5" stroke-dasharray="6 4"/><text x="{}" y="{:.1}" font-size="11" fill="#000" text-anchor="end">limit {}/s</text>"##,
            LEFT + pw,
            LEFT + pw - 4.0,
            ly - 5.0,
            num(limit_rate)
        );
        // Strategies: leased drawn last but one so that exact's dashes stay visible on it.
        let order = [
            Strategy::PerInstance,
            Strategy::StaticShare,
            Strategy::Leased,
            Strategy::Adaptive,
            Strategy::Exact,
        ];
        for s in order {
            let Some((_, pts)) = series.iter().find(|(x, _)| *x == s) else {
                continue;
            };
            let line: Vec<String> = pts
                .iter()
                .map(|(t, v)| format!("{:.1},{:.1}", x_of(*t), y_of(*v)))
                .collect();
            let (width, dash) = match s {
                Strategy::Leased | Strategy::Adaptive => ("3.5", ""),
                Strategy::Exact => ("1.8", r#" stroke-dasharray="5 3""#),
                _ => ("2.2", ""),
            };
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="{width}" stroke-linejoin="round"{dash}/>"#,
                line.join(" "),
                s.colour()
            );
        }
    }
    let _ = writeln!(
        o,
        r##"<text x="{}" y="{:.1}" font-size="12" fill="#555" text-anchor="middle">time (s) · one point per {} s</text>"##,
        LEFT + pw / 2.0,
        h - 12.0,
        num(r.bin_ms as f64 / 1000.0)
    );
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice(0.7), 1.0);
        assert_eq!(nice(1.2), 2.0);
        assert_eq!(nice(2.2), 2.5);
        assert_eq!(nice(3.0), 5.0);
        assert_eq!(nice(47.0), 50.0);
        assert_eq!(nice(60.0), 100.0);
        assert_eq!(esc("a<b & c>"), "a&lt;b &amp; c&gt;");
    }

    #[test]
    fn rates_per_second() {
        assert_eq!(rates(&[10, 4], 5000, 7000), vec![(2.5, 2.0), (6.0, 2.0)]);
    }
}
