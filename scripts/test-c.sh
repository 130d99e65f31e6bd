#!/usr/bin/env bash
# C tests (`make test-c`): the header is fresh, `make install` produces a tree
# that C programs build against with pkg-config, and every C test (API, bad
# input, hostile input from a seeded generator, pthreads hammer, inspect, real
# Redis with events, concurrency limits on memory and Redis, the conformance vectors on
# memory and Redis) passes twice: plain, and under AddressSanitizer +
# LeakSanitizer + UBSan. Ends with "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

bash scripts/ensure-redis.sh
for tool in cc pkg-config python3; do
  if ! command -v "$tool" >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "installing $tool..." >&2
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        "$( [ "$tool" = cc ] && echo gcc || echo "$tool" )" >/dev/null
    else
      echo "error: $tool is missing; install it (Debian: apt-get install gcc pkg-config python3)" >&2
      exit 1
    fi
  fi
done

scripts/check-header.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/quotalease-c.XXXXXX")
# Our own harness state, so stop-all only stops this suite's servers.
export QUOTALEASE_HARNESS_STATE="$work/harness"
redisctl="$root/tests/harness/redisctl"
cleanup() {
  "$redisctl" stop-all >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

prefix="$work/prefix"
make -s install PREFIX="$prefix"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
version=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="quotalease-ffi"))')
[ "$(pkg-config --modversion lease)" = "$version" ] || { echo "error: lease.pc version != Cargo.toml $version" >&2; exit 1; }

src=ffi/tests/c
passed=0
failed=0
tally() { # $1 = output file of one test program
  local line
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -n 1 || true)
  local p=0 f=0
  if [[ "$line" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    p=${BASH_REMATCH[1]}
    f=${BASH_REMATCH[2]}
  fi
  passed=$((passed + p))
  failed=$((failed + f))
  # No summary, or a non-zero exit that no failed case explains (a sanitizer
  # report at exit, a crash): one more failure.
  if [ -z "$line" ] || { [ "$f" = 0 ] && grep -q '^(exit [0-9]*)$' "$1"; }; then
    echo "   FAILED: the program exited without a clean summary (crash or failure above)"
    failed=$((failed + 1))
  fi
}
run() { # $1 = label, rest = command
  local label=$1 out="$work/out.$RANDOM"
  shift
  echo "== $label"
  if "$@" >"$out" 2>&1; then :; else echo "(exit $?)" >>"$out"; fi
  sed 's/^/   /' "$out"
  tally "$out"
}

# The C guide's quick start (include/README.md), built exactly as it says (pkg-config), and a static link.
awk '/^```c$/{p=1;next} p&&/^```$/{exit} p' include/README.md > "$work/app.c"
if [ -s "$work/app.c" ]; then
  echo "== README quick start: cc app.c \$(pkg-config --cflags --libs lease)"
  (cd "$work" && cc app.c $(pkg-config --cflags --libs lease) -o app && ./app) && passed=$((passed + 1)) || {
    echo "FAILED: README quick start"; failed=$((failed + 1)); }
  echo "== README quick start, linked statically against liblease.a"
  (cd "$work" && cc app.c -I"$prefix/include" "$prefix/lib/liblease.a" -lpthread -ldl -lm -o app-static && ./app-static >/dev/null) \
    && passed=$((passed + 1)) || { echo "FAILED: static link"; failed=$((failed + 1)); }
else
  echo "FAILED: no \`\`\`c block in include/README.md"; failed=$((failed + 1))
fi
# Every other complete program of the guide (a ```c block with a main), built and run the same way.
awk -v dir="$work" '/^```c$/{n++; p=1; f=dir "/guide" n ".c"; next} p&&/^```$/{p=0; next} p{print > f}' include/README.md
for block in "$work"/guide*.c; do
  [ -e "$block" ] || continue
  [ "$(basename "$block")" = guide1.c ] && continue   # the quick start, above
  grep -q '^int main(' "$block" || continue
  echo "== README example $(basename "$block" .c): cc \$(pkg-config --cflags --libs lease)"
  (cd "$work" && cc -Wall -Wextra -Werror "$block" $(pkg-config --cflags --libs lease) -o "${block%.c}" && "${block%.c}") \
    && passed=$((passed + 1)) || { echo "FAILED: README example $(basename "$block")"; failed=$((failed + 1)); }
done

port=$("$redisctl" start)          # vectors and hammer
events_port=$("$redisctl" start)   # killed and restarted by test_redis
url="redis://127.0.0.1:$port"

cflags=(-std=c11 -Wall -Wextra -Werror -g -O1 -I"$src" "-DEXPECT_VERSION=\"$version\"")
for variant in plain asan; do
  out="$work/$variant"
  mkdir -p "$out"
  extra=()
  if [ "$variant" = asan ]; then
    extra=(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  fi
  for t in test_api test_hammer test_inspect test_concurrency test_redis test_fuzz; do
    cc "${cflags[@]}" "${extra[@]}" "$src/$t.c" -o "$out/$t" $(pkg-config --cflags --libs lease) -lpthread
  done
  cc "${cflags[@]}" "${extra[@]}" "$src/test_vectors.c" "$src/json.c" -o "$out/test_vectors" \
    $(pkg-config --cflags --libs lease)
  export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  run "[$variant] API and bad input" "$out/test_api"
  run "[$variant] hostile input (10000 seeded random calls)" "$out/test_fuzz"
  run "[$variant] pthreads hammer (memory + Redis)" env QL_REDIS_URL="$url" "$out/test_hammer"
  run "[$variant] inspect (memory + Redis)" env QL_REDIS_URL="$url" "$out/test_inspect"
  run "[$variant] concurrency limits (memory + Redis)" env QL_REDIS_URL="$url" "$out/test_concurrency"
  run "[$variant] vectors on memory" "$out/test_vectors" tests/vectors memory
  run "[$variant] vectors on Redis" "$out/test_vectors" tests/vectors redis "$url"
  run "[$variant] Redis integration and events" env QL_REDIS_PORT="$events_port" QL_REDISCTL="$redisctl" "$out/test_redis"
done

echo "C: $passed passed, $failed failed"
[ "$failed" = 0 ]
