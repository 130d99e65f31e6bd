#!/usr/bin/env bash
# `make dist`: build every release artifact into dist/ (docs/release.md):
#   quotalease-V-cp311-abi3-manylinux_2_17_x86_64.whl   Python, abi3, CPython >= 3.11
#   quotalease-V.tar.gz                                  Python sdist (builds with cargo)
#   quotalease-V.tgz                                     npm main package (JS, types,
#                                                        optionalDependencies, Rust sources)
#   quotalease-linux-x64-gnu-V.tgz                       npm platform package (.node, and the
#                                                        quotalease command for npx)
#   liblease-V-x86_64-linux-gnu.tar.gz                   C/Go: lib/, include/, lease.pc
#   quotalease-go-V.tar.gz                               Go: the sources of bindings/go
#                                                        (for a go.mod `replace`)
#   quotalease-cli-V-x86_64-linux-gnu.tar.gz             the `quotalease` command (bin/)
#   SHA256SUMS
# Every native artifact is a release build linked by zig against glibc 2.17
# (the manylinux2014 baseline), through one set of `maturin zig cc` wrappers
# for the wheel (maturin build) and for liblease and the addon (one cargo
# build): one environment, so one compiled dependency tree; then stripped.
# Tools (maturin, ziglang, auditwheel, twine) go into $TARGET/dist-tools, a
# venv of their own. Needs cargo, python3 >= 3.11, node/npm, strip, tar.
# The build machine's paths (home, cargo registry, the checkout, the target
# directory) are remapped to /build/... in every compiled artifact
# (--remap-path-prefix, -ffile-prefix-map); make test-dist checks with strings.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CARGO=${CARGO:-cargo}
TRIPLE=x86_64-unknown-linux-gnu
GLIBC=2.17
ZIG_TARGET=x86_64-linux-gnu.$GLIBC
# Pinned so that a release is reproducible from the tag.
TOOLS_REQ=("maturin==1.16.0" "ziglang==0.17.1" "auditwheel==6.8.2" "twine==7.0.0")

for tool in "$CARGO" python3 node npm strip tar sha256sum; do
  command -v "$tool" >/dev/null || { echo "error: make dist needs $tool" >&2; exit 1; }
done
meta=$($CARGO metadata --format-version 1 --no-deps)
target_dir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' <<<"$meta")
version=$(python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="quotalease-ffi"))' <<<"$meta")
bash scripts/check-versions.sh >/dev/null

tools=$target_dir/dist-tools
if ! "$tools/bin/python" -c 'import ziglang' 2>/dev/null || [ "$("$tools/bin/maturin" --version 2>/dev/null)" != "maturin 1.16.0" ]; then
  echo "dist: installing ${TOOLS_REQ[*]} into $tools" >&2
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check "${TOOLS_REQ[@]}"
fi
export PATH=$tools/bin:$PATH

# Panic locations and any other path rustc or the C compiler embeds name
# /build/... instead of the build machine's directories. The last matching prefix
# wins, so the most specific comes last (the target directory may sit inside
# the checkout, the checkout inside $HOME). Appended to CARGO_ENCODED_RUSTFLAGS
# when the caller set that (cargo then ignores RUSTFLAGS), else to RUSTFLAGS.
remaps=("$HOME=/build/home" "${RUSTUP_HOME:-$HOME/.rustup}=/build/rustup"
  "${CARGO_HOME:-$HOME/.cargo}=/build/cargo" "$ROOT=/build/quotalease" "$target_dir=/build/target")
if [ -n "${CARGO_ENCODED_RUSTFLAGS+set}" ]; then # set, even empty: cargo reads it, not RUSTFLAGS
  sep=$'\x1f'
  for r in "${remaps[@]}"; do
    CARGO_ENCODED_RUSTFLAGS+="${CARGO_ENCODED_RUSTFLAGS:+$sep}--remap-path-prefix=$r"
  done
  export CARGO_ENCODED_RUSTFLAGS
else
  for r in "${remaps[@]}"; do
    case $r in *[[:space:]]*)
      echo "error: '$r' has whitespace, which RUSTFLAGS cannot carry; export CARGO_ENCODED_RUSTFLAGS (your flags separated by 0x1f) and dist.sh appends the remaps there" >&2
      exit 1 ;;
    esac
    RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }--remap-path-prefix=$r"
  done
  export RUSTFLAGS
fi
cflags_remap=""
for r in "${remaps[@]}"; do cflags_remap+=" '-ffile-prefix-map=$r'"; done

dist=$ROOT/dist
stage=$target_dir/dist-stage
rm -rf "$dist" "$stage"
mkdir -p "$dist" "$stage"
t0=$(date +%s)

# One set of zig wrappers (maturin's own `maturin zig cc`, linking against
# glibc 2.17's symbols) for the wheel, liblease and the addon: with the same
# environment the three builds share one compiled dependency tree.
wrap=$stage/zig
mkdir -p "$wrap"
for w in cc c++; do
  cat >"$wrap/zig$w" <<SH
#!/bin/sh
exec "$tools/bin/maturin" zig $w -- -g -fno-sanitize=all$cflags_remap -target $ZIG_TARGET "\$@"
SH
  chmod +x "$wrap/zig$w"
done
printf '#!/bin/sh\nexec "%s" zig ar -- "$@"\n' "$tools/bin/maturin" >"$wrap/zigar"
chmod +x "$wrap/zigar"
triple_env=${TRIPLE//-/_}
export "CC_$triple_env=$wrap/zigcc" "CXX_$triple_env=$wrap/zigc++" "AR_$triple_env=$wrap/zigar" \
  "CARGO_TARGET_${triple_env^^}_LINKER=$wrap/zigcc" \
  CARGO_ZIGBUILD_ZIG_COMMAND="$tools/bin/python" CARGO_ZIGBUILD_ZIG_COMMAND_ARGS="-m ziglang"

# 1. Python: the abi3 wheel (maturin strips it and checks the manylinux_2_17
#    policy itself), then auditwheel's independent verdict, and the sdist.
echo "dist: Python wheel (maturin through zig cc -target $ZIG_TARGET, manylinux2014 = manylinux_2_17)" >&2
maturin build --quiet --release --strip --compatibility manylinux2014 --target "$TRIPLE" \
  -m bindings/python/Cargo.toml -i python3 --out "$stage/py" >&2
wheel=$(ls "$stage"/py/quotalease-"$version"-cp311-abi3-*manylinux_2_17_x86_64*.whl)
auditwheel show "$wheel" >"$stage/auditwheel.txt"
grep -q '"manylinux_2_17_x86_64"' "$stage/auditwheel.txt" || {
  cat "$stage/auditwheel.txt" >&2
  echo "error: auditwheel does not find the wheel consistent with manylinux_2_17_x86_64" >&2
  exit 1
}
# One platform tag in the file name (pip and PyPI accept the compressed
# double tag too; the single modern one is what auditwheel names).
cp "$wheel" "$dist/quotalease-$version-cp311-abi3-manylinux_2_17_x86_64.whl"
maturin sdist -m bindings/python/Cargo.toml --out "$dist" >&2

# 2. liblease, the Node addon and the `quotalease` command: one release build
#    for the same target with the same wrappers as the wheel (so the same glibc
#    baseline).
echo "dist: liblease, the Node addon, the CLI (cargo build --release --target $TRIPLE, zig cc -target $ZIG_TARGET)" >&2
$CARGO build --quiet --release --target "$TRIPLE" -p quotalease-ffi -p quotalease-node -p quotalease-cli
built=$target_dir/$TRIPLE/release
libs=$stage/libs
mkdir -p "$libs"
strip --strip-unneeded -o "$libs/liblease.so" "$built/liblease.so"
strip --strip-debug -o "$libs/liblease.a" "$built/liblease.a"
node_file=quotalease.linux-x64-gnu.node
strip --strip-unneeded -o "$libs/$node_file" "$built/libquotalease_node.so"
strip -o "$libs/quotalease" "$built/quotalease"

# 2b. The wheel carries the `quotalease` command too: pip installs the wheel's
#     .data/scripts into the environment's bin/ (sdist and dev installs have no
#     command: they build the extension only). Then twine checks both.
python3 scripts/wheel-add-command.py "$dist/quotalease-$version-cp311-abi3-manylinux_2_17_x86_64.whl" "$libs/quotalease"
twine check --strict "$dist"/quotalease-"$version"*.whl "$dist/quotalease-$version.tar.gz" >&2
max_glibc() { objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1; }
for f in "$libs/liblease.so" "$libs/$node_file" "$libs/quotalease"; do
  need=$(max_glibc "$f")
  if [ "$(printf '%s\n%s\n' "$need" "$GLIBC" | sort -V | tail -n 1)" != "$GLIBC" ]; then
    echo "error: $f needs glibc $need, above the $GLIBC baseline" >&2
    exit 1
  fi
done

# 3. The C/Go archive: scripts/install-c.sh lays it out (versioned .so with its
#    SONAME links, .a, header, lease.pc with a prefix relative to itself).
name=liblease-$version-x86_64-linux-gnu
tree=$stage/archive/$name
LEASE_LIB_DIR=$libs LEASE_PC_PREFIX='${pcfiledir}/../..' PREFIX=/ DESTDIR="$tree" \
  bash scripts/install-c.sh >&2
cp LICENSE "$tree/LICENSE"
sed "s|@VERSION@|$version|g" ffi/archive-README.md >"$tree/README.md"
epoch=$(git log -1 --format=%ct 2>/dev/null || date +%s)
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -C "$stage/archive" -cf - "$name" |
  gzip -9n >"$dist/$name.tar.gz"

# 3b. Go: the sources of bindings/go (the core module, and grpcrl and otelrl
#     beside it, whose go.mod already point at ../), no tests: what the module
#     proxy would serve, for a go.mod `replace` where it cannot be reached
#     (bindings/go/README.md, "Install"). Platform-independent; cgo finds
#     liblease through the archive's lease.pc.
go_name=quotalease-go-$version
go_tree=$stage/go/$go_name
mkdir -p "$go_tree"
(cd bindings/go && find . -type f \( \( -name '*.go' ! -name '*_test.go' \) -o -name '*.c' -o -name '*.h' \
  -o -name go.mod -o -name go.sum -o -name README.md \) -print0) |
  while IFS= read -r -d '' f; do install -D -m 644 "bindings/go/$f" "$go_tree/$f"; done
for f in go.mod cgo.go cshim.h; do
  [ -f "$go_tree/$f" ] || { echo "error: no $f in $go_tree" >&2; exit 1; }
done
cp LICENSE "$go_tree/LICENSE"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -C "$stage/go" -cf - "$go_name" |
  gzip -9n >"$dist/$go_name.tar.gz"

# 3c. The `quotalease` command (cli/: simulate, inspect, top, bench, policy),
#     one executable (its Rust dependencies linked in, glibc >= 2.17 as for
#     liblease): bin/quotalease, LICENSE, README.md (cli/archive-README.md).
cli_name=quotalease-cli-$version-x86_64-linux-gnu
cli_tree=$stage/cli/$cli_name
mkdir -p "$cli_tree/bin"
install -m 755 "$libs/quotalease" "$cli_tree/bin/quotalease"
cp LICENSE "$cli_tree/LICENSE"
sed "s|@VERSION@|$version|g" cli/archive-README.md >"$cli_tree/README.md"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -C "$stage/cli" -cf - "$cli_name" |
  gzip -9n >"$dist/$cli_name.tar.gz"

# 4. npm: the platform package (the stripped addon), then the main package with
#    optionalDependencies on every platform package of package.json's napi
#    targets (what `napi pre-publish` adds), packed from its own `npm pack`.
echo "dist: npm packages" >&2
plat=$stage/npm/linux-x64-gnu
mkdir -p "$plat"
cp bindings/node/npm/linux-x64-gnu/package.json bindings/node/npm/linux-x64-gnu/README.md "$plat/"
cp "$libs/$node_file" "$plat/$node_file"
# The CLI, run by the main package's bin/quotalease.js (node_modules/.bin, npx).
install -m 755 "$libs/quotalease" "$plat/quotalease"
cp LICENSE "$plat/LICENSE"
(cd "$plat" && npm pack --ignore-scripts --loglevel=error --pack-destination "$dist" >/dev/null)
(cd bindings/node && npm pack --loglevel=error --pack-destination "$stage/npm" >/dev/null)
main=$stage/npm/main
mkdir -p "$main"
tar -xzf "$stage/npm/quotalease-$version.tgz" -C "$main" --strip-components=1
cp LICENSE "$main/LICENSE"
node - "$main/package.json" "$ROOT/bindings/node/npm" <<'JS'
const fs = require('node:fs')
const path = require('node:path')
const [file, npmDir] = process.argv.slice(2)
const pkg = JSON.parse(fs.readFileSync(file, 'utf8'))
const optional = {}
for (const dir of fs.readdirSync(npmDir).sort()) {
  const p = JSON.parse(fs.readFileSync(path.join(npmDir, dir, 'package.json'), 'utf8'))
  if (p.version !== pkg.version) throw new Error(`${p.name} is ${p.version}, quotalease is ${pkg.version}`)
  optional[p.name] = p.version
}
if (Object.keys(optional).length !== pkg.napi.targets.length) {
  throw new Error(`bindings/node/npm has ${Object.keys(optional).length} platform packages, napi.targets ${pkg.napi.targets.length}`)
}
pkg.optionalDependencies = optional
delete pkg.devDependencies
fs.writeFileSync(file, JSON.stringify(pkg, null, 2) + '\n')
JS
(cd "$main" && npm pack --ignore-scripts --loglevel=error --pack-destination "$dist" >/dev/null)
for f in "quotalease-$version.tgz" "quotalease-linux-x64-gnu-$version.tgz"; do
  [ -s "$dist/$f" ] || { echo "error: npm pack did not write dist/$f" >&2; exit 1; }
done

(cd "$dist" && sha256sum -- * >SHA256SUMS)
echo "dist: built in $(($(date +%s) - t0)) s:" >&2
(cd "$dist" && ls -l --time-style=+ -- *) >&2
echo "dist: shipped binaries (stripped): $(stat -c '%n %s' "$libs/liblease.so" "$libs/$node_file" "$libs/quotalease" | sed "s|$libs/||g" | paste -sd ' ')" >&2
