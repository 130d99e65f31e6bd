#!/usr/bin/env python3
"""One version for every artifact: list, check and bump it.

    scripts/versions.py check        every place agrees with [workspace.package] (exit 1 if not)
    scripts/versions.py bump X.Y.Z   rewrite every place (scripts/bump-version.sh wraps this)

The places: [workspace.package] and the `quotalease` entry of
[workspace.dependencies] in Cargo.toml, a literal [package] version in any
member's Cargo.toml, the workspace members in Cargo.lock, ffi/src/version.rs
(the source of lease.h's LEASE_VERSION_* macros), include/lease.h itself,
every quotalease* package.json (the main npm package and bindings/node/npm/*
platform packages), bindings/node/package-lock.json, the versions the napi
loader bindings/node/binding.js expects of its platform packages, and any
static [project] version in a quotalease* pyproject.toml (bindings/python
takes its version from Cargo: `dynamic = ["version"]`), and the version of the
Go module each Go submodule (bindings/go/grpcrl, bindings/go/otelrl) requires:
vX.Y.Z, the tag bindings/go/vX.Y.Z (a `replace` points it at ../ for work in
the repository; users' builds ignore it). Go has no version constant: a Go
module's version is its tag (RELEASING.md).
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?$")
SKIP_DIRS = {"node_modules", "target", ".venv", ".git", "dist", "rust"}


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def files_named(name: str) -> list[Path]:
    out = []
    for p in sorted(ROOT.rglob(name)):
        if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts):
            out.append(p)
    return out


def toml_table_span(text: str, table: str) -> tuple[int, int]:
    m = re.search(rf"(?m)^\[{re.escape(table)}\][ \t]*$", text)
    if not m:
        raise SystemExit(f"error: no [{table}] table")
    nxt = re.search(r"(?m)^\[", text[m.end() :])
    return m.end(), m.end() + nxt.start() if nxt else len(text)


def workspace_members() -> list[Path]:
    root = tomllib.loads((ROOT / "Cargo.toml").read_text())
    return [ROOT / m / "Cargo.toml" for m in root["workspace"]["members"]]


class Places:
    """Every version place: (where, the version found there)."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []

    def collect(self) -> list[tuple[str, str]]:
        cargo = (ROOT / "Cargo.toml").read_text()
        ws = tomllib.loads(cargo)["workspace"]
        self.found.append(("Cargo.toml [workspace.package] version", ws["package"]["version"]))
        dep = ws.get("dependencies", {}).get("quotalease")
        if isinstance(dep, dict) and "version" in dep:
            self.found.append(("Cargo.toml [workspace.dependencies] quotalease", dep["version"]))
        names = []
        for manifest in workspace_members():
            pkg = tomllib.loads(manifest.read_text())["package"]
            names.append(pkg["name"])
            if isinstance(pkg.get("version"), str):
                self.found.append((f"{rel(manifest)} [package] version", pkg["version"]))
        lock = tomllib.loads((ROOT / "Cargo.lock").read_text())
        for p in lock["package"]:
            if p["name"] in names and "source" not in p:
                self.found.append((f"Cargo.lock {p['name']}", p["version"]))
        src = (ROOT / "ffi/src/version.rs").read_text()
        self.found.append(
            ("ffi/src/version.rs LEASE_VERSION_*", macro_version(src, r"pub const LEASE_VERSION_{}: u32 = (\d+);"))
        )
        header = (ROOT / "include/lease.h").read_text()
        self.found.append(("include/lease.h LEASE_VERSION_*", macro_version(header, r"#define LEASE_VERSION_{} (\d+)")))
        for pj in files_named("package.json"):
            data = json.loads(pj.read_text())
            if str(data.get("name", "")).startswith("quotalease"):
                self.found.append((f"{rel(pj)} version", data.get("version", "(none)")))
                for dep_name, spec in sorted((data.get("optionalDependencies") or {}).items()):
                    if dep_name.startswith("quotalease"):
                        self.found.append((f"{rel(pj)} optionalDependencies {dep_name}", spec))
        for pl in files_named("package-lock.json"):
            data = json.loads(pl.read_text())
            if str(data.get("name", "")).startswith("quotalease"):
                self.found.append((f"{rel(pl)} version", data.get("version", "(none)")))
                self.found.append((f'{rel(pl)} packages[""] version', data["packages"][""].get("version", "(none)")))
        binding = ROOT / "bindings/node/binding.js"
        for v in sorted(set(re.findall(r"bindingPackageVersion !== '([^']*)'", binding.read_text()))):
            self.found.append((f"{rel(binding)} expected platform package version", v))
        for pp in files_named("pyproject.toml"):
            project = tomllib.loads(pp.read_text()).get("project", {})
            if str(project.get("name", "")).startswith("quotalease"):
                if "version" in project:
                    self.found.append((f"{rel(pp)} [project] version", project["version"]))
                elif "version" not in project.get("dynamic", []):
                    self.found.append((f"{rel(pp)} [project] version", "(neither static nor dynamic)"))
        for gm in go_submodules():
            m = GO_REQUIRE.search(gm.read_text())
            self.found.append((f"{rel(gm)} requires {GO_MODULE}", m.group(2)[1:] if m else "(no require)"))
        return self.found


GO_MODULE = "github.com/quotalease/quotalease/bindings/go"
GO_REQUIRE = re.compile(rf"(?m)^(\s*(?:require\s+)?{re.escape(GO_MODULE)}\s+)(v\S+)")


def go_submodules() -> list[Path]:
    """The go.mod files below bindings/go other than its own."""
    return [p for p in files_named("go.mod") if p.parent.parent == ROOT / "bindings/go"]


def macro_version(text: str, pattern: str) -> str:
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(pattern.format(part), text)
        parts.append(m.group(1) if m else "?")
    return ".".join(parts)


def check() -> int:
    found = Places().collect()
    want = found[0][1]
    bad = [(w, v) for w, v in found if v != want]
    width = max(len(w) for w, _ in found)
    for where, v in found:
        mark = "ok" if v == want else f"MISMATCH (want {want})"
        print(f"  {where:<{width}}  {v}  {mark}")
    if bad:
        print(f"error: {len(bad)} of {len(found)} version places disagree with Cargo.toml's {want}:", file=sys.stderr)
        for where, v in bad:
            print(f"  {where}: {v}", file=sys.stderr)
        print("  fix: scripts/bump-version.sh X.Y.Z rewrites every place", file=sys.stderr)
        return 1
    print(f"versions: {len(found)} places agree on {want}")
    return 0


def sub(path: Path, pattern: str, repl: str, count: int = 0, flags: int = 0, required: bool = True) -> None:
    text = path.read_text()
    new, n = re.subn(pattern, repl, text, count=count, flags=flags)
    if required and n == 0:
        raise SystemExit(f"error: {rel(path)}: pattern {pattern!r} not found")
    path.write_text(new)


def bump(new: str) -> int:
    if not SEMVER.match(new):
        print(f"error: {new!r} is not a semantic version X.Y.Z", file=sys.stderr)
        return 2
    major, minor, patch = SEMVER.match(new).groups()[:3]
    cargo = ROOT / "Cargo.toml"
    text = cargo.read_text()
    a, b = toml_table_span(text, "workspace.package")
    block = re.sub(r'(?m)^version = "[^"]*"', f'version = "{new}"', text[a:b], count=1)
    text = text[:a] + block + text[b:]
    a, b = toml_table_span(text, "workspace.dependencies")
    block = re.sub(r'(?m)^(quotalease = \{[^}\n]*version = ")[^"]*(")', rf"\g<1>{new}\g<2>", text[a:b], count=1)
    cargo.write_text(text[:a] + block + text[b:])
    names = []
    for manifest in workspace_members():
        mt = manifest.read_text()
        names.append(tomllib.loads(mt)["package"]["name"])
        a, b = toml_table_span(mt, "package")
        block = re.sub(r'(?m)^version = "[^"]*"', f'version = "{new}"', mt[a:b], count=1)
        manifest.write_text(mt[:a] + block + mt[b:])
    lock = ROOT / "Cargo.lock"
    lt = lock.read_text()
    for name in names:
        lt = re.sub(
            rf'(\[\[package\]\]\nname = "{re.escape(name)}"\nversion = ")[^"]*("\n(?!source))',
            rf"\g<1>{new}\g<2>",
            lt,
        )
    lock.write_text(lt)
    vr = ROOT / "ffi/src/version.rs"
    for part, value in (("MAJOR", major), ("MINOR", minor), ("PATCH", patch)):
        sub(vr, rf"(pub const LEASE_VERSION_{part}: u32 = )\d+;", rf"\g<1>{value};")
    for pj in files_named("package.json"):
        data = json.loads(pj.read_text())
        if not str(data.get("name", "")).startswith("quotalease"):
            continue
        data["version"] = new
        for dep_name in list((data.get("optionalDependencies") or {}).keys()):
            if dep_name.startswith("quotalease"):
                data["optionalDependencies"][dep_name] = new
        pj.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    for pl in files_named("package-lock.json"):
        data = json.loads(pl.read_text())
        if not str(data.get("name", "")).startswith("quotalease"):
            continue
        data["version"] = new
        data["packages"][""]["version"] = new
        pl.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    binding = ROOT / "bindings/node/binding.js"
    sub(binding, r"(bindingPackageVersion !== ')[^']*(')", rf"\g<1>{new}\g<2>")
    sub(binding, r"(Native binding package version mismatch, expected )\S+( but got)", rf"\g<1>{new}\g<2>")
    for pp in files_named("pyproject.toml"):
        pt = pp.read_text()
        project = tomllib.loads(pt).get("project", {})
        if str(project.get("name", "")).startswith("quotalease") and "version" in project:
            a, b = toml_table_span(pt, "project")
            block = re.sub(r'(?m)^version = "[^"]*"', f'version = "{new}"', pt[a:b], count=1)
            pp.write_text(pt[:a] + block + pt[b:])
    for gm in go_submodules():
        sub(gm, GO_REQUIRE.pattern, rf"\g<1>v{new}", count=1, flags=0)
    print(f"versions: rewritten to {new} (include/lease.h: scripts/check-header.sh --update)")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[1] == "check":
        return check()
    if len(argv) == 3 and argv[1] == "bump":
        return bump(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
