#!/usr/bin/env python3
"""Print the public API surface of the Python or the Node package, normalised
so that only an API change changes it (scripts/check-api.sh compares it with
the committed snapshot under tests/api/).

    scripts/api-surface.py python   every module of bindings/python/python/quotalease
                                    (.py and .pyi): re-exports, public classes,
                                    functions with their signatures, annotated
                                    names; bodies, docstrings, comments and
                                    private (_name) members dropped
    scripts/api-surface.py node     every public .d.ts of bindings/node (all but
                                    the generated binding.d.ts) without comments
                                    and blank lines

Standard library only (no mypy, no TypeScript needed).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY_PKG = ROOT / "bindings/python/python/quotalease"
NODE_PKG = ROOT / "bindings/node"


def public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def stub_body(node: ast.AST) -> ast.AST:
    """The node with its body replaced by `...` (functions) or its public members (classes)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node.body = [ast.Expr(ast.Constant(...))]
        return node
    if isinstance(node, ast.ClassDef):
        body = [m for m in (member(n, in_class=True) for n in node.body) if m is not None]
        node.body = body or [ast.Expr(ast.Constant(...))]
        return node
    return node


def member(node: ast.stmt, in_class: bool) -> ast.stmt | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stub_body(node) if public(node.name) else None
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        if not public(node.target.id):
            return None
        node.value = None if node.value is None else ast.Constant(...)
        return node
    if isinstance(node, ast.Assign):
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if not names or not all(public(n) for n in names) or names == ["__slots__"]:
            return None
        if names == ["__all__"]:
            return node
        node.value = ast.Constant(...)
        return node
    if not in_class and isinstance(node, ast.ImportFrom) and node.level > 0:
        return node  # re-exports from the package's own modules
    if isinstance(node, ast.If) and not in_class:
        # `if TYPE_CHECKING:` / version gates: keep what they define.
        kept = [m for m in (member(n, in_class) for n in node.body) if m is not None]
        if kept:
            node.body = kept
            node.orelse = [m for m in (member(n, in_class) for n in node.orelse) if m is not None]
            return node
    return None


def python_surface() -> str:
    out = []
    files = sorted(p for p in PY_PKG.iterdir() if p.suffix in (".py", ".pyi"))
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        kept = [m for m in (member(n, in_class=False) for n in tree.body) if m is not None]
        out.append(f"# ==== quotalease/{path.name}")
        out.append(ast.unparse(ast.Module(body=kept, type_ignores=[])) if kept else "# (nothing public)")
    return "\n".join(out) + "\n"


def strip_ts_comments(src: str) -> str:
    """Remove // and /* */ comments, leaving string and template literals alone."""
    out = []
    i, n = 0, len(src)
    quote = None
    while i < n:
        c = src[i]
        if quote:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(src[i + 1])
                i += 2
                continue
            if c == quote:
                quote = None
            i += 1
            continue
        if c in "'\"`":
            quote = c
            out.append(c)
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def node_surface() -> str:
    out = []
    for path in sorted(NODE_PKG.glob("*.d.ts")):
        if path.name == "binding.d.ts":
            continue
        lines = [line.rstrip() for line in strip_ts_comments(path.read_text()).splitlines()]
        out.append(f"// ==== {path.name}")
        out.extend(line for line in lines if line.strip())
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[1] == "python":
        sys.stdout.write(python_surface())
        return 0
    if len(argv) == 2 and argv[1] == "node":
        sys.stdout.write(node_surface())
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
