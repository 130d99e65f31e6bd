#!/usr/bin/env python3
"""Fail when the top-level modules of core/src import each other in a circle.

    python3 scripts/check-cycles.py            exit 1 on a circle not in KNOWN
                                               (or a KNOWN one that is gone)
    python3 scripts/check-cycles.py --strict   exit 1 on any circle, KNOWN too
    python3 scripts/check-cycles.py --graph    also print every module's imports

A module is the first path segment under core/src (`engine/cold.rs` belongs to
`engine`, `config.rs` is `config`); lib.rs is the crate root and not a module.
An edge A -> B is a `crate::B` path in A's code (`use crate::{b::X, c}` counts
both), or `crate::Name` where lib.rs re-exports Name from B (`crate::Error` is
`error`). Comments (doc links included), string literals and `#[cfg(test)] mod`
blocks do not count: a circle is what the compiled library's modules need of
each other. Standard library only.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "core" / "src"

# Circles still to break, each with what breaking it takes. `make lint` passes
# with them and fails on any other; remove an entry once its circle is gone
# (the script says so).
KNOWN: dict[frozenset[str], str] = {}


def strip_code(text: str) -> str:
    """The text with comments and string/char literals blanked (newlines kept,
    so line numbers still hold)."""
    out: list[str] = []
    i, n = 0, len(text)

    def blank(s: str) -> str:
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", text[i:])):
            # a char literal (a lifetime such as 'a has no closing quote)
            out.append(blank(m.group(0)))
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_mods(code: str) -> str:
    """Blank every `#[cfg(test)] mod name { ... }` block."""
    pat = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
    while m := pat.search(code):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        code = code[: m.start()] + "".join("\n" if c == "\n" else " " for c in code[m.start() : j]) + code[j:]
    return code


def group_heads(code: str, start: int) -> list[str]:
    """The first segment of each top-level item of the `{...}` group at start."""
    depth, j, item, heads = 0, start, "", []
    while j < len(code):
        c = code[j]
        if c == "{":
            depth += 1
            if depth == 1:
                j += 1
                continue
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        if depth == 1 and c == ",":
            heads.append(item)
            item = ""
        elif depth >= 1:
            item += c
        j += 1
    heads.append(item)
    out = []
    for h in heads:
        m = re.match(r"\s*(\w+)", h)
        if m:
            out.append(m.group(1))
    return out


def root_reexports(lib: str) -> dict[str, str]:
    """Names lib.rs re-exports, each to the module it comes from."""
    names: dict[str, str] = {}
    for m in re.finditer(r"\bpub\s+use\s+(\w+)::", lib):
        module = m.group(1)
        rest = lib[m.end() :]
        if rest.startswith("{"):
            body = rest[1 : rest.index("}")]
            idents = re.findall(r"(\w+)\s*(?:,|$|as\s+(\w+))", body)
            for ident, alias in idents:
                names[alias or ident] = module
        else:
            path = re.match(r"[\w:]+(?:\s+as\s+\w+)?", rest).group(0)
            last = path.split(" as ")[-1].split("::")[-1].strip()
            names[last] = module
    return names


def main() -> int:
    show_graph = "--graph" in sys.argv[1:]
    strict = "--strict" in sys.argv[1:]
    files = sorted(SRC.rglob("*.rs"))
    modules = {p.relative_to(SRC).parts[0].removesuffix(".rs") for p in files} - {"lib"}
    lib = strip_code((SRC / "lib.rs").read_text())
    reexports = root_reexports(lib)
    # edges[a][b] = ["file:line", ...]
    edges: dict[str, dict[str, list[str]]] = {m: {} for m in modules}
    for p in files:
        rel = p.relative_to(SRC)
        module = rel.parts[0].removesuffix(".rs")
        if module == "lib":
            continue
        code = drop_test_mods(strip_code(p.read_text()))
        for m in re.finditer(r"(?<![\w$])\$?crate\s*::\s*", code):
            line = code.count("\n", 0, m.start()) + 1
            if code.startswith("{", m.end()):
                heads = group_heads(code, m.end())
            else:
                head = re.match(r"\w+", code[m.end() :])
                heads = [head.group(0)] if head else []
            for head in heads:
                target = head if head in modules else reexports.get(head)
                if target and target != module:
                    edges[module].setdefault(target, []).append(f"core/src/{rel}:{line}")

    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            sccs.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(modules):
        if v not in index:
            visit(v)

    if show_graph:
        for v in sorted(modules):
            print(f"{v} -> {', '.join(sorted(edges[v])) or '(nothing)'}")
        print()

    circles = sorted(c for c in sccs if len(c) > 1)
    known = [c for c in circles if frozenset(c) in KNOWN and not strict]
    new = [c for c in circles if c not in known]
    gone = [k for k in KNOWN if sorted(k) not in circles]
    if not circles:
        print(f"check-cycles: no import circle among the {len(modules)} top-level modules of core/src")
    for label, group in (("import circle", new), ("known import circle", known)):
        if group:
            print(f"check-cycles: {len(group)} {label}(s) among the top-level modules of core/src:")
        for comp in group:
            print(f"  {{{', '.join(comp)}}}")
            if label.startswith("known"):
                print(f"    ({KNOWN[frozenset(comp)]})")
            for a in comp:
                for b in comp:
                    if b in edges[a]:
                        where = edges[a][b]
                        more = f" (+{len(where) - 1} more)" if len(where) > 1 else ""
                        print(f"    {a} -> {b}: {where[0]}{more}")
    for k in gone:
        print(f"check-cycles: the known circle {{{', '.join(sorted(k))}}} is gone: remove it from KNOWN")
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main())
