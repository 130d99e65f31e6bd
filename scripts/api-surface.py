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
    scripts/api-surface.py rust     the quotalease crate's public items from
                                    rustdoc's JSON (RUSTC_BOOTSTRAP=1, the
                                    toolchain's own format): paths, signatures,
                                    public fields, variants, inherent methods
                                    and the traits implemented by hand; items
                                    hidden from the docs (`internals`) left out

Standard library only (no mypy, no TypeScript, no nightly toolchain needed).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
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


def rustdoc_json() -> dict:
    """Build the engine crate's rustdoc JSON and load it."""
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    cargo = os.environ.get("CARGO", "cargo")
    subprocess.run(
        [cargo, "rustdoc", "-q", "-p", "quotalease", "--lib", "--features", "test-util", "--", "-Z", "unstable-options", "--output-format", "json"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    meta = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT, check=True, capture_output=True, text=True
    )
    target = Path(json.loads(meta.stdout)["target_directory"])
    return json.loads((target / "doc" / "quotalease.json").read_text())


class RustSurface:
    """Renders rustdoc JSON items as one line per item, Rust-like."""

    def __init__(self, doc: dict) -> None:
        self.idx = doc["index"]
        self.root = doc["root"]
        self.out: list[str] = []

    def item(self, i: int) -> dict:
        return self.idx[str(i)]

    def ty(self, t: dict | None) -> str:
        if t is None:
            return "()"
        (k, v), = t.items()
        if k == "resolved_path":
            return self.path(v)
        if k == "primitive" or k == "generic":
            return v
        if k == "borrowed_ref":
            life = f"{v['lifetime']} " if v["lifetime"] else ""
            return f"&{life}{'mut ' if v['is_mutable'] else ''}{self.ty(v['type'])}"
        if k == "raw_pointer":
            return f"*{'mut' if v['is_mutable'] else 'const'} {self.ty(v['type'])}"
        if k == "tuple":
            return "(" + ", ".join(self.ty(x) for x in v) + ")"
        if k == "slice":
            return f"[{self.ty(v)}]"
        if k == "array":
            return f"[{self.ty(v['type'])}; {v['len']}]"
        if k == "impl_trait":
            return "impl " + " + ".join(self.bound(b) for b in v)
        if k == "dyn_trait":
            return "dyn " + " + ".join(self.path(p["trait"]) for p in v["traits"])
        if k == "qualified_path":
            return f"<{self.ty(v['self_type'])}>::{v['name']}"
        if k == "function_pointer":
            sig = v["sig"]
            return f"fn({', '.join(self.ty(a) for _, a in sig['inputs'])}) -> {self.ty(sig['output'])}"
        return k

    def path(self, p: dict) -> str:
        # as the source spells it; the crate's own items by their name alone
        name = p["path"]
        if name.startswith("crate::"):
            name = name.rsplit("::", 1)[-1]
        args = p.get("args")
        if not args:
            return name
        if "angle_bracketed" in args:
            parts = []
            for a in args["angle_bracketed"]["args"]:
                (ak, av), = a.items()
                parts.append(self.ty(av) if ak == "type" else str(av) if ak == "lifetime" else ak)
            for c in args["angle_bracketed"].get("constraints", []):
                binding = c.get("binding", {})
                if "equality" in binding:
                    parts.append(f"{c['name']} = {self.ty(binding['equality'].get('type'))}")
                else:
                    parts.append(f"{c['name']}: " + " + ".join(self.bound(b) for b in binding.get("constraint", [])))
            return f"{name}<{', '.join(parts)}>" if parts else name
        if "parenthesized" in args:
            a = args["parenthesized"]
            return f"{name}({', '.join(self.ty(x) for x in a['inputs'])}) -> {self.ty(a['output'])}"
        return name

    def bound(self, b: dict) -> str:
        if "trait_bound" in b:
            return self.path(b["trait_bound"]["trait"])
        if "outlives" in b:
            return b["outlives"]
        return "?"

    def generics(self, g: dict) -> str:
        parts = []
        for p in g["params"]:
            kind = p["kind"]
            if "lifetime" in kind:
                parts.append(p["name"])
            elif "type" in kind:
                if kind["type"].get("is_synthetic"):
                    continue
                bounds = kind["type"]["bounds"]
                parts.append(p["name"] + (": " + " + ".join(self.bound(b) for b in bounds) if bounds else ""))
            elif "const" in kind:
                parts.append(f"const {p['name']}: {self.ty(kind['const']['type'])}")
        return f"<{', '.join(parts)}>" if parts else ""

    def fn(self, name: str, f: dict) -> str:
        h = f["header"]
        quals = ("const " if h["is_const"] else "") + ("async " if h["is_async"] else "") + ("unsafe " if h["is_unsafe"] else "")
        args = []
        for arg, t in f["sig"]["inputs"]:
            if arg == "self":
                args.append({"&Self": "&self", "&mut Self": "&mut self", "Self": "self"}.get(self.ty(t), f"self: {self.ty(t)}"))
            else:
                args.append(f"{arg}: {self.ty(t)}")
        out = f["sig"]["output"]
        ret = f" -> {self.ty(out)}" if out is not None else ""
        return f"{quals}fn {name}{self.generics(f['generics'])}({', '.join(args)}){ret}"

    def impls(self, prefix: str, ids: list[int]) -> None:
        traits = []
        for i in ids:
            imp = self.item(i)["inner"]["impl"]
            if imp["is_synthetic"] or imp["blanket_impl"] is not None:
                continue
            if imp["trait"] is not None:
                traits.append(self.path(imp["trait"]))
                continue
            for m in imp["items"]:
                it = self.item(m)
                if it["visibility"] != "public":
                    continue
                (k, v), = it["inner"].items()
                if k == "function":
                    self.out.append(f"{prefix}::{self.fn(it['name'], v)}")
                elif k == "assoc_const":
                    self.out.append(f"{prefix}::const {it['name']}: {self.ty(v['type'])}")
        for t in sorted(traits):
            self.out.append(f"impl {t} for {prefix}")

    def render(self, path: str, i: int, name: str | None = None) -> None:
        it = self.item(i)
        name = name or it["name"]
        full = f"{path}::{name}" if path else name
        (k, v), = it["inner"].items()
        if k == "module":
            for c in v["items"]:
                self.render(full, c)
        elif k == "use":
            if v["id"] is not None and str(v["id"]) in self.idx:
                if v["is_glob"]:
                    for c in self.item(v["id"])["inner"]["module"]["items"]:
                        self.render(path, c)
                else:
                    self.render(path, v["id"], v["name"])
            else:
                self.out.append(f"pub use {v['source']} as {path}::{v['name']}")
        elif k == "function":
            self.out.append(f"pub {self.fn(full, v)}")
        elif k == "constant":
            self.out.append(f"pub const {full}: {self.ty(v['type'])}")
        elif k == "static":
            self.out.append(f"pub static {full}: {self.ty(v['type'])}")
        elif k == "type_alias":
            self.out.append(f"pub type {full}{self.generics(v['generics'])} = {self.ty(v['type'])}")
        elif k == "struct":
            kind = v["kind"]
            self.out.append(f"pub struct {full}{self.generics(v['generics'])}")
            fields = kind.get("plain", {}).get("fields", []) if isinstance(kind, dict) else []
            if isinstance(kind, dict) and "tuple" in kind:
                fields = [f for f in kind["tuple"] if f is not None]
            for f in fields:
                fi = self.item(f)
                if fi["visibility"] == "public":
                    self.out.append(f"{full}.{fi['name']}: {self.ty(fi['inner']['struct_field'])}")
            self.impls(full, v["impls"])
        elif k == "enum":
            self.out.append(f"pub enum {full}{self.generics(v['generics'])}")
            for var in v["variants"]:
                vi = self.item(var)
                vk = vi["inner"]["variant"]["kind"]
                if isinstance(vk, dict) and "tuple" in vk:
                    tys = ", ".join(self.ty(self.item(f)["inner"]["struct_field"]) for f in vk["tuple"] if f is not None)
                    self.out.append(f"{full}::{vi['name']}({tys})")
                elif isinstance(vk, dict) and "struct" in vk:
                    fs = ", ".join(
                        f"{self.item(f)['name']}: {self.ty(self.item(f)['inner']['struct_field'])}" for f in vk["struct"]["fields"]
                    )
                    self.out.append(f"{full}::{vi['name']} {{ {fs} }}")
                else:
                    self.out.append(f"{full}::{vi['name']}")
            self.impls(full, v["impls"])
        elif k == "trait":
            self.out.append(f"pub trait {full}{self.generics(v['generics'])}")
            for m in v["items"]:
                mi = self.item(m)
                (mk, mv), = mi["inner"].items()
                if mk == "function":
                    self.out.append(f"{full}::{self.fn(mi['name'], mv)}")
        elif k == "macro":
            self.out.append(f"macro {name}!")
        else:
            self.out.append(f"{k} {full}")


def rust_surface() -> str:
    surface = RustSurface(rustdoc_json())
    surface.render("", surface.root)
    return "\n".join(surface.out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[1] == "python":
        sys.stdout.write(python_surface())
        return 0
    if len(argv) == 2 and argv[1] == "node":
        sys.stdout.write(node_surface())
        return 0
    if len(argv) == 2 and argv[1] == "rust":
        sys.stdout.write(rust_surface())
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
