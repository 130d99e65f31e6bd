#!/usr/bin/env python3
"""Render a peer-benchmark result file as an SVG bar chart (stdlib only).

Usage: peers-chart.py IN.json OUT.svg

IN.json is what bindings/python/bench/bench_peers.py and
bindings/node/bench/peers.js write:

    {"language": "Python", "command": "...", "date": "YYYY-MM-DD",
     "threads": 4, "duration_s": 5.0,
     "runs": [{"dist": "hot", "contestant": "...", "kind": "lease",
               "admitted_per_s": 1.0, "commands_per_admitted": 0.3,
               "overshoot_bound": 20, ...}, ...]}

Two panels, each grouped by key distribution: admitted requests per second
and Redis commands per admitted request, both on a log scale (the
contestants differ by orders of magnitude).
"""

from __future__ import annotations

import json
import math
import sys
from html import escape
from pathlib import Path

PALETTE = ["#2ca02c", "#1f77b4", "#9467bd", "#ff7f0e", "#d62728", "#8c564b"]
WIDTH, PANEL_W, PANEL_H = 1000, 400, 300
LEFT, TOP_PANEL = 80, 150


def fmt(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:.3g}M"
    if v >= 1e3:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def log_range(values: list[float]) -> tuple[int, int]:
    positive = [v for v in values if v > 0]
    if not positive:
        return 0, 1
    lo = math.floor(math.log10(min(positive)))
    hi = math.ceil(math.log10(max(positive)))
    return lo, max(hi, lo + 1)


def panel(
    out: list[str],
    x0: float,
    title: str,
    field: str,
    dists: list[str],
    names: list[str],
    runs: dict[tuple[str, str], dict],
) -> None:
    y_bottom = TOP_PANEL + 20 + PANEL_H
    values = [float(r[field]) for r in runs.values()]
    lo, hi = log_range(values)

    def y_of(v: float) -> float:
        if v <= 0:
            return y_bottom
        frac = (math.log10(v) - lo) / (hi - lo)
        return y_bottom - frac * PANEL_H

    out.append(
        f'<text x="{x0}" y="{TOP_PANEL}" font-size="15" font-weight="bold" '
        f'fill="#222">{escape(title)}</text>'
    )
    for e in range(lo, hi + 1):
        y = y_of(10.0**e)
        out.append(
            f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PANEL_W}" y2="{y:.1f}" stroke="#e6e6e6"/>'
            f'<text x="{x0 - 6}" y="{y + 4:.1f}" font-size="11" fill="#666" '
            f'text-anchor="end">{fmt(10.0**e)}</text>'
        )
    group_w = PANEL_W / len(dists)
    bar_w = min(48.0, (group_w - 30) / max(1, len(names)))
    for gi, dist in enumerate(dists):
        gx = x0 + gi * group_w + (group_w - bar_w * len(names)) / 2
        for ni, name in enumerate(names):
            run = runs.get((dist, name))
            if run is None:
                continue
            v = float(run[field])
            bx, by = gx + ni * bar_w, y_of(v)
            out.append(
                f'<rect x="{bx + 2:.1f}" y="{by:.1f}" width="{bar_w - 4:.1f}" '
                f'height="{max(0.0, y_bottom - by):.1f}" fill="{PALETTE[ni % len(PALETTE)]}"/>'
                f'<text x="{bx + bar_w / 2:.1f}" y="{by - 4:.1f}" font-size="10" '
                f'fill="#333" text-anchor="middle">{fmt(v)}</text>'
            )
        out.append(
            f'<text x="{x0 + gi * group_w + group_w / 2:.1f}" y="{y_bottom + 18}" '
            f'font-size="13" fill="#333" text-anchor="middle">{escape(dist)}</text>'
        )
    out.append(
        f'<line x1="{x0}" y1="{y_bottom}" x2="{x0 + PANEL_W}" y2="{y_bottom}" stroke="#999"/>'
    )


def render(data: dict) -> str:
    runs_list = data["runs"]
    if not runs_list:
        raise ValueError("no runs in the result file")
    dists = list(dict.fromkeys(r["dist"] for r in runs_list))
    names = list(dict.fromkeys(r["contestant"] for r in runs_list))
    runs = {(r["dist"], r["contestant"]): r for r in runs_list}
    height = TOP_PANEL + PANEL_H + 70
    lang = data.get("language", "?")
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif">'
        ),
        '<rect width="100%" height="100%" fill="#ffffff"/>',
        (
            f'<text x="{LEFT}" y="30" font-size="19" font-weight="bold" fill="#222">'
            f"quotalease vs per-request Redis limiting from {escape(lang)}, one Redis, same load</text>"
        ),
        (
            f'<text x="{LEFT}" y="52" font-size="13" fill="#555">'
            f"{escape(str(data.get('threads', '?')))} concurrent callers x "
            f"{escape(str(data.get('duration_s', '?')))} s per contestant, limit never binds; "
            f"{escape(str(data.get('date', '')))}; log scales</text>"
        ),
    ]
    bound_of = {r["contestant"]: r.get("overshoot_bound", "?") for r in runs_list}
    kind_of = {r["contestant"]: r.get("kind", "") for r in runs_list}
    per_request = [n for n in names if kind_of[n] == "per-request"]
    shown = [n for n in names if n not in per_request or bound_of[n] != 0]
    bounds = ", ".join(f"{name}: {bound_of[name]}" for name in shown)
    if any(bound_of[n] == 0 for n in per_request):
        bounds += ("; " if bounds else "") + "per-request designs: 0"
    out.append(
        f'<text x="{LEFT}" y="70" font-size="12" fill="#555">overshoot bound (tokens) - '
        f"{escape(bounds)}</text>"
    )
    x, y = LEFT, 88
    for ni, name in enumerate(names):
        label_w = 36 + 7.6 * len(name)
        if x + label_w > WIDTH - 20:
            x, y = LEFT, y + 20
        out.append(
            f'<rect x="{x}" y="{y}" width="14" height="14" fill="{PALETTE[ni % len(PALETTE)]}"/>'
            f'<text x="{x + 20}" y="{y + 12}" font-size="13" fill="#333">{escape(name)}</text>'
        )
        x += label_w
    panel(
        out,
        LEFT,
        "admitted requests / s (higher is better)",
        "admitted_per_s",
        dists,
        names,
        runs,
    )
    panel(
        out,
        LEFT + PANEL_W + 80,
        "Redis commands / admitted (lower is better)",
        "commands_per_admitted",
        dists,
        names,
        runs,
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: peers-chart.py IN.json OUT.svg", file=sys.stderr)
        return 2
    try:
        data = json.loads(Path(argv[1]).read_text())
        svg = render(data)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"peers-chart: cannot chart {argv[1]}: {e}", file=sys.stderr)
        return 1
    Path(argv[2]).write_text(svg)
    print(f"peers-chart: wrote {argv[2]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
