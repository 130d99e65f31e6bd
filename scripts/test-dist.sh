#!/usr/bin/env bash
# `make test-dist`: install what `make dist` put in dist/ the way a user
# would. First the one install that needs a Rust toolchain: the Python sdist,
# built from source by pip in a fresh venv (where no wheel fits). Then with no
# Rust toolchain: cargo, rustc and rustup are taken off PATH
# (checked: `command -v cargo` must fail), CARGO_TARGET_DIR points at a
# directory that does not exist, and the artifacts are copied out of the
# repository first. Then the sdist must fail at once with its backend's
# message (no toolchain download), and, each against a real redis-server
# (tests/harness/redisctl):
#   Python  a fresh venv installs the wheel (pip --no-index) and takes a lease;
#   Node    a fresh npm project installs the two packed tarballs offline;
#   C       a program built with pkg-config against the extracted archive
#           (moved after extraction: lease.pc is relocatable), and statically;
#   Go      the Go sources from their own tarball, by a go.mod `replace`,
#           build against the archive (no module proxy, no checkout);
#   CLI     the `quotalease` command from its tarball: --version, policy set
#           and list against Redis (--redis, and QUOTALEASE_REDIS_URL).
# And no shipped binary (the wheel's .so, the addon, liblease.so and .a, the CLI)
# carries a path of the machine that built it (`strings`: no /root/, /home/,
# no path of this checkout).
# Each smoke test: limit 3 per minute on one key, 3 allowed, the 4th denied,
# and the bucket is in Redis. Ends with "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
dist=$ROOT/dist
[ -f "$dist/SHA256SUMS" ] || { echo "error: no dist/SHA256SUMS: run make dist first" >&2; exit 1; }
bash scripts/ensure-redis.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/quotalease-dist.XXXXXX")
export QUOTALEASE_HARNESS_STATE=$work/harness
redisctl=$ROOT/tests/harness/redisctl
cleanup() {
  "$redisctl" stop-all >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# The artifacts, checked against their sums, outside the repository.
cp -r "$dist" "$work/dist"
(cd "$work/dist" && sha256sum --quiet -c SHA256SUMS)
version=$(python3 scripts/versions.py check | sed -n 's/^versions: [0-9]* places agree on //p')
[ -n "$version" ] || { echo "error: the versions disagree (scripts/check-versions.sh)" >&2; exit 1; }
for f in "quotalease-$version-cp311-abi3-manylinux_2_17_x86_64.whl" "quotalease-$version.tar.gz" \
  "quotalease-$version.tgz" "quotalease-linux-x64-gnu-$version.tgz" "liblease-$version-x86_64-linux-gnu.tar.gz" \
  "quotalease-go-$version.tar.gz" "quotalease-cli-$version-x86_64-linux-gnu.tar.gz"; do
  [ -s "$work/dist/$f" ] || { echo "error: dist/$f is missing" >&2; exit 1; }
done

port=$("$redisctl" start)
url="redis://127.0.0.1:$port"
in_redis() { # $1 = key: the bucket {prefix}:{key} exists in this Redis
  [ -n "$(redis-cli -p "$port" --raw GET "ql:{$1}")" ]
}
loads_archive_lib() { # $1 = program: it loads liblease.so from the extracted archive
  local so
  so=$(ldd "$1" | awk '/liblease\.so/ {print $3}')
  if [ -z "$so" ] || [ "$(realpath "$so")" != "$(realpath "$lease/lib/liblease.so.$version")" ]; then
    ldd "$1"
    echo "$1 does not load liblease from the archive"
    return 1
  fi
}

passed=0
failed=0
step() { # $1 = label, rest = command
  local label=$1 rc
  shift
  echo "== $label"
  # In a subshell with errexit, not as an `if` condition (where bash ignores
  # errexit in the whole function): any failing command fails the step, and
  # a step's cd and exports stay in it.
  set +e
  (
    set -e
    "$@"
  ) >"$work/step.log" 2>&1
  rc=$?
  set -e
  if [ "$rc" = 0 ]; then
    sed 's/^/   /' "$work/step.log"
    passed=$((passed + 1))
  else
    sed 's/^/   /' "$work/step.log"
    echo "   FAILED: $label"
    failed=$((failed + 1))
  fi
}

# The Python smoke test: 3 per minute, the 4th denied, from the venv given.
cat >"$work/smoke.py" <<'PY'
import pathlib
import sys

import quotalease
from quotalease import Limiter

url, version, venv, key = sys.argv[1:5]
assert quotalease.__version__ == version, (quotalease.__version__, version)
native = pathlib.Path(quotalease._native.__file__).resolve()
assert native.is_relative_to(pathlib.Path(venv).resolve()), native
with Limiter(url, rate="3/min") as lim:
    seen = [lim.acquire(key).allowed for _ in range(4)]
assert seen == [True, True, True, False], seen
print(f"quotalease {quotalease.__version__} from {native.name}: {seen}")
PY
# The wheel and the sdist carry the license (the wheel under
# dist-info/licenses, as PEP 639 has it).
wheel_license() {
  "$work/venv/bin/python" - "$work/venv" <<'PY'
import pathlib, sys
found = list(pathlib.Path(sys.argv[1]).glob("lib/python3*/site-packages/quotalease-*.dist-info/licenses/LICENSE"))
assert found and "Apache License" in found[0].read_text(), found
print(f"license in the installed wheel: {found[0].name}")
PY
  # (not grep -q: it stops reading, and tar's SIGPIPE fails the pipeline)
  tar -tzf "$work/dist/quotalease-$version.tar.gz" | grep -x "quotalease-$version/LICENSE"
}

# Where no wheel fits, pip builds the sdist: with cargo on PATH (before it is
# hidden below), in a fresh venv, pip's isolated build fetching maturin as the
# sdist's pyproject asks. The repository's target directory (CARGO_TARGET_DIR
# when set) holds the release build of the same dependency tree (make test),
# so only the workspace's own crates compile again.
sdist_target=${CARGO_TARGET_DIR:-$ROOT/target}
sdist_build() {
  python3 -m venv "$work/venv-sdist"
  CARGO_TARGET_DIR=$sdist_target "$work/venv-sdist/bin/python" -m pip install -q --disable-pip-version-check \
    --no-binary quotalease "$work/dist/quotalease-$version.tar.gz"
  (cd "$work" && "$work/venv-sdist/bin/python" smoke.py "$url" "$version" "$work/venv-sdist" smoke-sdist)
  in_redis smoke-sdist
}

step "Python: the sdist builds from source (pip --no-binary, cargo), lease from Redis" sdist_build

# A PATH with no Rust toolchain: every PATH entry that holds cargo, rustc or
# rustup is replaced by a directory of links to its other programs.
hidden=$work/path
mkdir -p "$hidden"
newpath=""
i=0
IFS=: read -r -a entries <<<"$PATH"
for d in "${entries[@]}"; do
  [ -d "$d" ] || continue
  if [ -e "$d/cargo" ] || [ -e "$d/rustc" ] || [ -e "$d/rustup" ]; then
    i=$((i + 1))
    mkdir -p "$hidden/$i"
    for p in "$d"/*; do
      case ${p##*/} in cargo | cargo-* | rustc | rustup | rustdoc | rust-* | rustfmt | clippy-driver) continue ;; esac
      ln -s "$p" "$hidden/$i/"
    done
    d=$hidden/$i
  fi
  newpath=${newpath:+$newpath:}$d
done
export PATH=$newpath
unset CARGO CARGO_HOME RUSTUP_HOME RUSTC RUSTFLAGS
export CARGO_TARGET_DIR=$work/no-such-target-dir
if command -v cargo >/dev/null 2>&1 || command -v rustc >/dev/null 2>&1; then
  echo "error: cargo or rustc still on PATH ($(command -v cargo rustc | paste -sd ' '))" >&2
  exit 1
fi
echo "test-dist: cargo and rustc are not on PATH; CARGO_TARGET_DIR=$CARGO_TARGET_DIR (absent)"

# --- Python ------------------------------------------------------------------
# The sdist with no cargo: its build backend (bindings/python/build-backend)
# stops at pip's first hook with a message saying what to do, instead of
# maturin's fetching a Rust toolchain. pip's isolated build still installs
# maturin, as the sdist's pyproject asks (from the package index).
sdist_no_cargo() {
  local out=$work/sdist-no-cargo.log
  python3 -m venv "$work/venv-nocargo"
  if "$work/venv-nocargo/bin/python" -m pip install --disable-pip-version-check \
    --no-binary quotalease "$work/dist/quotalease-$version.tar.gz" >"$out" 2>&1; then
    cat "$out"
    echo "pip installed the sdist with no cargo on PATH"
    return 1
  fi
  grep -F "building from source needs Rust's cargo on PATH, and there is none" "$out"
  grep -F "does not download a Rust toolchain" "$out"
  # It stopped at the first hook, before metadata, a download or a compile.
  grep -F "Getting requirements to build wheel did not run successfully" "$out"
  if grep -E "puccinialin|Rust not found|Preparing metadata.*done|Compiling" "$out"; then
    cat "$out"
    return 1
  fi
  if "$work/venv-nocargo/bin/python" -c 'import quotalease' 2>/dev/null; then
    echo "quotalease is installed in the venv"
    return 1
  fi
}
step "Python: the sdist with no cargo fails at once, saying so (no toolchain download)" sdist_no_cargo

python_smoke() {
  local out
  python3 -m venv "$work/venv"
  "$work/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index \
    "$work/dist/quotalease-$version-cp311-abi3-manylinux_2_17_x86_64.whl"
  (cd "$work" && "$work/venv/bin/python" smoke.py "$url" "$version" "$work/venv" smoke-py)
  in_redis smoke-py
  wheel_license
  # The wheel's command, on the venv's PATH, without cargo.
  out=$(PATH="$work/venv/bin:/usr/bin:/bin" quotalease --version)
  echo "venv/bin/quotalease --version: $out"
  [[ $out == *"$version"* ]]
  PATH="$work/venv/bin:/usr/bin:/bin" quotalease policy list --redis "$url" >/dev/null
}
step "Python: pip install --no-index the wheel into a fresh venv, lease from Redis" python_smoke

# --- Node --------------------------------------------------------------------
node_smoke() {
  local out
  mkdir "$work/app"
  cd "$work/app"
  npm init -y >/dev/null
  # Offline: the file: tarballs are all it needs; the other platforms'
  # optional packages are skipped (wrong os/cpu, or not fetchable).
  npm install --offline --no-audit --no-fund --foreground-scripts --cache "$work/npm-cache" \
    "$work/dist/quotalease-linux-x64-gnu-$version.tgz" "$work/dist/quotalease-$version.tgz" >"$work/npm.log" 2>&1 || {
    cat "$work/npm.log"
    return 1
  }
  grep -q 'using the prebuilt addon for linux-x64-gnu' "$work/npm.log" || {
    cat "$work/npm.log"
    echo "the install script did not take the prebuilt addon"
    return 1
  }
  if ls node_modules/quotalease/*.node >/dev/null 2>&1; then
    echo "node_modules/quotalease has its own .node: it was built, not taken from the platform package"
    return 1
  fi
  cat >smoke.js <<'JS'
const assert = require('node:assert/strict')
const path = require('node:path')
const { Limiter } = require('quotalease')
const [url, version] = process.argv.slice(2)
;(async () => {
  assert.equal(require('quotalease/package.json').version, version)
  const addon = require.resolve('quotalease-linux-x64-gnu')
  assert.ok(addon.startsWith(path.resolve('node_modules')), addon)
  const l = new Limiter({ url, rate: '3/min' })
  const seen = []
  for (let i = 0; i < 4; i++) seen.push((await l.acquire('smoke-node')).allowed)
  assert.deepEqual(seen, [true, true, true, false])
  await l.close()
  console.log(`quotalease ${version} from ${path.relative(process.cwd(), addon)}: ${JSON.stringify(seen)}`)
})().catch((e) => { console.error(e); process.exit(1) })
JS
  node smoke.js "$url" "$version"
  in_redis smoke-node
  # The quotalease command on node_modules/.bin: the main package's bin shim
  # running the platform package's executable.
  [ -x node_modules/quotalease-linux-x64-gnu/quotalease ]
  out=$(./node_modules/.bin/quotalease --version)
  echo "node_modules/.bin/quotalease --version: $out"
  [ "$out" = "quotalease $version" ]
  ./node_modules/.bin/quotalease policy list --redis "$url" | grep -F "store ql:policy:{~} on"
}
step "Node: npm install the packed main + linux-x64-gnu tarballs (offline), lease from Redis, the CLI on .bin" node_smoke

# --- C -----------------------------------------------------------------------
name=liblease-$version-x86_64-linux-gnu
mkdir -p "$work/extract"
tar -xzf "$work/dist/$name.tar.gz" -C "$work/extract"
# Moved after extraction: nothing may point at where it was unpacked.
mv "$work/extract/$name" "$work/$name"
lease=$work/$name
export PKG_CONFIG_PATH=$lease/lib/pkgconfig
cat >"$work/smoke.c" <<'C'
#include <lease.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  if (strcmp(lease_version(), LEASE_VERSION_STRING) != 0) {
    fprintf(stderr, "library %s, header %s\n", lease_version(), LEASE_VERSION_STRING);
    return 1;
  }
  lease_config cfg;
  lease_config_init(&cfg);
  cfg.url = argv[1];
  cfg.limit = 3;
  cfg.window_ms = 60000;
  lease_limiter *lim;
  if (lease_limiter_new(&cfg, &lim) != LEASE_OK) {
    fprintf(stderr, "lease_limiter_new: %s\n", lease_last_error());
    return 1;
  }
  const char *key = "smoke-c";
  int seen[4];
  for (int i = 0; i < 4; i++) {
    lease_decision d;
    if (lease_acquire(lim, (const uint8_t *)key, strlen(key), 1, &d) != LEASE_OK) {
      fprintf(stderr, "lease_acquire: %s\n", lease_last_error());
      return 1;
    }
    seen[i] = d.allowed;
  }
  lease_close(lim);
  lease_limiter_free(lim);
  printf("liblease %s: [%d, %d, %d, %d]\n", lease_version(), seen[0], seen[1], seen[2], seen[3]);
  return (seen[0] && seen[1] && seen[2] && !seen[3]) ? 0 : 1;
}
C
c_layout() {
  local v soname
  [ "$(pkg-config --modversion lease)" = "$version" ]
  v=$version
  soname=$(readelf -d "$lease/lib/liblease.so.$v" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [ "$(readlink "$lease/lib/$soname")" = "liblease.so.$v" ]
  [ "$(readlink "$lease/lib/liblease.so")" = "$soname" ]
  for f in lib/liblease.a include/lease.h LICENSE README.md; do
    [ -f "$lease/$f" ] || { echo "the archive has no $f"; return 1; }
  done
  if readelf -S "$lease/lib/liblease.so.$v" | grep -q '\.debug_info'; then
    echo "liblease.so.$v is not stripped"
    return 1
  fi
  echo "pkg-config lease $(pkg-config --modversion lease); SONAME $soname -> liblease.so.$v; stripped"
}
step "C: archive layout (SONAME links, lease.pc version, LICENSE, stripped)" c_layout

cli_name=quotalease-cli-$version-x86_64-linux-gnu
# No build machine's path in what ships: dist.sh remaps them (--remap-path-prefix).
no_build_paths() {
  local bin=$work/binaries f hits bad=0
  mkdir -p "$bin/wheel" "$bin/npm"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$work/dist/quotalease-$version-cp311-abi3-manylinux_2_17_x86_64.whl" "$bin/wheel"
  tar -xzf "$work/dist/quotalease-linux-x64-gnu-$version.tgz" -C "$bin/npm"
  tar -xzf "$work/dist/$cli_name.tar.gz" -C "$bin"
  local files=("$bin"/wheel/quotalease/*.so "$bin"/npm/package/*.node "$lease/lib/liblease.so.$version" "$lease/lib/liblease.a"
    "$bin/$cli_name/bin/quotalease")
  for f in "${files[@]}"; do
    [ -f "$f" ] || { echo "missing: $f"; return 1; }
    # /root/ and /home/ (a home directory), and this checkout's absolute path.
    hits=$({
      strings -a "$f" | grep -E '/root/|/home/'
      strings -a "$f" | grep -F -- "$ROOT"
    } | sort -u | head -n 5 || true)
    if [ -n "$hits" ]; then
      echo "${f#"$bin"/}: build paths, e.g.:"
      sed 's/^/     /' <<<"$hits"
      bad=1
    else
      echo "${f##*/}: no build path ($(strings -a "$f" | grep -c '^/build/' || true) remapped /build/... strings)"
    fi
  done
  [ "$bad" = 0 ]
}
step "no build path in the shipped binaries (strings: no /root/, /home/, $ROOT)" no_build_paths
c_shared() {
  cd "$work"
  cc -std=c11 -Wall -Wextra -Werror smoke.c $(pkg-config --cflags --libs lease) -o smoke-c
  loads_archive_lib smoke-c
  ./smoke-c "$url"
  in_redis smoke-c
}
step "C: cc smoke.c \$(pkg-config --cflags --libs lease), lease from Redis" c_shared
c_static() {
  cd "$work"
  redis-cli -p "$port" DEL "ql:{smoke-c}" >/dev/null
  cc -std=c11 -Wall -Wextra -Werror smoke.c -I"$lease/include" "$lease/lib/liblease.a" -lpthread -ldl -lm -o smoke-c-static
  if ldd smoke-c-static | grep -q liblease; then
    echo "smoke-c-static links liblease.so"
    return 1
  fi
  ./smoke-c-static "$url"
  in_redis smoke-c
}
step "C: static link against liblease.a, lease from Redis" c_static

# --- Go ----------------------------------------------------------------------
# The recipe of bindings/go/README.md ("Install"): the Go sources from their
# tarball, unpacked next to the app's go.mod, a go.mod `replace` to them, and
# PKG_CONFIG_PATH at the archive's lease.pc (above). No module proxy
# (GOPROXY=off), an empty module cache and build cache, no repository files.
go_smoke() {
  export GOTOOLCHAIN=local CGO_ENABLED=1 GOFLAGS='' GOPROXY=off
  export GOCACHE=$work/gocache GOPATH=$work/gopath
  local mod=github.com/quotalease/quotalease/bindings/go dir
  mkdir "$work/go-app"
  cd "$work/go-app"
  tar -xzf "$work/dist/quotalease-go-$version.tar.gz"
  if find "quotalease-go-$version" -name '*_test.go' | grep .; then
    echo "the Go tarball ships tests"
    return 1
  fi
  [ -f "quotalease-go-$version/LICENSE" ]
  go mod init example.com/smoke >/dev/null 2>&1
  go mod edit -replace="$mod=./quotalease-go-$version"
  cat >main.go <<'GO'
package main

import (
	"fmt"
	"os"

	quotalease "github.com/quotalease/quotalease/bindings/go"
)

func main() {
	cfg := quotalease.DefaultConfig()
	cfg.URL = os.Args[1]
	cfg.Limit = 3
	cfg.WindowMs = 60_000
	lim, err := quotalease.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	seen := make([]bool, 0, 4)
	for i := 0; i < 4; i++ {
		d, err := lim.Acquire("smoke-go")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		seen = append(seen, d.Allowed)
	}
	lim.Close()
	fmt.Printf("Go over liblease: %v\n", seen)
	if !(seen[0] && seen[1] && seen[2] && !seen[3]) {
		os.Exit(1)
	}
}
GO
  go mod tidy
  # The package compiled is the tarball's, not a checkout's.
  dir=$(go list -f '{{.Dir}}' "$mod")
  if [ "$(realpath "$dir")" != "$(realpath "quotalease-go-$version")" ]; then
    echo "$mod resolves to $dir, not the unpacked tarball"
    return 1
  fi
  go build -o smoke-go .
  loads_archive_lib smoke-go
  ./smoke-go "$url"
  in_redis smoke-go
  echo "$mod from quotalease-go-$version.tar.gz (go.mod: $(grep '^replace' go.mod))"
}
if command -v go >/dev/null; then
  step "Go: quotalease-go tarball + go.mod replace, liblease by pkg-config, lease from Redis" go_smoke
else
  echo "== Go: FAILED: go is not installed"
  failed=$((failed + 1))
fi

# --- CLI ---------------------------------------------------------------------
# The `quotalease` command from its tarball (moved after extraction), on PATH.
cli_smoke() {
  local out
  mkdir -p "$work/cli-extract"
  tar -xzf "$work/dist/$cli_name.tar.gz" -C "$work/cli-extract"
  mv "$work/cli-extract/$cli_name" "$work/$cli_name"
  export PATH=$work/$cli_name/bin:$PATH
  [ "$(command -v quotalease)" = "$work/$cli_name/bin/quotalease" ]
  [ -f "$work/$cli_name/LICENSE" ]
  [ -f "$work/$cli_name/README.md" ]
  out=$(quotalease --version)
  echo "$out"
  [ "$out" = "quotalease $version" ]
  # Only the system's libraries (no liblease, nothing from the build machine).
  if ldd "$work/$cli_name/bin/quotalease" | grep -v -E 'lib(c|m|gcc_s|pthread|dl|rt)\.so|ld-linux|linux-vdso'; then
    echo "quotalease needs a library beyond glibc's"
    return 1
  fi
  quotalease policy set --tier smoke "3/min" --redis "$url"
  # The URL after the subcommand, then from the environment.
  out=$(quotalease policy list --redis "$url")
  echo "$out"
  grep -Fx "  smoke = 3/min" <<<"$out"
  out=$(QUOTALEASE_REDIS_URL=$url quotalease policy list)
  grep -Fx "  smoke = 3/min" <<<"$out"
  [ -n "$(redis-cli -p "$port" --raw HGET "ql:policy:{~}:tiers" smoke)" ]
}
step "CLI: quotalease from its tarball: --version, policy set/list against Redis" cli_smoke

echo "test-dist: $passed passed, $failed failed"
[ "$failed" = 0 ]
