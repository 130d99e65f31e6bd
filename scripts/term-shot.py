#!/usr/bin/env python3
"""Render a terminal capture (plain text) as an SVG terminal window and, with
rsvg-convert (Debian's librsvg2-bin), a PNG: `scripts/term-shot.py IN.txt OUT.svg [OUT.png]`.
Used for docs/top.png from the frame in docs/top.txt."""
import html
import subprocess
import sys

lines = open(sys.argv[1]).read().rstrip("\n").split("\n")
cw, lh, pad, bar = 8.4, 18, 16, 28
width = int(max(len(l) for l in lines) * cw + 2 * pad)
height = int(len(lines) * lh + 2 * pad + bar)
out = [
    f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
    f'<rect width="{width}" height="{height}" rx="8" fill="#1b1d23"/>',
    f'<rect width="{width}" height="{bar}" rx="8" fill="#2c2f36"/>',
]
for i, c in enumerate(["#ff5f56", "#ffbd2e", "#27c93f"]):
    out.append(f'<circle cx="{18 + i * 20}" cy="{bar / 2}" r="6" fill="{c}"/>')
for i, line in enumerate(lines):
    y = bar + pad + (i + 1) * lh - 4
    color = "#8fd3ff" if i == 0 else ("#ffd479" if line.startswith("KEY") else "#e6e6e6")
    out.append(
        f'<text x="{pad}" y="{y}" fill="{color}" font-family="DejaVu Sans Mono, monospace" '
        f'font-size="14" xml:space="preserve">{html.escape(line)}</text>'
    )
out.append("</svg>")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
if len(sys.argv) > 3:
    subprocess.run(["rsvg-convert", "-o", sys.argv[3], sys.argv[2]], check=True)
